// RunDir: the per-run directories that hold one run's swap files. For each base path (an
// `nvme_path`) it checks that no other user can replace what it holds
// (io::check_trusted_directory), holds an exclusive lock for the run's lifetime and creates a fresh
// directory (mode 0700) named after the process id and start time; it removes that directory with
// its contents when destroyed. Directories left by a run that died (kill -9, power loss) are
// removed at start, never reused: swap files belong to one run and are never trusted by another.
// Every file and directory is opened relative to an open directory, never through a symbolic link.
// A process-wide registry knows every live run directory, so that a process ended by a signal
// can remove them without its destructors running (remove_live_run_dirs_before_exit).
#pragma once

#include <cstddef>
#include <cstdint>
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
    // is missing or not writable; kBusy after remove_live_run_dirs_before_exit (the process is
    // ending: a directory made now would outlive it).
    static Result<RunDir> create(io::FileSystem& fs, std::span<const std::string> base_paths);

    RunDir() = default;
    // Removes the run directories with their contents, then releases the locks. The caller
    // closes its files first (io::Engine::close), although Linux would allow either order.
    ~RunDir();
    RunDir(RunDir&& other) noexcept;
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

    // This RunDir's key in the registry of live run directories, which holds what removing them
    // needs (the file system, each open base directory, the run name), wherever the RunDir is
    // moved; 0 when it has none (default-constructed or moved from).
    std::uint64_t registration_id_ = 0;
    std::string run_name_;
    std::vector<std::string> base_paths_;
    std::vector<std::string> run_paths_;
    std::vector<FileDescriptor> locks_;  // one per base path, flock'ed LOCK_EX
};

// Removes the run directory, with its files, of every RunDir alive in this process, for a process
// about to end without running destructors (a termination signal: tools/cli/termination.h); the
// locks stay held until the process ends. From then on RunDir::create fails with kBusy: a
// directory made afterwards would outlive the process. Thread-safe with RunDirs being created
// and destroyed on other threads: one lock orders them, so a directory being made or removed is
// finished first. Blocks while it removes; locks, allocates and logs, so it must never be called
// from a signal handler. A directory that cannot be removed is logged (warning), not returned:
// the caller is exiting. Returns how many run directories it removed.
std::size_t remove_live_run_dirs_before_exit() noexcept;

}  // namespace zinf::swap
