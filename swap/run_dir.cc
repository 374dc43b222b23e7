// RunDir: trusted, flock'ed base paths, stale-directory cleanup and per-run directories, and the
// process-wide registry of live run directories that a process ending on a signal removes.
#include "swap/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <utility>

#include "src/base/assert.h"
#include "src/base/log.h"

namespace zinf::swap {
namespace {

// Reads the pid a lock holder wrote; 0 when unreadable (the holder may not have written it yet).
long read_holder_pid(int fd) {
    char text[32] = {};
    const ssize_t n = ::pread(fd, text, sizeof(text) - 1, 0);
    if (n <= 0) return 0;
    return std::strtol(text, nullptr, 10);
}

Result<FileDescriptor> lock_base_path(io::FileSystem& fs, const io::Directory& base) {
    const std::string lock_path = base.path_of(kLockFileName);
    // No O_TRUNC: nothing is written before the checks below. O_NOFOLLOW (added by open_at):
    // a planted symbolic link is refused, its target untouched.
    ZINF_ASSIGN_OR_RETURN(FileDescriptor fd,
                          fs.open_at(base, kLockFileName, O_RDWR | O_CREAT, 0600));
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return Status::from_errno(errno, str_cat("stat ", lock_path));
    // In a sticky shared directory another user may have made the lock file first, or hard-linked
    // one of our files under its name: writing our pid into it would clobber that file.
    if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || st.st_nlink != 1) {
        return Status::invalid_argument(
            str_cat("swap: lock file ", lock_path, " is not a regular file of the running user (",
                    io::describe_owner_and_mode(st.st_uid, st.st_mode), ", ", st.st_nlink,
                    S_ISREG(st.st_mode) ? " link(s))" : " link(s), not a regular file)",
                    "; refusing to write to it. Remove it if it is yours, or use another "
                    "nvme_path"));
    }
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        if (err != EWOULDBLOCK) return Status::from_errno(err, str_cat("swap: flock ", lock_path));
        const long pid = read_holder_pid(fd.get());
        return Status(
            StatusCode::kBusy,
            str_cat("swap directory ", base.path(), " is in use by another zinfinity run (pid ",
                    pid > 0 ? std::to_string(pid) : std::string("unknown"), ", lock file ",
                    lock_path, "); give each run (and each rank) its own nvme_path"),
            err);
    }
    // We hold the lock: record our pid for the next one who asks.
    const std::string pid_text = str_cat(::getpid(), "\n");
    if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), pid_text.data(), pid_text.size(), 0) !=
                                             static_cast<ssize_t>(pid_text.size())) {
        return Status::from_errno(errno, str_cat("swap: writing pid to lock file ", lock_path));
    }
    return fd;
}

// Removes every run directory of ours under `base`: we hold its lock, so none has a live owner.
Status remove_stale_run_dirs(io::FileSystem& fs, const io::Directory& base) {
    ZINF_ASSIGN_OR_RETURN(const std::vector<std::string> names, io::list_directory(base));
    for (const std::string& name : names) {
        if (name.rfind(kRunDirPrefix, 0) != 0) continue;
        struct stat st {};
        if (::fstatat(base.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
            log::warning("swap: leaving ", base.path_of(name),
                         " alone: named like a run "
                         "directory but not a directory of the running user");
            continue;
        }
        const long pid = std::strtol(name.c_str() + kRunDirPrefix.size(), nullptr, 10);
        Status removed = io::remove_tree_at(fs, base, name);
        if (!removed.is_ok()) {
            return removed.with_context(
                str_cat("swap: removing stale run directory ", base.path_of(name)));
        }
        log::info("swap: removed stale run directory ", base.path_of(name), " left by pid ", pid,
                  ", which no longer holds the lock on ", base.path(),
                  "; its files are never reused");
    }
    return Status::ok();
}

// One run directory of a live RunDir: what removing it needs, wherever the RunDir is moved.
struct LiveRunDir {
    std::uint64_t owner_id = 0;  // RunDir::registration_id_
    io::FileSystem* fs = nullptr;
    io::Directory base;  // the open base directory that holds it
    std::string run_name;
};

// Every live run directory of this process (swap/run_dir.h).
struct Registry {
    std::mutex mutex;  // held while a run directory is made, registered, removed or unregistered
    std::vector<LiveRunDir> live;
    bool closed = false;  // set by remove_live_run_dirs_before_exit: no new run directory
};

Registry& registry() {
    // Never destroyed (hence `new`): a termination signal may arrive while exit() runs static
    // destructors, and the thread that handles it must still find the registry and its mutex.
    static Registry* const r = new Registry();
    return *r;
}

std::uint64_t next_registration_id() {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
}

// Makes the run directory `run_name` under `base` (mode 0700 whatever the umask) and registers
// it for `owner_id`, under the registry's lock: a process ending on a signal either finds it
// registered or has already closed the registry (kBusy, nothing made). The entry takes `base`.
Status make_and_register_run_dir(io::FileSystem& fs, io::Directory base,
                                 const std::string& run_name, std::uint64_t owner_id) {
    ZINF_ASSERT(owner_id != 0);
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    if (r.closed) {
        return Status(StatusCode::kBusy,
                      str_cat("swap: not making a run directory in ", base.path(),
                              ": this process is ending on a termination signal"));
    }
    ZINF_TRY(fs.make_directory_at(base, run_name, 0700));
    // Registered at once: from here on an error leaves it to the owner's destructor to remove.
    r.live.push_back(LiveRunDir{owner_id, &fs, std::move(base), run_name});
    const io::Directory& parent = r.live.back().base;
    // The umask may have narrowed the mode; the directory is ours and 0700 exactly.
    ZINF_ASSIGN_OR_RETURN(io::Directory run, fs.open_directory_at(parent, run_name));
    if (::fchmod(run.fd(), 0700) != 0) {
        return Status::from_errno(errno, str_cat("swap: chmod 0700 ", run.path()));
    }
    return Status::ok();
}

// Removes one registered run directory with its files; logs a failure. Called with the registry
// locked. A bounded retry: on the exit path the engine's threads still run, and one may have
// created a file in the directory between its listing and its rmdir (ENOTEMPTY).
bool remove_run_dir(LiveRunDir& d) noexcept {
    constexpr int kAttemptsMax = 3;
    Status removed;
    for (int attempt = 1; attempt <= kAttemptsMax; ++attempt) {
        removed = io::remove_tree_at(*d.fs, d.base, d.run_name);
        if (removed.is_ok() || removed.errno_value() != ENOTEMPTY) break;
    }
    if (!removed.is_ok()) {
        log::warning("swap: could not remove run directory ", d.base.path_of(d.run_name), ": ",
                     removed.to_string());
    }
    return removed.is_ok();
}

// Removes and unregisters the run directories of `owner_id`.
void remove_registered_run_dirs(std::uint64_t owner_id) noexcept {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    for (LiveRunDir& d : r.live) {
        if (d.owner_id == owner_id) (void)remove_run_dir(d);
    }
    std::erase_if(r.live, [owner_id](const LiveRunDir& d) { return d.owner_id == owner_id; });
}

// Opens every base path (checked trusted), refusing one given twice; `resolved` gets each one's
// path without symbolic links.
Result<std::vector<io::Directory>> open_base_paths(io::FileSystem& fs,
                                                   std::span<const std::string> base_paths,
                                                   std::vector<std::string>& resolved) {
    std::vector<io::Directory> bases;
    for (const std::string& base : base_paths) {
        // The base path itself may be a symbolic link of a trusted owner (the check looks at
        // every link and directory on the way); everything inside is opened without links.
        ZINF_ASSIGN_OR_RETURN(io::Directory opened,
                              io::open_trusted_directory(fs, base, "swap: nvme_path",
                                                         /*create=*/false));
        ZINF_ASSIGN_OR_RETURN(std::string real, io::resolved_path(opened));
        for (std::size_t i = 0; i < resolved.size(); ++i) {
            if (resolved[i] == real) {
                return Status::invalid_argument(
                    str_cat("swap: directory ", base, " is given twice (as ", base_paths[i], ")"));
            }
        }
        resolved.push_back(std::move(real));
        bases.push_back(std::move(opened));
    }
    return bases;
}

}  // namespace

Result<RunDir> RunDir::create(io::FileSystem& fs, std::span<const std::string> base_paths) {
    if (base_paths.empty())
        return Status::invalid_argument("swap: no swap directory (nvme_path) given");
    std::vector<std::string> resolved;
    ZINF_ASSIGN_OR_RETURN(std::vector<io::Directory> bases,
                          open_base_paths(fs, base_paths, resolved));
    RunDir dir;
    dir.registration_id_ = next_registration_id();
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    dir.run_name_ = str_cat(kRunDirPrefix, ::getpid(), "-",
                            static_cast<long long>(now.tv_sec) * 1'000'000'000LL + now.tv_nsec);
    for (std::size_t i = 0; i < base_paths.size(); ++i) {
        // On any error below, `dir` goes out of scope and removes what it created so far.
        ZINF_ASSIGN_OR_RETURN(FileDescriptor lock, lock_base_path(fs, bases[i]));
        dir.base_paths_.push_back(base_paths[i]);
        dir.locks_.push_back(std::move(lock));
        ZINF_TRY(remove_stale_run_dirs(fs, bases[i]));
        dir.run_paths_.push_back(str_cat(resolved[i], "/", dir.run_name_));
        ZINF_TRY(make_and_register_run_dir(fs, std::move(bases[i]), dir.run_name_,
                                           dir.registration_id_));
    }
    log::debug("swap: run directory ", dir.run_name_, " in ", base_paths.size(), " path(s)");
    return dir;
}

RunDir::~RunDir() {
    remove_all();
}

RunDir::RunDir(RunDir&& other) noexcept {
    *this = std::move(other);
}

RunDir& RunDir::operator=(RunDir&& other) noexcept {
    if (this != &other) {
        remove_all();
        // The registry's entries follow the id, so nothing there changes.
        registration_id_ = std::exchange(other.registration_id_, 0);
        run_name_ = std::move(other.run_name_);
        base_paths_ = std::move(other.base_paths_);
        run_paths_ = std::move(other.run_paths_);
        locks_ = std::move(other.locks_);
        other.base_paths_.clear();
        other.run_paths_.clear();
        other.locks_.clear();
    }
    return *this;
}

std::vector<std::string> RunDir::file_paths(std::string_view name) const {
    std::vector<std::string> out;
    out.reserve(run_paths_.size());
    for (const auto& p : run_paths_) out.push_back(str_cat(p, "/", name));
    return out;
}

void RunDir::remove_all() noexcept {
    // Only the directories that were made are registered (none after the exit path ran).
    if (registration_id_ != 0) remove_registered_run_dirs(std::exchange(registration_id_, 0));
    run_paths_.clear();
    // Releasing the locks last: a new run must not see our directory as stale while we remove it.
    locks_.clear();
    base_paths_.clear();
}

std::size_t remove_live_run_dirs_before_exit() noexcept {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.closed = true;
    std::size_t removed_count = 0;
    for (LiveRunDir& d : r.live) removed_count += remove_run_dir(d) ? 1 : 0;
    // Unregistered either way: the owners' destructors, if they still run, find nothing to do.
    r.live.clear();
    return removed_count;
}

}  // namespace zinf::swap
