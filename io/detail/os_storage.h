// io::detail::OsStorage: the operating system's files as an engine's storage. Files are opened
// through an io::FileSystem relative to their directory, buffered and a second time with
// O_DIRECT where the file system takes it (open_file.cc); bytes move through the backend that
// aio.backend names (os_storage.cc). Private to io/: others get it from make_os_storage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "io/backend.h"
#include "io/file_system.h"
#include "io/storage.h"
#include "src/base/status.h"

namespace zinf::io::detail {

// Stateless beyond what it borrows, so thread-safe.
class OsStorage final : public Storage {
public:
    // Borrows `file_system`, which must outlive the storage. `aio_backend`: the config's value.
    OsStorage(FileSystem& file_system, std::string aio_backend)
        : file_system_(file_system), aio_backend_(std::move(aio_backend)) {}

    Result<std::unique_ptr<Backend>> make_backend(const BackendOptions& options,
                                                  std::size_t worker_index) override;
    // Every system backend takes the registration calls; those without fixed buffers or files
    // accept and ignore them.
    bool registers_buffers() const noexcept override { return true; }
    // The steps of an open, in open_file.cc: the directory, the buffered descriptor, the O_DIRECT
    // one (or the fallback to buffered I/O).
    Status open(const FileOptions& options, DirectMode direct, StorageFile& file) override;
    // Refuses up front (kNoSpace) what the file system has no room for, then fallocates.
    Status preallocate(StorageFile& file, std::uint64_t length_bytes) override;
    Status sync(const StorageFile& file) override;
    Status remove(const StorageFile& file) override;

private:
    FileSystem& file_system_;
    const std::string aio_backend_;
};

}  // namespace zinf::io::detail
