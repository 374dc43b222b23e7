// The TrainingStack of one rank of a launch: the stack of the config's device.type (the CPU
// stack, or the GPU stack where CUDA is built) with the communicator of the launch's ranks: the
// single-rank one for one rank, MPI between CPU-device ranks, NCCL bootstrapped over MPI between
// GPU ranks. Target zinf_engine_launch, linked by zinfinity-train and not installed: it links
// whichever of the CUDA stack, MPI and NCCL the build found, so that zinf_engine, the installed
// library, needs none of them (as target zinf_engine_cuda keeps the CUDA runtime out of it).
#pragma once

#include <string>

#include "src/base/config.h"
#include "src/base/status.h"
#include "src/engine/stack.h"

namespace zinf {

// Where this process sits among the ranks of a job: zero::detect_launch's figures, made
// authoritative by zero::MpiSession under an MPI launcher; one rank without MPI.
struct Launch {
    int rank = 0;
    int world_size = 1;
    int local_rank = 0;                     // among the ranks of this node: which GPU it takes
    std::string source = "single process";  // who said so ("mpirun", "PMIx", ...), for messages
};

// The stack of `config` for rank launch.rank of launch.world_size. With several GPU ranks, each
// rank takes the GPU of its local rank (device.local_rank gives way to launch.local_rank). MPI
// must be initialised (zero::MpiSession) before a stack of several ranks is made. The messages
// for what this build lacks name zinfinity-train, the program built with it.
// Errors: kNotSupported for device.type "cuda" in a build without CUDA, and for several ranks in
// a build without their transport (MPI; NCCL and MPI for GPU ranks); those of
// TrainingStack::create, create_cuda_training_stack and the communicators' create.
// `options` reach the CPU stack's Engine (e.g. io_faults, a fault plan for the swap I/O); the
// GPU stack takes none (kNotSupported when given).
Result<TrainingStack> create_training_stack(const config::EngineConfig& config,
                                            const Launch& launch,
                                            const EngineOptions& options = {});

}  // namespace zinf
