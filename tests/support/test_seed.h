// The seed of randomised tests: ZINF_TEST_SEED if set, else one fixed per process from the clock.
#pragma once

#include <cstdint>
#include <string>

namespace zinf::test {

std::uint64_t seed();

// A fresh directory under ZINF_TEST_TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
public:
    explicit TempDir(const std::string& tag = "t");
    ~TempDir();
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::string& path() const { return path_; }
    std::string file(const std::string& name) const { return path_ + "/" + name; }

private:
    std::string path_;
};

// True when running as root (tests that mount a tmpfs need it).
bool is_root();

// The whole content of a file ("" when it cannot be read).
std::string read_text(const std::string& path);

}  // namespace zinf::test
