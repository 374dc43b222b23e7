// io::make_storage: the one place that knows which storages exist, as make_backend is for
// backends: the simulated device for EngineOptions::sim, else the operating system's.
#include <memory>
#include <utility>

#include "io/file_system.h"
#include "io/sim_storage.h"
#include "io/storage.h"

namespace zinf::io {

Result<std::unique_ptr<Storage>> make_storage(const EngineOptions& options) {
    if (options.storage != nullptr) {
        if (options.sim) {
            return Status::invalid_argument(
                "EngineOptions: storage and sim both set; pass the simulated device as storage "
                "(io::SimStorage) or set sim alone");
        }
        return std::unique_ptr<Storage>();
    }
    if (options.sim) {
        ZINF_ASSIGN_OR_RETURN(std::unique_ptr<SimStorage> sim, SimStorage::create(*options.sim));
        return std::unique_ptr<Storage>(std::move(sim));
    }
    FileSystem& fs = options.file_system != nullptr ? *options.file_system : posix_file_system();
    return make_os_storage(fs, options.aio.backend);
}

}  // namespace zinf::io
