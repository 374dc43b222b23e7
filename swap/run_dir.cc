// RunDir: trusted, flock'ed base paths, stale-directory cleanup and per-run directories.
#include "swap/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <ctime>

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

}  // namespace

Result<RunDir> RunDir::create(io::FileSystem& fs, std::span<const std::string> base_paths) {
    if (base_paths.empty())
        return Status::invalid_argument("swap: no swap directory (nvme_path) given");
    RunDir dir;
    dir.fs_ = &fs;
    std::vector<std::string> resolved;
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
        dir.bases_.push_back(std::move(opened));
    }

    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    dir.run_name_ = str_cat(kRunDirPrefix, ::getpid(), "-",
                            static_cast<long long>(now.tv_sec) * 1'000'000'000LL + now.tv_nsec);
    for (std::size_t i = 0; i < base_paths.size(); ++i) {
        const io::Directory& base = dir.bases_[i];
        // On any error below, `dir` goes out of scope and removes what it created so far.
        ZINF_ASSIGN_OR_RETURN(FileDescriptor lock, lock_base_path(fs, base));
        dir.base_paths_.push_back(base_paths[i]);
        dir.locks_.push_back(std::move(lock));
        ZINF_TRY(remove_stale_run_dirs(fs, base));
        ZINF_TRY(fs.make_directory_at(base, dir.run_name_, 0700));
        dir.run_paths_.push_back(str_cat(resolved[i], "/", dir.run_name_));
        // The umask may have narrowed the mode; the directory is ours and 0700 exactly.
        ZINF_ASSIGN_OR_RETURN(io::Directory run, fs.open_directory_at(base, dir.run_name_));
        if (::fchmod(run.fd(), 0700) != 0) {
            return Status::from_errno(errno, str_cat("swap: chmod 0700 ", run.path()));
        }
    }
    log::debug("swap: run directory ", dir.run_name_, " in ", base_paths.size(), " path(s)");
    return dir;
}

RunDir::~RunDir() {
    remove_all();
}

RunDir& RunDir::operator=(RunDir&& other) noexcept {
    if (this != &other) {
        remove_all();
        fs_ = other.fs_;
        run_name_ = std::move(other.run_name_);
        base_paths_ = std::move(other.base_paths_);
        run_paths_ = std::move(other.run_paths_);
        bases_ = std::move(other.bases_);
        locks_ = std::move(other.locks_);
        other.base_paths_.clear();
        other.run_paths_.clear();
        other.bases_.clear();
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
    // run_paths_[i] exists only for the first run_paths_.size() bases.
    for (std::size_t i = 0; i < run_paths_.size(); ++i) {
        const Status s = io::remove_tree_at(*fs_, bases_[i], run_name_);
        if (!s.is_ok())
            log::warning("swap: could not remove run directory ", run_paths_[i], ": ",
                         s.to_string());
    }
    run_paths_.clear();
    // Releasing the locks last: a new run must not see our directory as stale while we remove it.
    locks_.clear();
    bases_.clear();
    base_paths_.clear();
}

}  // namespace zinf::swap
