// FileDescriptor (an owning, move-only fd) and small file-system queries used before any I/O.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "src/base/status.h"

namespace zinf {

class FileDescriptor {
public:
    FileDescriptor() noexcept = default;
    explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
    ~FileDescriptor() { reset(); }
    FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
    FileDescriptor& operator=(FileDescriptor&& other) noexcept {
        if (this != &other) {
            reset();
            fd_ = std::exchange(other.fd_, -1);
        }
        return *this;
    }
    FileDescriptor(const FileDescriptor&) = delete;
    FileDescriptor& operator=(const FileDescriptor&) = delete;

    int get() const noexcept { return fd_; }
    bool valid() const noexcept { return fd_ >= 0; }
    int release() noexcept { return std::exchange(fd_, -1); }
    void reset() noexcept;

private:
    int fd_ = -1;
};

// Bytes available to an unprivileged writer on the file system holding `path`.
Result<std::uint64_t> free_space_bytes(const std::string& path);

// Checks that `path` is an existing, writable directory; the error names the path and the reason
// (missing, not a directory, read-only, permission).
Status check_writable_directory(const std::string& path);

}  // namespace zinf
