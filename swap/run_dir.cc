// RunDir: flock'ed base paths, stale-directory cleanup and per-run directories.
#include "swap/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <system_error>

#include "src/base/log.h"

namespace zinf::swap {
namespace {

namespace fs = std::filesystem;

// Reads the pid a lock holder wrote; 0 when unreadable (the holder may not have written it yet).
long read_holder_pid(int fd) {
    char text[32] = {};
    const ssize_t n = ::pread(fd, text, sizeof(text) - 1, 0);
    if (n <= 0) return 0;
    return std::strtol(text, nullptr, 10);
}

Result<FileDescriptor> lock_base_path(const std::string& base) {
    const std::string lock_path = str_cat(base, "/", kLockFileName);
    FileDescriptor fd(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!fd.valid())
        return Status::from_errno(errno, str_cat("swap: opening lock file ", lock_path));
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        if (err != EWOULDBLOCK) return Status::from_errno(err, str_cat("swap: flock ", lock_path));
        const long pid = read_holder_pid(fd.get());
        return Status(
            StatusCode::kBusy,
            str_cat("swap directory ", base, " is in use by another zinfinity run (pid ",
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

// Removes every run directory under `base`: we hold its lock, so none has a live owner.
Status remove_stale_run_dirs(const std::string& base) {
    std::error_code ec;
    fs::directory_iterator it(base, ec);
    if (ec) return Status::from_errno(ec.value(), str_cat("swap: listing ", base));
    for (; it != fs::directory_iterator(); it.increment(ec)) {
        if (ec) return Status::from_errno(ec.value(), str_cat("swap: listing ", base));
        const std::string name = it->path().filename().string();
        if (name.rfind(kRunDirPrefix, 0) != 0) continue;
        const long pid = std::strtol(name.c_str() + kRunDirPrefix.size(), nullptr, 10);
        std::error_code rm_ec;
        const auto removed = fs::remove_all(it->path(), rm_ec);
        if (rm_ec) {
            return Status::from_errno(
                rm_ec.value(), str_cat("swap: removing stale run directory ", it->path().string()));
        }
        log::info("swap: removed stale run directory ", it->path().string(), " (", removed,
                  " entries) left by pid ", pid, ", which no longer holds the lock on ", base,
                  "; its files are never reused");
    }
    return Status::ok();
}

}  // namespace

Result<RunDir> RunDir::create(std::span<const std::string> base_paths) {
    if (base_paths.empty())
        return Status::invalid_argument("swap: no swap directory (nvme_path) given");
    RunDir dir;
    std::vector<fs::path> canonical;
    for (const std::string& base : base_paths) {
        ZINF_TRY(check_writable_directory(base));
        std::error_code ec;
        fs::path c = fs::canonical(base, ec);
        if (ec) return Status::from_errno(ec.value(), str_cat("swap: resolving ", base));
        for (const auto& other : canonical) {
            if (other == c) {
                return Status::invalid_argument(
                    str_cat("swap: directory ", base, " is given twice (as ", other.string(), ")"));
            }
        }
        canonical.push_back(c);
    }

    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    const std::string run_name =
        str_cat(kRunDirPrefix, ::getpid(), "-",
                static_cast<long long>(now.tv_sec) * 1'000'000'000LL + now.tv_nsec);
    for (const std::string& base : base_paths) {
        // On any error below, `dir` goes out of scope and removes what it created so far.
        ZINF_ASSIGN_OR_RETURN(FileDescriptor lock, lock_base_path(base));
        dir.base_paths_.push_back(base);
        dir.locks_.push_back(std::move(lock));
        ZINF_TRY(remove_stale_run_dirs(base));
        std::string run_path = str_cat(base, "/", run_name);
        if (::mkdir(run_path.c_str(), 0700) != 0) {
            return Status::from_errno(errno, str_cat("swap: creating run directory ", run_path));
        }
        dir.run_paths_.push_back(std::move(run_path));
    }
    log::debug("swap: run directory ", run_name, " in ", base_paths.size(), " path(s)");
    return dir;
}

RunDir::~RunDir() {
    remove_all();
}

RunDir& RunDir::operator=(RunDir&& other) noexcept {
    if (this != &other) {
        remove_all();
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
    for (const auto& p : run_paths_) {
        std::error_code ec;
        fs::remove_all(p, ec);
        if (ec) log::warning("swap: could not remove run directory ", p, ": ", ec.message());
    }
    run_paths_.clear();
    // Releasing the locks last: a new run must not see our directory as stale while we remove it.
    locks_.clear();
    base_paths_.clear();
}

}  // namespace zinf::swap
