// Logging implementation: one mutex-guarded fputs per line, so lines never interleave.
#include "src/base/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

namespace zinf::log {
namespace {
std::atomic<int> g_level{-1};
std::mutex g_mutex;
std::string g_line_prefix;

int level_from_env() {
    const char* env = std::getenv("ZINF_LOG_LEVEL");
    if (env == nullptr) return static_cast<int>(Level::kInfo);
    if (std::strcmp(env, "debug") == 0) return static_cast<int>(Level::kDebug);
    if (std::strcmp(env, "warning") == 0) return static_cast<int>(Level::kWarning);
    if (std::strcmp(env, "error") == 0) return static_cast<int>(Level::kError);
    if (std::strcmp(env, "off") == 0) return static_cast<int>(Level::kOff);
    return static_cast<int>(Level::kInfo);
}
}  // namespace

Level level() noexcept {
    int value = g_level.load(std::memory_order_relaxed);
    if (value < 0) {
        value = level_from_env();
        g_level.store(value, std::memory_order_relaxed);
    }
    return static_cast<Level>(value);
}

void set_level(Level new_level) noexcept {
    g_level.store(static_cast<int>(new_level), std::memory_order_relaxed);
}

void set_line_prefix(std::string prefix) {
    std::lock_guard lock(g_mutex);
    g_line_prefix = std::move(prefix);
}

void write(Level line_level, std::string_view message) {
    static constexpr const char* kPrefix[] = {"[zinf debug] ", "[zinf] ", "[zinf warning] ",
                                              "[zinf error] ", ""};
    std::string line = kPrefix[static_cast<int>(line_level)];
    std::lock_guard lock(g_mutex);
    line.append(g_line_prefix);
    line.append(message);
    line.push_back('\n');
    std::fputs(line.c_str(), stderr);
}

bool warn_once(std::string_view key, std::string_view message) {
    static std::set<std::string, std::less<>> seen;
    {
        std::lock_guard lock(g_mutex);
        if (seen.find(key) != seen.end()) return false;
        seen.emplace(key);
    }
    warning(message);
    return true;
}

}  // namespace zinf::log
