// io::SimStorage: the simulated device (io/sim_backend.h) as an engine's storage. Files live in
// the device's memory, each worker's backend is a SimBackend on it, and aio.backend is ignored.
// The engine makes one for EngineOptions::sim; a test may make its own and pass it in as
// EngineOptions::storage, to look at the device or to share it between engines.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "io/backend.h"
#include "io/engine.h"
#include "io/sim_backend.h"
#include "io/storage.h"
#include "src/base/status.h"

namespace zinf::io {

// Thread-safe, as its device is.
class SimStorage final : public Storage {
public:
    // kInvalidArgument when options.latency_us_min > options.latency_us_max.
    static Result<std::unique_ptr<SimStorage>> create(const SimOptions& options);

    SimDevice& device() noexcept { return device_; }

    // A SimBackend on the device; `worker_index` separates the workers' random streams.
    Result<std::unique_ptr<Backend>> make_backend(const BackendOptions& options,
                                                  std::size_t worker_index) override;
    // The device has no fixed buffers or files.
    bool registers_buffers() const noexcept override { return false; }
    // Opens or creates the file on the device (SimDevice::open). Direct I/O, unless `direct` is
    // kOff, with the device's logical block size as the alignment.
    Status open(const FileOptions& options, DirectMode direct, StorageFile& file) override;
    // Grows the file; kNoSpace beyond the device's capacity, naming the file.
    Status preallocate(StorageFile& file, std::uint64_t length_bytes) override;
    // Nothing to make durable.
    Status sync(const StorageFile& file) override;
    // Never called by the engine: open does not mark files created, since the device keeps them
    // only as long as it lives, and a failed open has always left them there.
    Status remove(const StorageFile& file) override;

private:
    explicit SimStorage(const SimOptions& options) : device_(options) {}

    SimDevice device_;
};

}  // namespace zinf::io
