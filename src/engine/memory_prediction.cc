// predict_memory: the engine's allocations, listed as the layers below make them, from the plan.
// Each helper mirrors one allocating function and names it; when that function changes, its
// mirror here must too (MemoryPredictionTest compares the sum with CpuDevice::peak_bytes()).
#include "src/engine/memory_prediction.h"

#include <algorithm>

#include "src/base/aligned.h"
#include "src/base/units.h"
#include "src/engine/state_store.h"
#include "zero/partition.h"

namespace zinf::engine {
namespace {

constexpr std::uint64_t kPageBytes = 4096;

// The state in which the prediction is built: the partitioning and the device's rounding.
struct Sizer {
    const config::EngineConfig& config;
    const OffloadPlan& plan;
    const zero::Partitioning& part;
    const PredictionInputs& inputs;
    MemoryPrediction& out;

    std::uint64_t eb() const noexcept { return dtype_size_bytes(plan.dtype); }
    // A device allocation as the device charges it.
    std::uint64_t charged(std::uint64_t bytes) const noexcept {
        return align_up(static_cast<std::size_t>(bytes), inputs.device_alignment_bytes);
    }
    // ParameterCoordinator::allocate: at least 64 bytes.
    void coordinator(Holder holder, const char* what, std::uint64_t bytes) const {
        out.device.add(holder, str_cat("zero: ", what),
                       charged(std::max<std::uint64_t>(bytes, 64)));
    }
};

// ParameterCoordinator::allocate_parameters, allocate_gradients and allocate_scratch.
void predict_coordinator(const Sizer& s) {
    const zero::StagePlan& sp = s.plan.stage_plan;
    const std::uint64_t eb = s.eb();
    const std::uint64_t full = s.part.full_numel();
    const std::uint64_t partition = s.part.partition_numel();
    const bool one_rank = s.part.world_size() == 1;
    if (!sp.parameters_partitioned) {
        s.coordinator(Holder::kParameters, "parameters", full * eb);
        if (s.plan.dtype != DType::kFloat32) {
            s.coordinator(Holder::kParameters, "fp32 parameters", full * 4);
        }
    }
    if (sp.optimizer_partitioned && sp.parameters_partitioned && !s.plan.parameters_offloaded()) {
        s.coordinator(Holder::kParameters, "parameter partition", partition * eb);
    }
    const bool streamed = s.plan.gradients == Home::kNvme;
    if (sp.optimizer_partitioned && !streamed && !s.plan.coordinator.host_gradients &&
        (sp.gradients_partitioned || !one_rank)) {
        s.coordinator(Holder::kGradients, "gradient partition", partition * eb);
    }
    if (!sp.gradients_partitioned) s.coordinator(Holder::kGradients, "gradients", full * eb);
    std::uint64_t max_padded = 0;
    std::uint64_t max_slice = 0;
    for (std::size_t i = 0; i < s.part.parameter_count(); ++i) {
        max_padded = std::max<std::uint64_t>(max_padded, s.part.slot(i).padded_numel);
        max_slice = std::max<std::uint64_t>(max_slice, s.part.slot(i).slice_numel);
    }
    s.coordinator(Holder::kGradients, "gradient staging", max_padded * eb);
    if (sp.gradients_partitioned)
        s.coordinator(Holder::kGradients, "gradient slice", max_slice * eb);
    s.coordinator(Holder::kBuffers, "fp32 scratch", max_padded * 4);
    if (s.plan.dtype != DType::kFloat32)
        s.coordinator(Holder::kBuffers, "fp32 scratch", max_padded * 4);
}

// Stage 3's gathered fp32 copies (ParameterCoordinator::gather): the persistent parameters stay
// gathered; the others are gathered per use and released after it, and released copies are kept
// as spares only within the peak the gathered copies reached. So the peak is the persistent ones
// plus the largest set the model holds fetched at once. stage3_max_live_parameters does not bound
// it (the coordinator warns above it, and gathers anyway).
void predict_gathered(const Sizer& s) {
    if (!s.plan.stage_plan.parameters_partitioned) return;
    const std::size_t count = s.part.parameter_count();
    const std::uint64_t threshold = s.config.zero.stage3_param_persistence_threshold_numel;
    std::vector<bool> persistent(count);
    std::uint64_t persistent_bytes = 0;
    std::uint64_t largest_bytes = 0;
    for (std::size_t i = 0; i < count; ++i) {
        const std::uint64_t bytes = s.charged(s.part.slot(i).padded_numel * 4);
        persistent[i] = s.part.slot(i).numel <= threshold;
        if (persistent[i]) persistent_bytes += bytes;
        if (!persistent[i]) largest_bytes = std::max(largest_bytes, bytes);
    }
    std::uint64_t group_bytes = 0;
    for (const auto& group : s.inputs.fetch_groups) {
        std::uint64_t sum = 0;
        for (const std::size_t i : group) {
            ZINF_ASSERT_LT(i, count);
            if (!persistent[i]) sum += s.charged(s.part.slot(i).padded_numel * 4);
        }
        group_bytes = std::max(group_bytes, sum);
    }
    if (s.inputs.fetch_groups.empty()) {
        group_bytes = largest_bytes;
        s.out.device_inexact_reason =
            "the model does not say which parameters it holds fetched at once: the gathered "
            "copies are counted as the largest parameter";
    }
    if (persistent_bytes > 0) {
        s.out.device.add(Holder::kParameters, "gathered persistent parameters (fp32)",
                         persistent_bytes);
    }
    s.out.device.add(Holder::kParameters, "gathered parameters (fp32, the largest fetch group)",
                     group_bytes);
}

// The device's share of the rest: the residency manager's device tier, the optimizer states
// kept on the device, the batch staging (Engine::build).
void predict_device_rest(const Sizer& s) {
    MemoryPrediction& out = s.out;
    out.device.add(Holder::kActivations, "model workspace (activations, gradients, scratch)",
                   s.inputs.model_device_bytes);
    if (s.plan.parameters == Home::kNvme) {
        out.device.add(Holder::kParameters, "residency: device tier",
                       s.charged(s.plan.parameter_device_tier_bytes));
    }
    const std::size_t arrays = StateLayout::of(s.plan.optimizer).arrays();
    if (s.plan.optimizer_states == Home::kDevice) {
        std::uint64_t bytes = 0;
        for (std::size_t i = 0; i < arrays; ++i) {
            bytes += s.charged(in_memory_state_bytes(s.plan, i));
        }
        out.device.add(Holder::kOptimizerStates, "optimizer states (fp32 master + moments)", bytes);
    }
    const std::uint64_t rows = s.config.batch.train_micro_batch_size_per_gpu;
    out.device.add(Holder::kBuffers, "batch inputs",
                   s.charged(rows * s.inputs.batch_input_bytes_per_row));
    out.device.add(Holder::kBuffers, "batch labels",
                   s.charged(rows * s.inputs.batch_label_bytes_per_row));
    out.device.add(Holder::kBuffers, "accuracy", s.charged(sizeof(std::uint64_t)));
}

// Host memory: the pinned buffers of the offload and the gradient partition, the pageable copies
// and stores. The gradient stream's buffers are approximate (their read buffers depend on how the
// sub-groups cover the partitions).
void predict_host(const Sizer& s) {
    const OffloadPlan& p = s.plan;
    MemoryPrediction& out = s.out;
    const std::uint64_t eb = s.eb();
    const std::uint64_t partition = std::max<std::uint64_t>(s.part.partition_numel() * eb, 64);
    if (p.parameters == Home::kNvme) {
        (p.lock_parameter_host_tier ? out.pinned_host : out.pageable_host)
            .add(Holder::kParameters, "offload_param host tier", p.parameter_host_tier_bytes);
        out.pageable_host.add(Holder::kBuffers, "offload_param staging",
                              align_up(static_cast<std::size_t>(p.largest_partition_numel * eb),
                                       static_cast<std::size_t>(kPageBytes)));
        out.host_budgeted_bytes += p.parameter_host_tier_bytes;
    }
    if (p.parameters == Home::kHost) {
        out.pinned_host.add(Holder::kParameters, "offload_param cpu: host partition", partition);
    }
    if (p.optimizer_states == Home::kNvme) {
        out.pinned_host.add(Holder::kOptimizerStates, "offload_optimizer pinned sub-groups",
                            p.optimizer_pinned_bytes());
        out.host_budgeted_bytes += p.optimizer_pinned_bytes();
    }
    if (p.coordinator.host_gradients) {
        out.pinned_host.add(Holder::kGradients, "zero: host gradient partition", partition);
        // Placed there by the budget (stream_gradients "auto"), it counts against it; forced by
        // stream_gradients false, or read there by a host optimizer, it is outside it as before.
        if (p.optimizer_states == Home::kNvme &&
            s.config.zero.offload_optimizer.stream_gradients == config::Tristate::kAuto) {
            out.host_budgeted_bytes += partition;
        }
    }
    if (p.gradients == Home::kNvme) {
        const std::uint64_t largest = std::max<std::uint64_t>(p.largest_partition_numel * eb, 64);
        const std::uint64_t group = std::max<std::uint64_t>(p.sub_group_numel * eb, 64);
        out.pageable_host.add(Holder::kGradients, "gradient stream buffers (approximate)",
                              5 * largest + 4 * group);
    }
    if (p.gradients_copied_to_host) {
        out.pageable_host.add(Holder::kGradients, "host copy of the gradients", partition);
    }
    if (p.optimizer_states == Home::kHost) {
        std::uint64_t bytes = 0;
        for (std::size_t i = 0; i < StateLayout::of(p.optimizer).arrays(); ++i) {
            bytes += in_memory_state_bytes(p, i);
        }
        out.pageable_host.add(Holder::kOptimizerStates, "optimizer states (fp32 master + moments)",
                              bytes);
    }
    if (p.parameter_update == ParameterUpdate::kThroughCoordinator && p.dtype != DType::kFloat32) {
        out.pageable_host.add(Holder::kBuffers, "host 16-bit parameters",
                              std::max<std::uint64_t>(p.sub_group_numel * eb, 64));
    }
    if (p.overlap_step) {
        // OverlapStep holds the speculated step's new parameters until its commit.
        out.pageable_host.add(Holder::kBuffers, "new parameters of the step beside backward",
                              std::max<std::uint64_t>(p.domain_numel * eb, 64));
    }
}

// The GPT's kept block inputs off the device: n_layer of them in pinned host memory
// (cpu_checkpointing) or in swap files through two write and two read buffers
// (nvme_checkpointing).
void predict_activations(const Sizer& s) {
    const config::EngineConfig& c = s.config;
    if (c.model.type != config::ModelType::kGpt || !c.model.checkpoint_activations) return;
    const std::uint64_t input_bytes =
        static_cast<std::uint64_t>(c.batch.train_micro_batch_size_per_gpu) * c.model.seq_len *
        c.model.d_model * sizeof(float);
    const std::uint64_t count = c.model.n_layer;
    if (c.activation_checkpointing.cpu_checkpointing) {
        s.out.pinned_host.add(Holder::kActivations, "kept block inputs", count * input_bytes);
    } else if (c.activation_checkpointing.nvme_checkpointing) {
        s.out.pinned_host.add(Holder::kActivations, "activation checkpoint buffers",
                              4 * input_bytes);
        s.out.nvme.add(Holder::kActivations, "activation checkpoints", count * input_bytes);
    }
}

// The swap files' payload (their block rounding and checksums are not counted).
void predict_nvme(const Sizer& s) {
    const OffloadPlan& p = s.plan;
    const std::uint64_t eb = s.eb();
    // Copy-on-write stores (swap.background_checkpoint) hold two extents per partition.
    const std::uint64_t param_planes = p.parameter_store.copy_on_write ? 2 : 1;
    const std::uint64_t optimizer_planes = p.optimizer_store.copy_on_write ? 2 : 1;
    if (p.parameters == Home::kNvme) {
        std::uint64_t bytes = 0;
        for (std::size_t i = 0; i < s.part.parameter_count(); ++i) {
            bytes += align_up(static_cast<std::size_t>(s.part.slot(i).slice_numel * eb),
                              static_cast<std::size_t>(kPageBytes));
        }
        s.out.nvme.add(
            Holder::kParameters,
            param_planes == 2 ? "parameter partitions (copy-on-write: x2)" : "parameter partitions",
            bytes * param_planes);
    }
    if (p.optimizer_states == Home::kNvme) {
        // Each sub-group's master and moments as stored (OptimizerSwapper's partitions).
        std::uint64_t bytes = 0;
        for (std::uint64_t at = 0; at < p.domain_numel; at += p.sub_group_numel) {
            const std::uint64_t n = std::min<std::uint64_t>(p.sub_group_numel, p.domain_numel - at);
            for (std::size_t k = 0; k < p.state_count; ++k) {
                bytes += swap::OptimizerSwapper::state_bytes(k, n, p.state_dtype);
            }
        }
        s.out.nvme.add(Holder::kOptimizerStates,
                       optimizer_planes == 2
                           ? "optimizer states (fp32 master + moments; copy-on-write: x2)"
                           : "optimizer states (fp32 master + moments)",
                       bytes * optimizer_planes);
    }
    if (p.gradients == Home::kNvme) {
        s.out.nvme.add(
            Holder::kGradients,
            optimizer_planes == 2 ? "streamed gradients (copy-on-write: x2)" : "streamed gradients",
            static_cast<std::uint64_t>(p.domain_numel) * eb * optimizer_planes);
    }
}

std::string pad_left(std::string_view text, std::size_t width) {
    return std::string(width > text.size() ? width - text.size() : 0, ' ') + std::string(text);
}

std::string pad_right(std::string_view text, std::size_t width) {
    return std::string(text) + std::string(width > text.size() ? width - text.size() : 0, ' ');
}

std::string breakdown(const TierPrediction& tier) {
    std::string s;
    for (const auto& item : tier.items) {
        if (item.bytes == 0) continue;
        s += str_cat(s.empty() ? "" : ", ", item.what, " ", item.bytes);
    }
    return s;
}

}  // namespace

std::string_view holder_name(Holder holder) noexcept {
    switch (holder) {
        case Holder::kParameters:
            return "parameters";
        case Holder::kGradients:
            return "gradients";
        case Holder::kOptimizerStates:
            return "optimizer states";
        case Holder::kActivations:
            return "activations";
        case Holder::kBuffers:
            return "buffers";
    }
    return "buffers";
}

std::uint64_t TierPrediction::total_bytes() const noexcept {
    std::uint64_t sum = 0;
    for (const auto& item : items) sum += item.bytes;
    return sum;
}

std::uint64_t TierPrediction::bytes(Holder holder) const noexcept {
    std::uint64_t sum = 0;
    for (const auto& item : items) sum += item.holder == holder ? item.bytes : 0;
    return sum;
}

void TierPrediction::add(Holder holder, std::string what, std::uint64_t bytes) {
    items.push_back(Item{holder, std::move(what), bytes});
}

PlanInputs plan_inputs_for(const model::Model& model, const Device& device, int world_size,
                           int rank) {
    PlanInputs in;
    for (const auto& info : model.parameters().all()) in.parameter_numels.push_back(info.numel);
    in.world_size = world_size;
    in.rank = rank;
    in.device_kind = device.kind();
    in.device_budget_bytes = device.budget_bytes();
    return in;
}

PredictionInputs prediction_inputs_for(const model::Model& model, const Device& device) {
    PredictionInputs in;
    in.model_device_bytes = device.used_bytes();
    for (const auto& group : model.fetch_groups()) {
        in.fetch_groups.emplace_back(group.begin(), group.end());
    }
    const model::BatchShape shape = model.batch_shape();
    // Engine::build stages both as 4-byte elements (float features or int32 tokens).
    in.batch_input_bytes_per_row = shape.input_numel * 4;
    in.batch_label_bytes_per_row = shape.label_numel * 4;
    in.device_alignment_bytes = device.allocation_granularity_bytes();
    return in;
}

Result<MemoryPrediction> predict_memory(const config::EngineConfig& config, const OffloadPlan& plan,
                                        const PlanInputs& plan_inputs,
                                        const PredictionInputs& inputs) {
    ZINF_ASSERT_GT(inputs.device_alignment_bytes, 0u);
    ZINF_ASSIGN_OR_RETURN(
        auto part, zero::Partitioning::create(plan_inputs.parameter_numels, plan_inputs.world_size,
                                              plan_inputs.rank, plan.partition_align_numel));
    MemoryPrediction out;
    out.device_budget_bytes = plan_inputs.device_budget_bytes;
    out.host_budget_bytes = plan.host_budget_bytes;
    const Sizer s{config, plan, part, inputs, out};
    predict_device_rest(s);
    predict_coordinator(s);
    predict_gathered(s);
    predict_host(s);
    predict_activations(s);
    predict_nvme(s);
    return out;
}

Status admit(const MemoryPrediction& p) {
    const std::uint64_t device = p.device.total_bytes();
    if (p.device_budget_bytes > 0 && device > p.device_budget_bytes) {
        return Status::invalid_argument(str_cat(
            "device.memory_budget: ", p.device_budget_bytes,
            " bytes cannot hold the predicted device peak of ", device, " bytes (",
            format_bytes(device), ": ", breakdown(p.device), "); raise it to at least ", device,
            " or offload more (zero_optimization.offload_param, offload_optimizer)"));
    }
    if (p.host_budget_bytes > 0 && p.host_budgeted_bytes > p.host_budget_bytes) {
        return Status::invalid_argument(
            str_cat("device.host_memory_budget: ", p.host_budget_bytes,
                    " bytes cannot hold the predicted pinned host memory of ",
                    p.host_budgeted_bytes, " bytes (", format_bytes(p.host_budgeted_bytes), ": ",
                    breakdown(p.pinned_host), "); raise it to at least ", p.host_budgeted_bytes));
    }
    return Status::ok();
}

std::string describe(const MemoryPrediction& p) {
    const std::pair<const char*, const TierPrediction*> tiers[] = {
        {"device", &p.device},
        {"pinned host", &p.pinned_host},
        {"pageable host", &p.pageable_host},
        {"nvme", &p.nvme}};
    std::string s = str_cat("  ", pad_right("tier", 14));
    for (std::size_t h = 0; h < kHolderCount; ++h) {
        s += pad_left(holder_name(static_cast<Holder>(h)), 18);
    }
    s += pad_left("total", 14);
    for (const auto& [name, tier] : tiers) {
        s += str_cat("\n  ", pad_right(name, 14));
        for (std::size_t h = 0; h < kHolderCount; ++h) {
            s += pad_left(format_bytes(tier->bytes(static_cast<Holder>(h))), 18);
        }
        s += pad_left(format_bytes(tier->total_bytes()), 14);
    }
    for (const auto& [name, tier] : tiers) {
        for (const auto& item : tier->items) {
            if (item.bytes == 0) continue;
            s += str_cat("\n    ", name, ": ", item.what, ": ", format_bytes(item.bytes));
        }
    }
    return s;
}

}  // namespace zinf::engine
