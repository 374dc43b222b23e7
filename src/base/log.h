// Logging to stderr with levels, and str_cat for building messages off the hot path.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace zinf {

// Concatenates anything with an operator<< into a string.
template <typename... Args>
std::string str_cat(const Args&... args) {
    std::ostringstream os;
    (os << ... << args);
    return os.str();
}

namespace log {

enum class Level { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

// The threshold comes from ZINF_LOG_LEVEL (debug|info|warning|error|off) at first use; info
// default.
Level level() noexcept;
void set_level(Level level) noexcept;
// Text put after the level tag of every line ("rank 1: " on a rank of several); empty: none.
// Set once at start, before other threads log.
void set_line_prefix(std::string prefix);
// Thread-safe; one line per call.
void write(Level level, std::string_view message);
// Logs a warning once per distinct key for the life of the process; returns whether it logged.
bool warn_once(std::string_view key, std::string_view message);

template <typename... Args>
void debug(const Args&... args) {
    if (level() <= Level::kDebug) write(Level::kDebug, str_cat(args...));
}
template <typename... Args>
void info(const Args&... args) {
    if (level() <= Level::kInfo) write(Level::kInfo, str_cat(args...));
}
template <typename... Args>
void warning(const Args&... args) {
    if (level() <= Level::kWarning) write(Level::kWarning, str_cat(args...));
}
template <typename... Args>
void error(const Args&... args) {
    if (level() <= Level::kError) write(Level::kError, str_cat(args...));
}

}  // namespace log
}  // namespace zinf
