// SimStorage: the engine's calls on its storage, answered by the simulated device.
#include "io/sim_storage.h"

#include <memory>

#include "src/base/log.h"

namespace zinf::io {

Result<std::unique_ptr<SimStorage>> SimStorage::create(const SimOptions& options) {
    if (options.latency_us_min > options.latency_us_max) {
        return Status::invalid_argument("sim: latency_us_min > latency_us_max");
    }
    return std::unique_ptr<SimStorage>(new SimStorage(options));  // private constructor
}

Result<std::unique_ptr<Backend>> SimStorage::make_backend(const BackendOptions& options,
                                                          std::size_t worker_index) {
    return std::unique_ptr<Backend>(
        std::make_unique<SimBackend>(device_, options.queue_depth, worker_index, options.seams));
}

Status SimStorage::open(const FileOptions& options, DirectMode direct, StorageFile& file) {
    ZINF_ASSIGN_OR_RETURN(const int id, device_.open(file.path, options));
    file.buffered_fd_value = file.direct_fd_value = id;
    file.direct = direct != DirectMode::kOff;
    file.alignment_bytes = file.direct ? device_.options().logical_block_bytes : 1;
    return Status::ok();
}

Status SimStorage::preallocate(StorageFile& file, std::uint64_t length_bytes) {
    const Status st = device_.reserve(file.buffered_fd_value, length_bytes);
    if (!st.is_ok()) return st.with_context(str_cat("preallocate ", file.path));
    return Status::ok();
}

Status SimStorage::sync(const StorageFile& file) {
    (void)file;
    return Status::ok();
}

Status SimStorage::remove(const StorageFile& file) {
    (void)file;
    return Status::ok();
}

}  // namespace zinf::io
