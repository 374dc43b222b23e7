// Test support: seeds and temporary directories.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <stdexcept>

#include "tests/support/test_seed.h"

namespace zinf::test {

std::uint64_t seed() {
    static const std::uint64_t value = [] {
        if (const char* env = std::getenv("ZINF_TEST_SEED")) return static_cast<std::uint64_t>(std::strtoull(env, nullptr, 10));
        return static_cast<std::uint64_t>(
            std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007ULL);
    }();
    return value;
}

TempDir::TempDir(const std::string& tag) {
    const char* base = std::getenv("ZINF_TEST_TMPDIR");
    std::filesystem::path root = base != nullptr ? base : "/tmp";
    std::filesystem::create_directories(root);
    std::string templ = (root / ("zinf-" + tag + "-XXXXXX")).string();
    if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed: " + templ);
    path_ = templ;
}

TempDir::~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
}

bool is_root() { return ::geteuid() == 0; }

}  // namespace zinf::test
