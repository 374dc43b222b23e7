// The TrainingStack on a GPU: CudaDevice (device.local_rank, device.memory_budget), CudaCompute,
// the communicator (single-rank, or the factory's: NCCL over MPI), the model and the Engine. Built
// only where CUDA is enabled (target zinf_engine_cuda), so that the installed CPU library never
// needs the CUDA runtime; zinfinity-train calls it for device.type "cuda".
#pragma once

#include "src/base/config.h"
#include "src/base/status.h"
#include "src/engine/stack.h"

namespace zinf {

// Errors: kCuda (no GPU, driver), kNoSpace (budget), and those of Engine::create (e.g. an
// offload_optimizer "none" on a GPU, which needs a device optimizer: use "cpu").
Result<TrainingStack> create_cuda_training_stack(const config::EngineConfig& config,
                                                 const CommunicatorFactory& make_communicator = {});

}  // namespace zinf
