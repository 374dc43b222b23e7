// FileDescriptor and file-system queries.
#include "src/base/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>

#include "src/base/log.h"

namespace zinf {

void FileDescriptor::reset() noexcept {
    if (fd_ >= 0) {
        // close() errors on a descriptor we only read or wrote through O_DIRECT are not
        // actionable here; data integrity is established by fsync where it matters.
        ::close(fd_);
        fd_ = -1;
    }
}

Result<std::uint64_t> free_space_bytes(const std::string& path) {
    struct statvfs st {};
    if (::statvfs(path.c_str(), &st) != 0)
        return Status::from_errno(errno, str_cat("statvfs ", path));
    return static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
}

Status check_writable_directory(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        const int err = errno;
        if (err == ENOENT)
            return Status::not_found(str_cat(path, ": directory does not exist"), err);
        return Status::from_errno(err, str_cat(path, ": cannot stat"));
    }
    if (!S_ISDIR(st.st_mode)) {
        return Status::invalid_argument(str_cat(path, ": is not a directory"));
    }
    if (::access(path.c_str(), W_OK | X_OK) != 0) {
        const int err = errno;
        if (err == EROFS)
            return Status::from_errno(err,
                                      str_cat(path, ": directory is on a read-only file system"));
        return Status::from_errno(err, str_cat(path, ": directory is not writable"));
    }
    // access() says yes for root even on directories without write bits but on a read-only
    // mount it says EROFS; probe with statvfs flags to be sure.
    struct statvfs vfs {};
    if (::statvfs(path.c_str(), &vfs) == 0 && (vfs.f_flag & ST_RDONLY) != 0) {
        return Status::io_error(str_cat(path, ": directory is on a read-only file system"), EROFS);
    }
    return Status::ok();
}

}  // namespace zinf
