// The memory an Engine will hold, per tier and per kind of state, predicted from the offload plan
// before anything is allocated, and the admission that refuses a config whose prediction exceeds
// a budget. Engine::create admits before it creates a swap directory or a file;
// zinfinity-plan prints the same figures.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/config.h"
#include "src/base/device.h"
#include "src/base/status.h"
#include "src/engine/offload_plan.h"
#include "src/model/model.h"

namespace zinf::engine {

// What a predicted allocation holds.
enum class Holder : std::uint8_t {
    kParameters,
    kGradients,
    kOptimizerStates,
    kActivations,  // the model's workspace (activations, their gradients) and kept checkpoints
    kBuffers,      // staging: batches, copies, I/O buffers
};
inline constexpr std::size_t kHolderCount = 5;
std::string_view holder_name(Holder holder) noexcept;

// The predicted allocations of one tier, named as the allocations themselves are named.
struct TierPrediction {
    struct Item {
        Holder holder = Holder::kBuffers;
        std::string what;
        std::uint64_t bytes = 0;
    };
    std::vector<Item> items;

    std::uint64_t total_bytes() const noexcept;
    std::uint64_t bytes(Holder holder) const noexcept;
    void add(Holder holder, std::string what, std::uint64_t bytes);
};

// What the prediction needs besides the plan: what the model already holds on the device, the
// sets of parameters it holds fetched at once, and the batch it is fed.
struct PredictionInputs {
    // Device bytes held before the engine is made: the model's workspace and its modules'
    // buffers, read from Device::used_bytes() after the model was built (exact).
    std::uint64_t model_device_bytes = 0;
    // Model::fetch_groups(), as parameter indexes. Empty: not known (the gathered working set is
    // then counted as the largest parameter, a lower bound, and the prediction is inexact).
    std::vector<std::vector<std::size_t>> fetch_groups;
    std::size_t batch_input_bytes_per_row = 0;
    std::size_t batch_label_bytes_per_row = 0;
    // The device rounds each allocation up to this (CpuDeviceOptions::alignment_bytes).
    std::size_t device_alignment_bytes = 4096;
};

struct MemoryPrediction {
    TierPrediction device;         // against device.memory_budget
    TierPrediction pinned_host;    // page-locked or device-registered host memory
    TierPrediction pageable_host;  // ordinary host memory
    TierPrediction nvme;           // swap files (approximate: block rounding is not counted)
    std::uint64_t device_budget_bytes = 0;
    std::uint64_t host_budget_bytes = 0;  // 0: none
    // The part of pinned_host that device.host_memory_budget governs (the offload's pinned
    // buffers, and the gradient partition where the plan placed it there by the budget).
    std::uint64_t host_budgeted_bytes = 0;
    // Empty where the device figure is exact; else why it is a bound (the runtime check stays).
    std::string device_inexact_reason;
};

// The plan's inputs for rank `rank` of `world_size` training `model` on `device`.
PlanInputs plan_inputs_for(const model::Model& model, const Device& device, int world_size,
                           int rank);
// The prediction's inputs from `model`, built on `device`, before the engine allocates anything
// there (what the device holds then is counted as the model's).
PredictionInputs prediction_inputs_for(const model::Model& model, const Device& device);

// Predicts every allocation the engine makes for `plan` (computed from the same `config` and
// `plan_inputs`). Pure: allocates only the result. Errors: those of zero::Partitioning::create.
Result<MemoryPrediction> predict_memory(const config::EngineConfig& config, const OffloadPlan& plan,
                                        const PlanInputs& plan_inputs,
                                        const PredictionInputs& inputs);

// Admission: ok when the predicted device peak fits device.memory_budget and the budgeted host
// memory fits device.host_memory_budget; else kInvalidArgument naming the key, the bytes needed
// and the breakdown.
Status admit(const MemoryPrediction& prediction);

// A table of the prediction: per tier, bytes by holder, then the named allocations.
std::string describe(const MemoryPrediction& prediction);

}  // namespace zinf::engine
