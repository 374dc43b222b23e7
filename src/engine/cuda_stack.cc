// The TrainingStack over CudaDevice and CudaCompute.
#include "src/engine/cuda_stack.h"

#include "src/device/cuda_compute.h"
#include "src/device/cuda_device.h"
#include "zero/single_rank_communicator.h"

namespace zinf {

Result<TrainingStack> create_cuda_training_stack(const config::EngineConfig& config) {
    if (config.device.type != "cuda") {
        return Status::invalid_argument("device.type: \"" + config.device.type +
                                        "\"; the CUDA stack needs \"cuda\"");
    }
    TrainingStack s;
    device::CudaDeviceOptions device_options;
    device_options.local_rank = config.device.local_rank;
    device_options.budget_bytes = config.device.memory_budget_bytes;
    ZINF_ASSIGN_OR_RETURN(auto device, device::CudaDevice::create(device_options));
    ZINF_ASSIGN_OR_RETURN(auto compute, device::CudaCompute::create(*device));
    s.device = std::move(device);
    s.compute = std::move(compute);
    s.communicator = std::make_unique<zero::SingleRankCommunicator>(*s.device);
    ZINF_ASSIGN_OR_RETURN(s.model, model::Mlp::create(mlp_config(config), *s.device));
    ZINF_ASSIGN_OR_RETURN(s.engine,
                          Engine::create(config, *s.model, *s.device, *s.compute, *s.communicator));
    return s;
}

}  // namespace zinf
