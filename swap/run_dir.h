// RunDir: the per-run directories that hold one run's swap files. For each base path (an
// `nvme_path`) it checks that no other user can replace what it holds
// (io::check_trusted_directory), holds an exclusive lock for the run's lifetime and creates a fresh
// directory (mode 0700) named after the process id and start time; it removes that directory with
// its contents when destroyed. Directories left by a run that died (kill -9, power loss) are
// removed at start, never reused: swap files belong to one run and are never trusted by another.
// Every file and directory is opened relative to an open directory, never through a symbolic link.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/file_system.h"
#include "src/base/file.h"
#include "src/base/status.h"

namespace zinf::swap {

// The lock file in each base path. It is never removed (removing a lock file races with a run
// that has just opened it); its content is the holder's pid, for the error message of the next.
inline constexpr std::string_view kLockFileName = "zinfinity-swap.lock";
// Run directories are "<kRunDirPrefix><pid>-<start time in ns since the epoch>".
inline constexpr std::string_view kRunDirPrefix = "zinf-run-";

class RunDir {
public:
    // Opens every base path and checks that it is trusted (owned by this user or root, not
    // writable by others without the sticky bit, nor any directory above it), locks it (flock,
    // non-blocking) through a lock file that must be a regular file of this user, removes stale
    // run directories of this user found under it (logging one line each; entries of that name
    // that are not this user's directories are left alone with a warning), and creates this
    // run's directory (mode 0700) in each. `fs` is borrowed for the RunDir's life. Blocks on
    // nothing; allocates (init only).
    // Errors: kBusy when another process (or another RunDir in this process) holds a base path,
    // naming the directory and the holder's pid; kInvalidArgument for an untrusted directory or
    // lock file (naming it, its owner and mode), a symbolic link where the lock file or run
    // directory should be, an empty list or a path given twice; kNotFound / kIo when a base path
    // is missing or not writable.
    static Result<RunDir> create(io::FileSystem& fs, std::span<const std::string> base_paths);

    RunDir() = default;
    // Removes the run directories with their contents, then releases the locks. The caller
    // closes its files first (io::Engine::close), although Linux would allow either order.
    ~RunDir();
    RunDir(RunDir&& other) noexcept = default;
    RunDir& operator=(RunDir&& other) noexcept;
    RunDir(const RunDir&) = delete;
    RunDir& operator=(const RunDir&) = delete;

    // The base paths as given, and this run's directory in each (same order), resolved: no
    // symbolic link on the way, so that opening a file by this path later reaches the directory
    // that was checked.
    const std::vector<std::string>& base_paths() const noexcept { return base_paths_; }
    const std::vector<std::string>& run_paths() const noexcept { return run_paths_; }
    // "<run path>/<name>" for every run path: the stripes of one logical file.
    std::vector<std::string> file_paths(std::string_view name) const;

private:
    void remove_all() noexcept;

    io::FileSystem* fs_ = nullptr;
    std::string run_name_;
    std::vector<std::string> base_paths_;
    std::vector<std::string> run_paths_;
    std::vector<io::Directory> bases_;   // open base directories, one per base path
    std::vector<FileDescriptor> locks_;  // one per base path, flock'ed LOCK_EX
};

}  // namespace zinf::swap
