// io::FileSystem: the calls that set files up (open, create, preallocate, sync, rename, remove,
// and the directories around them), behind one interface so that FaultyFileSystem can fail any
// of them, as FaultyBackend fails reads and writes. Every name is resolved relative to an open
// io::Directory and never through a symbolic link at its last component (O_NOFOLLOW), so a path
// that was checked once cannot be redirected afterwards by whoever can write the directory.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/file.h"
#include "src/base/status.h"

namespace zinf::io {

// An open directory (O_DIRECTORY | O_CLOEXEC) and the path it was opened by, for messages.
// Move-only; closes on destruction.
class Directory {
public:
    Directory() = default;
    Directory(FileDescriptor fd, std::string path) noexcept
        : fd_(std::move(fd)), path_(std::move(path)) {}
    Directory(Directory&&) noexcept = default;
    Directory& operator=(Directory&&) noexcept = default;

    int fd() const noexcept { return fd_.get(); }
    bool valid() const noexcept { return fd_.valid(); }
    const std::string& path() const noexcept { return path_; }
    // "<path>/<name>": what messages call the entry `name` of this directory.
    std::string path_of(std::string_view name) const;

private:
    FileDescriptor fd_;
    std::string path_;
};

// The file operations FaultyFileSystem can fail, one bit each.
enum class FileOp : std::uint8_t {
    kOpen = 1 << 0,  // open_directory, open_at (including create)
    kMakeDirectory = 1 << 1,
    kPreallocate = 1 << 2,  // fallocate
    kSync = 1 << 3,         // fsync / fdatasync
    kRename = 1 << 4,
    kRemove = 1 << 5,
    kWrite = 1 << 6,  // write_all
    kRead = 1 << 7,   // read_exact
};
inline constexpr std::uint32_t kAllFileOps = 0xff;
std::string_view file_op_name(FileOp op) noexcept;

// Thread-safe: every call is one or a few syscalls with no shared state (the faulty wrapper
// counts with atomics). Errors: Status::from_errno naming the path and the operation; a symbolic
// link where a file or directory was expected is kInvalidArgument naming it.
class FileSystem {
public:
    virtual ~FileSystem() = default;

    // Opens the directory at `path` (absolute or relative to the working directory). With
    // `follow_last` false, a symbolic link as the last component is refused.
    virtual Result<Directory> open_directory(const std::string& path, bool follow_last) = 0;
    // Opens the subdirectory `name` of `parent`; never follows a symbolic link.
    virtual Result<Directory> open_directory_at(const Directory& parent, std::string_view name) = 0;
    // open(2) of `name` in `dir` with O_NOFOLLOW | O_CLOEXEC added to `flags`.
    virtual Result<FileDescriptor> open_at(const Directory& dir, std::string_view name, int flags,
                                           unsigned mode) = 0;
    virtual Status make_directory_at(const Directory& parent, std::string_view name,
                                     unsigned mode) = 0;
    // Reserves [0, length_bytes) of the open file (posix_fallocate); `what` names it in errors.
    virtual Status preallocate(int fd, std::uint64_t length_bytes, std::string_view what) = 0;
    // fsync (data_only: fdatasync) of an open file or directory.
    virtual Status sync(int fd, bool data_only, std::string_view what) = 0;
    // rename(2) within one directory; replaces `to` (never following it) if it exists.
    virtual Status rename_at(const Directory& dir, std::string_view from, std::string_view to) = 0;
    // Removes the file (or, with `directory`, the empty directory) `name` of `dir`.
    virtual Status remove_at(const Directory& dir, std::string_view name, bool directory) = 0;
    // Writes all of `bytes` at the file position (retrying EINTR and short writes).
    virtual Status write_all(int fd, std::span<const std::byte> bytes, std::string_view what) = 0;
    // Reads exactly `bytes.size()` bytes at the file position; kCorruption naming `what` when the
    // file ends first.
    virtual Status read_exact(int fd, std::span<std::byte> bytes, std::string_view what) = 0;
};

// The operating system's file system. One instance per process, never destroyed.
FileSystem& posix_file_system() noexcept;

// Removes the entry `name` of `parent` and, when it is a directory, everything below it, walking
// with directory descriptors and never following a symbolic link (a link is removed, not its
// target). Bounded by the tree's size. Only its unlinks go through `fs` (FileOp::kRemove).
// Errors: the first failing removal, naming its path.
Status remove_tree_at(FileSystem& fs, const Directory& parent, std::string_view name);

// Checks that a directory may hold this user's files without another user being able to replace
// them: it is owned by the running user or by root, and not writable by group or others unless
// its sticky bit is set (as /tmp). The same holds for every directory above it (resolved, so
// that a symbolic link cannot route around the check), and no symbolic link on the way is owned
// by another user. `key` names the config key or flag in the error, which also names the
// directory, its owner and its mode.
Status check_trusted_directory(const Directory& dir, std::string_view key);

// The one sequence every directory the project writes into goes through: with `create`, makes
// `path` and its missing parents (as DeepSpeed does for its folders); checks that it is a
// writable directory; opens it through `fs` (a symbolic link as its last component is followed:
// a trusted owner may point a base path elsewhere) and checks it is trusted
// (check_trusted_directory). Errors are prefixed with `key` (the config key or flag that named
// the path): kNotFound, kInvalidArgument (not a directory, untrusted), kIo.
Result<Directory> open_trusted_directory(FileSystem& fs, const std::string& path,
                                         std::string_view key, bool create);

// The absolute path of an open directory with every symbolic link resolved (from /proc).
Result<std::string> resolved_path(const Directory& dir);

// "owner alice (uid 1000), mode 0777": for messages about a file's or directory's ownership.
std::string describe_owner_and_mode(unsigned uid, unsigned mode);

// The names in an open directory, without "." and "..". Errors name the directory.
Result<std::vector<std::string>> list_directory(const Directory& dir);

// What FaultyFileSystem injects: fail the n-th (1-based) call among the operations in `ops`,
// or each such call with a probability; with errno_to_inject. Failures are injected before the
// real call, so an injected failure leaves the file system as it was. Each is a Status marked
// injected (Status::is_injected), its message naming the operation, the path and the call's number.
struct FileFaultPlan {
    std::uint64_t seed = 1;
    std::uint32_t ops = kAllFileOps;  // FileOp bits
    std::uint64_t fail_nth_op = 0;    // 0: never
    double error_probability = 0;
    int errno_to_inject = EIO;
};

// A FileSystem wrapper following a FileFaultPlan. Borrows `inner`, which must outlive it.
class FaultyFileSystem final : public FileSystem {
public:
    FaultyFileSystem(FileSystem& inner, const FileFaultPlan& plan) : inner_(inner), plan_(plan) {}

    // Calls counted so far among the plan's ops, and failures injected.
    std::uint64_t ops_counted() const noexcept { return counted_.load(); }
    std::uint64_t faults_injected() const noexcept { return injected_.load(); }

    Result<Directory> open_directory(const std::string& path, bool follow_last) override;
    Result<Directory> open_directory_at(const Directory& parent, std::string_view name) override;
    Result<FileDescriptor> open_at(const Directory& dir, std::string_view name, int flags,
                                   unsigned mode) override;
    Status make_directory_at(const Directory& parent, std::string_view name,
                             unsigned mode) override;
    Status preallocate(int fd, std::uint64_t length_bytes, std::string_view what) override;
    Status sync(int fd, bool data_only, std::string_view what) override;
    Status rename_at(const Directory& dir, std::string_view from, std::string_view to) override;
    Status remove_at(const Directory& dir, std::string_view name, bool directory) override;
    Status write_all(int fd, std::span<const std::byte> bytes, std::string_view what) override;
    Status read_exact(int fd, std::span<std::byte> bytes, std::string_view what) override;

private:
    // The injected error for this call, or OK to let it through.
    Status maybe_fail(FileOp op, std::string_view what);

    FileSystem& inner_;
    FileFaultPlan plan_;
    std::atomic<std::uint64_t> counted_{0};
    std::atomic<std::uint64_t> injected_{0};
};

}  // namespace zinf::io
