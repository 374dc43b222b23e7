// TrainingStack: everything an Engine runs on, built from the config alone: the device (the
// `device` block), its Compute, the communicator (the single-rank one, or what a
// CommunicatorFactory makes: MPI for CPU ranks, NCCL for GPU ranks), the model (the `model`
// block, through the model registry) and the Engine. What the tests use; zinfinity-train goes
// through create_training_stack (launch_stack.h), which picks the stack and the communicator
// for its launch. An embedding program may build the pieces itself and call Engine::create.
#pragma once

#include <functional>
#include <memory>

#include "src/base/compute.h"
#include "src/base/config.h"
#include "src/base/device.h"
#include "src/engine/engine.h"
#include "src/model/model.h"
#include "zero/communicator.h"

namespace zinf {

// Makes the communicator of the stack's device (zinfinity-train: MPI or NCCL over MPI when
// launched on several ranks). Empty: the single-rank communicator.
using CommunicatorFactory =
    std::function<Result<std::unique_ptr<zero::Communicator>>(Device& device)>;

// Makes the model of the stack (an embedding program's own, e.g. the PyTorch front end's
// model::ExternalModel). Empty: the model the config's `model` block names (model registry).
using ModelFactory = std::function<Result<std::unique_ptr<model::Model>>(
    const config::EngineConfig& config, Device& device)>;

struct TrainingStack {
    std::unique_ptr<Device> device;
    std::unique_ptr<Compute> compute;
    std::unique_ptr<zero::Communicator> communicator;
    std::unique_ptr<model::Model> model;
    std::unique_ptr<Engine> engine;  // declared last: destroyed first

    // Errors: kNotSupported for device.type "cuda" (see create_cuda_training_stack), and
    // those of each part's create (kInvalidArgument naming the key, kNoSpace).
    static Result<TrainingStack> create(const config::EngineConfig& config,
                                        const EngineOptions& options = {},
                                        const CommunicatorFactory& make_communicator = {},
                                        const ModelFactory& make_model = {});

    TrainingStack() = default;
    TrainingStack(TrainingStack&&) noexcept = default;
    // Tears down what it held first (engine, model, communicator, compute, device: the order of
    // the destructor; a member-wise move would free the device before the engine).
    TrainingStack& operator=(TrainingStack&& other) noexcept;
    ~TrainingStack();
};

// The rest of a stack over `device` and `compute` (owned by the stack from here): the
// communicator, the model and the Engine. What TrainingStack::create and
// create_cuda_training_stack share.
Result<TrainingStack> assemble_training_stack(const config::EngineConfig& config,
                                              std::unique_ptr<Device> device,
                                              std::unique_ptr<Compute> compute,
                                              const EngineOptions& options = {},
                                              const CommunicatorFactory& make_communicator = {},
                                              const ModelFactory& make_model = {});

}  // namespace zinf
