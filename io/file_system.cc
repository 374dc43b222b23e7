// The POSIX FileSystem, the faulty wrapper, and the directory trust check.
#include "io/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <random>
#include <vector>

#include "src/base/log.h"

namespace zinf::io {
namespace {

std::string owner_name(uid_t uid) {
    struct passwd pw {};
    struct passwd* found = nullptr;
    char buffer[1024];
    if (::getpwuid_r(uid, &pw, buffer, sizeof buffer, &found) == 0 && found != nullptr) {
        return str_cat(found->pw_name, " (uid ", uid, ")");
    }
    return str_cat("uid ", uid);
}

std::string mode_text(mode_t mode) {
    char text[8];
    std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
    return text;
}

// A symbolic link met where a file or directory was expected (O_NOFOLLOW gives ELOOP, and
// O_DIRECTORY | O_NOFOLLOW on a link gives ENOTDIR on some kernels).
Status link_refused(std::string_view path, int err) {
    return Status(StatusCode::kInvalidArgument,
                  str_cat(path,
                          ": is a symbolic link; refusing to follow it (a link here could "
                          "send this run's files anywhere)"),
                  err);
}

bool is_link_at(int dir_fd, std::string_view name) {
    struct stat st {};
    return ::fstatat(dir_fd, std::string(name).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
           S_ISLNK(st.st_mode);
}

class PosixFileSystem final : public FileSystem {
public:
    Result<Directory> open_directory(const std::string& path, bool follow_last) override {
        const int flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC | (follow_last ? 0 : O_NOFOLLOW);
        FileDescriptor fd(::open(path.c_str(), flags));
        if (!fd.valid()) {
            const int err = errno;
            struct stat st {};
            if (!follow_last && (err == ELOOP || err == ENOTDIR) &&
                ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
                return link_refused(path, err);
            }
            return Status::from_errno(err, str_cat("open directory ", path));
        }
        return Directory(std::move(fd), path);
    }

    Result<Directory> open_directory_at(const Directory& parent, std::string_view name) override {
        const std::string n(name);
        FileDescriptor fd(
            ::openat(parent.fd(), n.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
        if (!fd.valid()) {
            const int err = errno;
            if ((err == ELOOP || err == ENOTDIR) && is_link_at(parent.fd(), name)) {
                return link_refused(parent.path_of(name), err);
            }
            return Status::from_errno(err, str_cat("open directory ", parent.path_of(name)));
        }
        return Directory(std::move(fd), parent.path_of(name));
    }

    Result<FileDescriptor> open_at(const Directory& dir, std::string_view name, int flags,
                                   unsigned mode) override {
        const std::string n(name);
        FileDescriptor fd(::openat(dir.fd(), n.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode));
        if (!fd.valid()) {
            const int err = errno;
            if (err == ELOOP || (err == EEXIST && is_link_at(dir.fd(), name))) {
                return link_refused(dir.path_of(name), err);
            }
            return Status::from_errno(err, str_cat("open ", dir.path_of(name)));
        }
        return fd;
    }

    Status make_directory_at(const Directory& parent, std::string_view name,
                             unsigned mode) override {
        if (::mkdirat(parent.fd(), std::string(name).c_str(), mode) != 0) {
            return Status::from_errno(errno, str_cat("create directory ", parent.path_of(name)));
        }
        return Status::ok();
    }

    Status preallocate(int fd, std::uint64_t length_bytes, std::string_view what) override {
        const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(length_bytes));
        if (rc != 0) {
            return Status::from_errno(rc,
                                      str_cat("preallocate ", what, " (", length_bytes, " bytes)"));
        }
        return Status::ok();
    }

    Status sync(int fd, bool data_only, std::string_view what) override {
        if ((data_only ? ::fdatasync(fd) : ::fsync(fd)) != 0) {
            return Status::from_errno(errno, str_cat(data_only ? "fdatasync " : "fsync ", what));
        }
        return Status::ok();
    }

    Status rename_at(const Directory& dir, std::string_view from, std::string_view to) override {
        if (::renameat(dir.fd(), std::string(from).c_str(), dir.fd(), std::string(to).c_str()) !=
            0) {
            return Status::from_errno(
                errno, str_cat("rename ", dir.path_of(from), " to ", dir.path_of(to)));
        }
        return Status::ok();
    }

    Status remove_at(const Directory& dir, std::string_view name, bool directory) override {
        if (::unlinkat(dir.fd(), std::string(name).c_str(), directory ? AT_REMOVEDIR : 0) != 0) {
            return Status::from_errno(errno, str_cat("remove ", dir.path_of(name)));
        }
        return Status::ok();
    }

    Status write_all(int fd, std::span<const std::byte> bytes, std::string_view what) override {
        std::size_t done = 0;
        // Bounded: every iteration writes at least one byte or returns (EINTR retries are
        // bounded by the signals the process receives).
        while (done < bytes.size()) {
            const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
            if (n < 0) {
                if (errno == EINTR) continue;
                return Status::from_errno(errno, str_cat("write ", what));
            }
            if (n == 0) return Status::io_error(str_cat("write ", what, ": wrote nothing"), EIO);
            done += static_cast<std::size_t>(n);
        }
        return Status::ok();
    }

    Status read_exact(int fd, std::span<std::byte> bytes, std::string_view what) override {
        std::size_t done = 0;
        while (done < bytes.size()) {
            const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
            if (n < 0) {
                if (errno == EINTR) continue;
                return Status::from_errno(errno, str_cat("read ", what));
            }
            if (n == 0) {
                return Status::corruption(
                    str_cat(what, ": ends after ", done, " bytes, ", bytes.size(), " expected"));
            }
            done += static_cast<std::size_t>(n);
        }
        return Status::ok();
    }
};

// The trust rule for one directory's stat.
Status check_one(const struct stat& st, const std::string& path, std::string_view key,
                 std::string_view role) {
    const uid_t me = ::geteuid();
    if (st.st_uid != me && st.st_uid != 0) {
        return Status::invalid_argument(
            str_cat(key, ": ", role, path, " is owned by ", owner_name(st.st_uid), ", mode ",
                    mode_text(st.st_mode), ", not by the running user ", owner_name(me),
                    me == 0 ? "" : " or root",
                    "; refusing it, since its owner could replace this run's files. Use a "
                    "directory of your own"));
    }
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
        return Status::invalid_argument(str_cat(
            key, ": ", role, path, " (owner ", owner_name(st.st_uid), ", mode ",
            mode_text(st.st_mode), ") is writable by ",
            (st.st_mode & S_IWOTH) != 0 ? "every user" : "its group",
            " without the sticky bit; refusing it, since any of them could replace this run's "
            "files. Remove the write permission (chmod go-w) or use a directory of your own"));
    }
    return Status::ok();
}

}  // namespace

std::string Directory::path_of(std::string_view name) const {
    if (!path_.empty() && path_.back() == '/') return str_cat(path_, name);
    return str_cat(path_, "/", name);
}

std::string_view file_op_name(FileOp op) noexcept {
    switch (op) {
        case FileOp::kOpen:
            return "open";
        case FileOp::kMakeDirectory:
            return "mkdir";
        case FileOp::kPreallocate:
            return "fallocate";
        case FileOp::kSync:
            return "fsync";
        case FileOp::kRename:
            return "rename";
        case FileOp::kRemove:
            return "remove";
        case FileOp::kWrite:
            return "write";
        case FileOp::kRead:
            return "read";
    }
    return "file op";
}

FileSystem& posix_file_system() noexcept {
    // Never destroyed: used at exit. Allocation failure at start-up ends the process.
    static PosixFileSystem* const fs =
        new PosixFileSystem();  // NOLINT(bugprone-unhandled-exception-at-new)
    return *fs;
}

Status remove_tree_at(FileSystem& fs, const Directory& parent, std::string_view name) {
    struct stat st {};
    const std::string n(name);
    if (::fstatat(parent.fd(), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) return Status::ok();
        return Status::from_errno(errno, str_cat("stat ", parent.path_of(name)));
    }
    if (!S_ISDIR(st.st_mode)) return fs.remove_at(parent, name, /*directory=*/false);
    // Opened directly, not through `fs`: a removal is one operation (FileOp::kRemove) to a fault
    // plan, however many directories it walks.
    FileDescriptor fd(
        ::openat(parent.fd(), n.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd.valid()) {
        return Status::from_errno(errno, str_cat("open directory ", parent.path_of(name)));
    }
    const Directory dir(std::move(fd), parent.path_of(name));
    // List first, then remove: removing while reading a directory stream may skip entries.
    ZINF_ASSIGN_OR_RETURN(const std::vector<std::string> entries, list_directory(dir));
    for (const auto& entry : entries) ZINF_TRY(remove_tree_at(fs, dir, entry));
    return fs.remove_at(parent, name, /*directory=*/true);
}

Result<Directory> open_trusted_directory(FileSystem& fs, const std::string& path,
                                         std::string_view key, bool create) {
    if (create) {
        std::error_code ec;
        std::filesystem::create_directories(path, ec);
        if (ec && !std::filesystem::is_directory(path)) {
            return Status::io_error(str_cat(key, ": create directory ", path, ": ", ec.message()),
                                    ec.value());
        }
    }
    ZINF_TRY(check_writable_directory(path).with_context(key));
    auto dir = fs.open_directory(path, /*follow_last=*/true);
    if (!dir.has_value()) return dir.error().with_context(key);
    ZINF_TRY(check_trusted_directory(*dir, key));
    return std::move(dir).value();
}

Status check_trusted_directory(const Directory& dir, std::string_view key) {
    struct stat st {};
    if (::fstat(dir.fd(), &st) != 0) return Status::from_errno(errno, str_cat("stat ", dir.path()));
    ZINF_TRY(check_one(st, dir.path(), key, "directory "));

    // Symbolic links on the way as given: one owned by another user could be pointed elsewhere.
    if (!dir.path().empty() && dir.path()[0] == '/') {
        std::string prefix;
        std::size_t at = 1;
        while (at <= dir.path().size()) {
            const std::size_t slash = dir.path().find('/', at);
            const std::size_t end = slash == std::string::npos ? dir.path().size() : slash;
            if (end > at) {
                prefix = dir.path().substr(0, end);
                struct stat lst {};
                if (::lstat(prefix.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode) &&
                    lst.st_uid != ::geteuid() && lst.st_uid != 0) {
                    return Status::invalid_argument(
                        str_cat(key, ": ", dir.path(), ": the symbolic link ", prefix,
                                " on its way is owned by ", owner_name(lst.st_uid),
                                ", who could point it elsewhere; refusing it"));
                }
            }
            if (slash == std::string::npos) break;
            at = slash + 1;
        }
    }

    // Every directory above the resolved one: whoever can rename an ancestor can swap the tree.
    ZINF_ASSIGN_OR_RETURN(const std::string real, resolved_path(dir));
    std::size_t slash = real.rfind('/');
    while (slash != std::string::npos) {
        const std::string ancestor = slash == 0 ? std::string("/") : real.substr(0, slash);
        struct stat ast {};
        if (::lstat(ancestor.c_str(), &ast) != 0) {
            return Status::from_errno(errno, str_cat("stat ", ancestor));
        }
        const std::string role = str_cat("the directory ", dir.path(), " lies in ");
        ZINF_TRY(check_one(ast, ancestor, key, role));
        if (slash == 0) break;
        slash = real.rfind('/', slash - 1);
    }
    return Status::ok();
}

std::string describe_owner_and_mode(unsigned uid, unsigned mode) {
    return str_cat("owner ", owner_name(static_cast<uid_t>(uid)), ", mode ",
                   mode_text(static_cast<mode_t>(mode)));
}

Result<std::string> resolved_path(const Directory& dir) {
    char resolved[4096];
    const std::string link = str_cat("/proc/self/fd/", dir.fd());
    const ssize_t n = ::readlink(link.c_str(), resolved, sizeof resolved - 1);
    if (n <= 0) return Status::from_errno(n < 0 ? errno : ENOENT, str_cat("resolve ", dir.path()));
    std::string real(resolved, static_cast<std::size_t>(n));
    if (real.empty() || real[0] != '/') {
        return Status::io_error(str_cat("resolve ", dir.path(), ": got '", real, "'"), ENOENT);
    }
    return real;
}

Result<std::vector<std::string>> list_directory(const Directory& dir) {
    const int list_fd = ::dup(dir.fd());
    if (list_fd < 0) return Status::from_errno(errno, str_cat("dup ", dir.path()));
    DIR* stream = ::fdopendir(list_fd);
    if (stream == nullptr) {
        const int err = errno;
        ::close(list_fd);
        return Status::from_errno(err, str_cat("list ", dir.path()));
    }
    ::rewinddir(stream);  // the duplicate shares the position with `dir`
    std::vector<std::string> entries;
    errno = 0;
    while (const dirent* e = ::readdir(stream)) {
        const std::string_view entry(e->d_name);
        if (entry != "." && entry != "..") entries.emplace_back(entry);
    }
    const int err = errno;
    ::closedir(stream);
    if (err != 0) return Status::from_errno(err, str_cat("list ", dir.path()));
    return entries;
}

// ---- FaultyFileSystem ------------------------------------------------------------------------

Status FaultyFileSystem::maybe_fail(FileOp op, std::string_view what) {
    if ((plan_.ops & static_cast<std::uint32_t>(op)) == 0) return Status::ok();
    const std::uint64_t n = counted_.fetch_add(1) + 1;
    bool fail = plan_.fail_nth_op != 0 && n == plan_.fail_nth_op;
    if (!fail && plan_.error_probability > 0) {
        // One generator per call, seeded by (seed, n): replayable and lock-free.
        std::mt19937_64 rng(plan_.seed * 0x9e3779b97f4a7c15ULL + n);
        fail = std::uniform_real_distribution<double>(0.0, 1.0)(rng) < plan_.error_probability;
    }
    if (!fail) return Status::ok();
    injected_.fetch_add(1);
    return Status::from_errno(plan_.errno_to_inject, str_cat(file_op_name(op), " ", what,
                                                             " (injected fault, file op ", n, ")"))
        .mark_injected();
}

Result<Directory> FaultyFileSystem::open_directory(const std::string& path, bool follow_last) {
    ZINF_TRY(maybe_fail(FileOp::kOpen, path));
    return inner_.open_directory(path, follow_last);
}

Result<Directory> FaultyFileSystem::open_directory_at(const Directory& parent,
                                                      std::string_view name) {
    ZINF_TRY(maybe_fail(FileOp::kOpen, parent.path_of(name)));
    return inner_.open_directory_at(parent, name);
}

Result<FileDescriptor> FaultyFileSystem::open_at(const Directory& dir, std::string_view name,
                                                 int flags, unsigned mode) {
    ZINF_TRY(maybe_fail(FileOp::kOpen, dir.path_of(name)));
    return inner_.open_at(dir, name, flags, mode);
}

Status FaultyFileSystem::make_directory_at(const Directory& parent, std::string_view name,
                                           unsigned mode) {
    ZINF_TRY(maybe_fail(FileOp::kMakeDirectory, parent.path_of(name)));
    return inner_.make_directory_at(parent, name, mode);
}

Status FaultyFileSystem::preallocate(int fd, std::uint64_t length_bytes, std::string_view what) {
    ZINF_TRY(maybe_fail(FileOp::kPreallocate, what));
    return inner_.preallocate(fd, length_bytes, what);
}

Status FaultyFileSystem::sync(int fd, bool data_only, std::string_view what) {
    ZINF_TRY(maybe_fail(FileOp::kSync, what));
    return inner_.sync(fd, data_only, what);
}

Status FaultyFileSystem::rename_at(const Directory& dir, std::string_view from,
                                   std::string_view to) {
    ZINF_TRY(maybe_fail(FileOp::kRename, dir.path_of(from)));
    return inner_.rename_at(dir, from, to);
}

Status FaultyFileSystem::remove_at(const Directory& dir, std::string_view name, bool directory) {
    ZINF_TRY(maybe_fail(FileOp::kRemove, dir.path_of(name)));
    return inner_.remove_at(dir, name, directory);
}

Status FaultyFileSystem::write_all(int fd, std::span<const std::byte> bytes,
                                   std::string_view what) {
    ZINF_TRY(maybe_fail(FileOp::kWrite, what));
    return inner_.write_all(fd, bytes, what);
}

Status FaultyFileSystem::read_exact(int fd, std::span<std::byte> bytes, std::string_view what) {
    ZINF_TRY(maybe_fail(FileOp::kRead, what));
    return inner_.read_exact(fd, bytes, what);
}

}  // namespace zinf::io
