// Choosing the stack and the communicator of one rank of a launch. The feature macros are
// private to target zinf_engine_launch (src/engine/CMakeLists.txt).
#include "src/engine/launch_stack.h"

#include <chrono>
#include <memory>
#include <utility>

#include "src/base/log.h"
#ifdef ZINF_ENGINE_HAVE_CUDA
#include "src/engine/cuda_stack.h"
#endif
#ifdef ZINF_ENGINE_HAVE_MPI
#include "zero/mpi_communicator.h"
#endif
#ifdef ZINF_ENGINE_HAVE_NCCL_MPI
#include "src/device/cuda_device.h"
#include "zero/nccl_mpi_bootstrap.h"
#endif

namespace zinf {
namespace {

using CommunicatorResult = Result<std::unique_ptr<zero::Communicator>>;

// Several ranks on a device whose transport this build lacks (unused where it has both).
[[maybe_unused]] Status built_without(const config::EngineConfig& config, const char* what) {
    return Status::not_supported(str_cat("several ranks on device.type \"", config.device.type,
                                         "\": this zinfinity-train was built without ", what));
}

// MPI between CPU-device ranks: comm.deterministic and comm.timeout_s as they are.
CommunicatorResult make_mpi_communicator(const config::EngineConfig& config, Device& device) {
#ifdef ZINF_ENGINE_HAVE_MPI
    zero::MpiCommunicatorOptions o;
    o.deterministic = config.comm.deterministic;
    o.timeout = std::chrono::seconds(config.comm.timeout_s);
    ZINF_ASSIGN_OR_RETURN(auto c, zero::MpiCommunicator::create(device, o));
    return std::unique_ptr<zero::Communicator>(std::move(c));
#else
    (void)device;
    return built_without(config, "MPI");
#endif
}

// NCCL, bootstrapped over MPI, between GPU ranks. NCCL orders its own reductions, and only its
// barrier waits with a bound: both comm keys are narrowed, with a warning.
CommunicatorResult make_nccl_communicator(const config::EngineConfig& config, Device& device) {
#ifdef ZINF_ENGINE_HAVE_NCCL_MPI
    auto& cuda = static_cast<device::CudaDevice&>(device);
    if (config.comm.deterministic) {
        log::warning(
            "comm.deterministic: not implemented for GPU ranks (NCCL orders its "
            "reductions itself); ignored");
    }
    zero::NcclCommunicatorOptions no;
    if (config.comm.timeout_s > 0) no.barrier_timeout = std::chrono::seconds(config.comm.timeout_s);
    log::warning("comm.timeout_s: on GPU ranks it bounds NCCL barriers only");
    ZINF_ASSIGN_OR_RETURN(auto c, zero::create_nccl_communicator_with_mpi(cuda, no));
    return std::unique_ptr<zero::Communicator>(std::move(c));
#else
    (void)device;
    return built_without(config, "NCCL and MPI");
#endif
}

// The communicator of several ranks, by the kind of the stack's device. Empty for one rank:
// the stack's single-rank communicator. `config` must outlive the stack's creation.
CommunicatorFactory communicator_factory(const config::EngineConfig& config, const Launch& launch) {
    if (launch.world_size == 1) return {};
    return [&config](Device& device) -> CommunicatorResult {
        return device.kind() == DeviceKind::kCpu ? make_mpi_communicator(config, device)
                                                 : make_nccl_communicator(config, device);
    };
}

}  // namespace

Result<TrainingStack> create_training_stack(const config::EngineConfig& config,
                                            const Launch& launch, const EngineOptions& options) {
    config::EngineConfig c = config;
    if (launch.world_size > 1 && c.device.type == "cuda") {
        c.device.local_rank = launch.local_rank;  // one GPU per rank of this node
    }
    if (c.device.type == "cuda") {
        if (options.io_faults.has_value() || options.file_system != nullptr) {
            return Status::not_supported(
                "device.type: \"cuda\": injected I/O faults are for the CPU device's stack");
        }
#ifdef ZINF_ENGINE_HAVE_CUDA
        return create_cuda_training_stack(c, communicator_factory(c, launch));
#else
        return Status::not_supported(
            "device.type: \"cuda\": this zinfinity-train was built without CUDA (nvcc not "
            "found at build time)");
#endif
    }
    return TrainingStack::create(c, options, communicator_factory(c, launch));
}

}  // namespace zinf
