// The TrainingStack over CudaDevice and CudaCompute.
#include "src/engine/cuda_stack.h"

#include "src/device/cuda_compute.h"
#include "src/device/cuda_device.h"

namespace zinf {

Result<TrainingStack> create_cuda_training_stack(const config::EngineConfig& config,
                                                 const CommunicatorFactory& make_communicator) {
    if (config.device.type != "cuda") {
        return Status::invalid_argument("device.type: \"" + config.device.type +
                                        "\"; the CUDA stack needs \"cuda\"");
    }
    device::CudaDeviceOptions device_options;
    device_options.local_rank = config.device.local_rank;
    device_options.budget_bytes = config.device.memory_budget_bytes;
    ZINF_ASSIGN_OR_RETURN(auto device, device::CudaDevice::create(device_options));
    ZINF_ASSIGN_OR_RETURN(auto compute, device::CudaCompute::create(*device));
    // The compute borrows the device: the stack destroys the compute first.
    return assemble_training_stack(config, std::move(device), std::move(compute), {},
                                   make_communicator);
}

}  // namespace zinf
