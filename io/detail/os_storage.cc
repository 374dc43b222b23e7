// OsStorage: the backend of each engine worker, chosen by aio.backend; preallocation, sync and
// removal of the engine's files through the file system. Opening them is in open_file.cc.
#include "io/detail/os_storage.h"

#include <sys/stat.h>

#include <cerrno>
#include <filesystem>

#include "src/base/file.h"
#include "src/base/log.h"

namespace zinf::io {

namespace detail {

Result<std::unique_ptr<Backend>> OsStorage::make_backend(const BackendOptions& options,
                                                         std::size_t worker_index) {
    (void)worker_index;  // the system backends share nothing between workers
    std::string why;
    auto backend = io::make_backend(options, &why);
    if (!backend.has_value()) {
        const Status& e = backend.error();
        if (aio_backend_ == "auto") return e;
        return Status::not_supported(
            str_cat("aio.backend \"", aio_backend_, "\" cannot be set up: ", e.message()),
            e.errno_value());
    }
    if (options.kind == "auto") {
        const std::string_view name = (*backend)->name();
        if (why.empty()) {
            log::info("io: backend ", name, " (auto)");
        } else {
            log::info("io: backend ", name, " (auto; passed over: ", why, ")");
        }
    }
    return backend;
}

Status OsStorage::preallocate(StorageFile& file, std::uint64_t length_bytes) {
    struct stat st {};
    if (::fstat(file.buffered_fd.get(), &st) != 0) {
        return Status::from_errno(errno, str_cat("fstat ", file.path));
    }
    const auto have = static_cast<std::uint64_t>(st.st_blocks) * 512;
    if (length_bytes <= have) return Status::ok();
    const std::string dir = std::filesystem::path(file.path).parent_path().string();
    auto free = free_space_bytes(dir.empty() ? "." : dir);
    if (free.has_value() && length_bytes - have > *free) {
        return Status::no_space(str_cat("preallocate ", file.path, ": ", length_bytes,
                                        " bytes asked, ", *free, " bytes free on its file system"));
    }
    return file_system_.preallocate(file.buffered_fd.get(), length_bytes, file.path);
}

Status OsStorage::sync(const StorageFile& file) {
    return file_system_.sync(file.buffered_fd.get(), /*data_only=*/true, file.path);
}

Status OsStorage::remove(const StorageFile& file) {
    return file_system_.remove_at(file.directory, file.name, /*directory=*/false);
}

}  // namespace detail

std::unique_ptr<Storage> make_os_storage(FileSystem& file_system, std::string aio_backend) {
    return std::make_unique<detail::OsStorage>(file_system, std::move(aio_backend));
}

}  // namespace zinf::io
