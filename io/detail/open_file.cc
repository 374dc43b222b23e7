// OsStorage::open: a file of the operating system opened for the engine, in named steps: its
// directory (never through a symbolic link where that is asked), the buffered descriptor, and a
// second, O_DIRECT descriptor of the same file where the file system takes direct I/O, with its
// alignment queried (else buffered I/O, or an error when aio.use_direct is true).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "io/block_size.h"
#include "io/detail/os_storage.h"
#include "src/base/log.h"

namespace zinf::io::detail {

namespace {

Status explain_open_error(int err, const std::string& path, const FileOptions& options) {
    const std::string parent = std::filesystem::path(path).parent_path().string();
    switch (err) {
        case ENOENT:
            if (options.create && !parent.empty() && ::access(parent.c_str(), F_OK) != 0) {
                return Status::not_found(
                    str_cat("open ", path, ": directory ", parent, " does not exist"), err);
            }
            return Status::not_found(str_cat("open ", path, ": No such file or directory"), err);
        case ENOTDIR:
            return Status::invalid_argument(
                str_cat("open ", path,
                        ": a component of the path is a file where a directory is expected"));
        case EISDIR:
            return Status::invalid_argument(
                str_cat("open ", path, ": is a directory, expected a file"));
        case EROFS:
            return Status::io_error(str_cat("open ", path, ": read-only file system"), err);
        case EACCES:
            return Status::io_error(str_cat("open ", path, ": permission denied"), err);
        default:
            return Status::from_errno(err, str_cat("open ", path));
    }
}

// Opens the directory that holds the file, never through a symbolic link as its last
// component when options.trusted_directory; the file is then opened relative to it.
Status open_parent_directory(FileSystem& fs, const FileOptions& options, StorageFile& s) {
    const std::string& path = s.path;
    const std::filesystem::path fs_path(path);
    s.name = fs_path.filename().string();
    if (s.name.empty() || s.name == "." || s.name == "..") {
        return Status::invalid_argument(str_cat("open ", path, ": expected a file name"));
    }
    std::string parent = fs_path.parent_path().string();
    // push_back, not `= "."`: GCC 12 at -O3 sees a false overlap in the inlined assignment
    // (-Wrestrict).
    if (parent.empty()) parent.push_back('.');
    auto directory = fs.open_directory(parent, /*follow_last=*/!options.trusted_directory);
    if (!directory.has_value()) {
        const Status& e = directory.error();
        if (e.errno_value() == ENOENT) {
            return Status::not_found(
                str_cat("open ", path, ": directory ", parent, " does not exist"), ENOENT);
        }
        if (e.errno_value() == ENOTDIR) return explain_open_error(ENOTDIR, path, options);
        return e.with_context(str_cat("open ", path));
    }
    s.directory = std::move(*directory);
    return Status::ok();
}

// Opens (or creates) the file for buffered I/O; marks it created when it did not
// exist before, so that a failed open removes it again.
Status open_buffered(FileSystem& fs, const FileOptions& options, StorageFile& s) {
    int flags = options.read_only ? O_RDONLY : O_RDWR;
    if (options.create) flags |= O_CREAT;
    if (options.create && options.exclusive) flags |= O_EXCL;
    if (options.truncate) flags |= O_TRUNC;
    struct stat before {};
    const bool existed =
        ::fstatat(s.directory.fd(), s.name.c_str(), &before, AT_SYMLINK_NOFOLLOW) == 0;
    auto opened = fs.open_at(s.directory, s.name, flags, options.mode);
    if (!opened.has_value()) {
        const Status& e = opened.error();
        // A refused symbolic link or an injected fault says so itself; errno explains others.
        if (e.code() == StatusCode::kInvalidArgument || e.errno_value() == 0 || e.is_injected()) {
            return e;
        }
        return explain_open_error(e.errno_value(), s.path, options);
    }
    FileDescriptor fd = std::move(*opened);
    s.created = !existed;
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
        return Status::invalid_argument(str_cat("open ", s.path, ": not a regular file"));
    }
    s.buffered_fd = std::move(fd);
    s.buffered_fd_value = s.buffered_fd.get();
    return Status::ok();
}

// The file opened a second time, with O_DIRECT: `fd` when that worked, else the error
// in `refusal` (an error of its own, such as a symbolic link put in its place, is returned).
struct DirectOpen {
    FileDescriptor fd;
    Status refusal;
};

Result<DirectOpen> reopen_direct(FileSystem& fs, const FileOptions& options, const StorageFile& s) {
    auto reopened =
        fs.open_at(s.directory, s.name, O_DIRECT | (options.read_only ? O_RDONLY : O_RDWR), 0);
    DirectOpen out;
    if (!reopened.has_value()) {
        const Status& e = reopened.error();
        if (e.code() == StatusCode::kInvalidArgument && e.errno_value() == ELOOP) return e;
        out.refusal = e;
        return out;
    }
    out.fd = std::move(*reopened);
    // The same file both times: nothing replaced the name between the two opens.
    struct stat a {};
    struct stat b {};
    if (::fstat(s.buffered_fd.get(), &a) != 0 || ::fstat(out.fd.get(), &b) != 0 ||
        a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
        return Status::io_error(str_cat("open ", s.path,
                                        ": the file changed between its "
                                        "buffered and its O_DIRECT open"),
                                EBUSY);
    }
    return out;
}

// Takes the O_DIRECT descriptor when the file system accepts direct I/O on it, with its
// alignment (queried, not assumed). Where it refuses (EINVAL, EOPNOTSUPP, or statx says no),
// `mode` decides: kAuto falls back to buffered I/O with one warning per directory, kOn fails.
Status adopt_direct_or_fall_back(DirectMode mode, DirectOpen direct, StorageFile& s) {
    const std::string& path = s.path;
    const int err = direct.refusal.errno_value();
    Result<DirectIoAlignment> alignment = DirectIoAlignment{};
    if (direct.fd.valid()) alignment = query_direct_io_alignment(direct.fd.get(), path);
    if (!alignment.has_value()) return alignment.error();
    if (direct.fd.valid() && alignment->direct_supported) {
        s.direct_fd = std::move(direct.fd);
        s.direct_fd_value = s.direct_fd.get();
        s.direct = true;
        s.alignment_bytes = alignment->alignment_bytes;
        log::debug("io: ", path, ": O_DIRECT alignment ", s.alignment_bytes, " bytes (",
                   alignment->source, ")");
        return Status::ok();
    }
    if (!direct.fd.valid() && err != EINVAL && err != EOPNOTSUPP) {
        return direct.refusal.with_context("O_DIRECT");
    }
    if (mode == DirectMode::kOn) {
        return Status::not_supported(
            str_cat("open ", path, ": the file system refuses O_DIRECT",
                    err != 0 ? str_cat(" (", std::strerror(err), ")") : std::string(),
                    " and aio.use_direct is true; set it to \"auto\" or false"),
            err);
    }
    log::warn_once(str_cat("io-no-direct:", std::filesystem::path(path).parent_path().string()),
                   str_cat("io: ", path,
                           ": the file system refuses O_DIRECT; using buffered I/O "
                           "(aio.use_direct is auto)"));
    return Status::ok();
}

}  // namespace

Status OsStorage::open(const FileOptions& options, DirectMode direct, StorageFile& file) {
    ZINF_TRY(open_parent_directory(file_system_, options, file));
    ZINF_TRY(open_buffered(file_system_, options, file));
    if (direct == DirectMode::kOff) return Status::ok();
    ZINF_ASSIGN_OR_RETURN(DirectOpen reopened, reopen_direct(file_system_, options, file));
    return adopt_direct_or_fall_back(direct, std::move(reopened), file);
}

}  // namespace zinf::io::detail
