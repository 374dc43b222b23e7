// Building the device, compute, communicator, model and engine from a config.
#include "src/engine/stack.h"

#include "src/device/cpu_compute.h"
#include "src/device/cpu_device.h"
#include "src/engine/model_registry.h"
#include "src/engine/offload.h"
#include "zero/single_rank_communicator.h"

namespace zinf {

TrainingStack::~TrainingStack() {
    // Teardown order: the engine uses the model, both use the device.
    engine.reset();
    model.reset();
    communicator.reset();
    compute.reset();
    device.reset();
}

TrainingStack& TrainingStack::operator=(TrainingStack&& other) noexcept {
    if (this == &other) return *this;
    engine.reset();
    model.reset();
    communicator.reset();
    compute.reset();
    device = std::move(other.device);
    compute = std::move(other.compute);
    communicator = std::move(other.communicator);
    model = std::move(other.model);
    engine = std::move(other.engine);
    return *this;
}

Result<TrainingStack> TrainingStack::create(const config::EngineConfig& config,
                                            const EngineOptions& options,
                                            const CommunicatorFactory& make_communicator,
                                            const ModelFactory& make_model) {
    if (config.device.type != "cpu") {
        return Status::not_supported(
            "device.type: \"" + config.device.type +
            "\": TrainingStack::create builds the CPU stack; the GPU stack is "
            "create_cuda_training_stack (src/engine/cuda_stack.h, target zinf_engine_cuda, built "
            "where CUDA is found)");
    }
    device::CpuDeviceOptions device_options;
    device_options.budget_bytes = config.device.memory_budget_bytes;
    ZINF_ASSIGN_OR_RETURN(auto device, device::CpuDevice::create(device_options));
    ZINF_ASSIGN_OR_RETURN(
        auto compute, device::CpuCompute::create(
                          device.get(), device::CpuComputeOptions{config.cpu_optimizer.threads}));
    return assemble_training_stack(config, std::move(device), std::move(compute), options,
                                   make_communicator, make_model);
}

Result<TrainingStack> assemble_training_stack(const config::EngineConfig& config,
                                              std::unique_ptr<Device> device,
                                              std::unique_ptr<Compute> compute,
                                              const EngineOptions& options,
                                              const CommunicatorFactory& make_communicator,
                                              const ModelFactory& make_model) {
    TrainingStack s;
    s.device = std::move(device);
    s.compute = std::move(compute);
    if (make_communicator) {
        ZINF_ASSIGN_OR_RETURN(s.communicator, make_communicator(*s.device));
    } else {
        s.communicator = std::make_unique<zero::SingleRankCommunicator>(*s.device);
    }
    // Each rank's activation checkpoints (nvme_checkpointing) in a directory of its own, as its
    // swap files are.
    const int world = s.communicator->world_size();
    const config::EngineConfig& own =
        world > 1 ? engine::with_rank_swap_paths(config, s.communicator->rank()) : config;
    ZINF_ASSIGN_OR_RETURN(
        s.model, make_model ? make_model(own, *s.device) : engine::build_model(own, *s.device));
    ZINF_ASSIGN_OR_RETURN(s.engine, Engine::create(config, *s.model, *s.device, *s.compute,
                                                   *s.communicator, options));
    return s;
}

}  // namespace zinf
