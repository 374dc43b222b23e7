// Test support: seeds and temporary directories.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "io/file_system.h"
#include "tests/support/test_seed.h"

namespace zinf::test {

std::uint64_t seed() {
    static const std::uint64_t value = [] {
        if (const char* env = std::getenv("ZINF_TEST_SEED"))
            return static_cast<std::uint64_t>(std::strtoull(env, nullptr, 10));
        return static_cast<std::uint64_t>(
            std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007ULL);
    }();
    return value;
}

namespace {

// The root for temporary directories: ZINF_TEST_TMPDIR when swap and checkpoint directories may
// live there (io::check_trusted_directory: a checkout owned by another user would make every
// swap test fail for the wrong reason), else /tmp, saying so once.
std::filesystem::path temp_root() {
    static const std::filesystem::path root = [] {
        const char* base = std::getenv("ZINF_TEST_TMPDIR");
        if (base == nullptr) return std::filesystem::path("/tmp");
        std::filesystem::create_directories(base);
        auto dir = io::posix_file_system().open_directory(base, true);
        const Status trusted =
            dir.has_value() ? io::check_trusted_directory(*dir, "ZINF_TEST_TMPDIR") : dir.error();
        if (trusted.is_ok()) return std::filesystem::path(base);
        std::fprintf(stderr,
                     "[zinf test] ZINF_TEST_TMPDIR unusable for swap files (%s); using /tmp\n",
                     trusted.to_string().c_str());
        return std::filesystem::path("/tmp");
    }();
    return root;
}

}  // namespace

TempDir::TempDir(const std::string& tag) {
    const std::filesystem::path root = temp_root();
    std::string templ = (root / ("zinf-" + tag + "-XXXXXX")).string();
    if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed: " + templ);
    path_ = templ;
}

TempDir::~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
}

bool is_root() {
    return ::geteuid() == 0;
}

std::string read_text(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

}  // namespace zinf::test
