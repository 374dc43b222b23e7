// make_offload_plan: placement and sizing of every state, from the config and the model's sizes.
#include "src/engine/offload_plan.h"

#include <algorithm>
#include <cstdio>

#include "src/base/log.h"
#include "src/base/units.h"

namespace zinf::engine {
namespace {

constexpr std::size_t kPageBytes = 4096;

Home home_of(config::OffloadDevice device) noexcept {
    switch (device) {
        case config::OffloadDevice::kNone:
            return Home::kDevice;
        case config::OffloadDevice::kCpu:
            return Home::kHost;
        case config::OffloadDevice::kNvme:
            return Home::kNvme;
    }
    return Home::kDevice;
}

std::string joined(const std::vector<std::string>& paths) {
    std::string s;
    for (const auto& p : paths) s += (s.empty() ? "" : ", ") + p;
    return s;
}

// DeepSpeed's optimizer names and flags to the kernel's kinds (Adam with adam_w_mode is AdamW).
kernels::OptimizerParams optimizer_params(const config::OptimizerConfig& c) noexcept {
    kernels::OptimizerParams p;
    p.kind = c.type == OptimizerKind::kAdam && c.adam_w_mode ? OptimizerKind::kAdamW : c.type;
    p.lr = c.lr;
    p.beta1 = c.beta1;
    p.beta2 = c.beta2;
    p.eps = c.eps;
    p.weight_decay = c.weight_decay;
    p.bias_correction = c.bias_correction;
    p.amsgrad = c.amsgrad;
    p.torch_rounding = c.torch_rounding;
    return p;
}

// offload_param "nvme": the pinned host tier and the device tier, checked against the largest
// parameter partition.
Status size_parameter_tiers(const config::EngineConfig& config, const PlanInputs& in,
                            OffloadPlan& plan) {
    const auto& zc = config.zero;
    const auto& op = zc.offload_param;
    const std::size_t eb = dtype_size_bytes(plan.dtype);
    const std::size_t largest = plan.largest_partition_numel;
    if (op.buffer_size_numel < largest) {
        return Status::invalid_argument(
            str_cat("zero_optimization.offload_param.buffer_size: ", op.buffer_size_numel,
                    " elements is smaller than the largest parameter partition (", largest,
                    " elements); raise it to at least that"));
    }
    if (op.buffer_count < 2) {
        return Status::invalid_argument(
            str_cat("zero_optimization.offload_param.buffer_count: ", op.buffer_count,
                    "; at least 2 buffers are needed (one in use, one arriving)"));
    }
    if (op.max_in_cpu_numel < 2 * largest) {
        return Status::invalid_argument(
            str_cat("zero_optimization.offload_param.max_in_cpu: ", op.max_in_cpu_numel,
                    " elements cannot hold two of the largest parameter partitions (", largest,
                    " elements each); raise it to at least ", 2 * largest));
    }
    std::uint64_t host =
        align_up(static_cast<std::size_t>(std::min<std::uint64_t>(
                     static_cast<std::uint64_t>(op.buffer_count) * op.buffer_size_numel,
                     op.max_in_cpu_numel)) *
                     eb,
                 kPageBytes);
    // Host extents are page-aligned (O_DIRECT): tiny partitions take a page each.
    const std::uint64_t two_pages = 2 * align_up(largest * eb, kPageBytes);
    if (host < two_pages) {
        log::info("offload_param: host tier raised from ", format_bytes(host), " to ",
                  format_bytes(two_pages), " (two page-aligned partitions)");
        host = two_pages;
    }
    // The device tier holds gathered-from slices: bounded by stage3_max_live_parameters and by a
    // quarter of the device budget, at least two of the largest slices.
    const std::uint64_t two = 2 * align_up(largest * eb, std::size_t{256});
    const std::uint64_t live = zc.stage3_max_live_parameters_numel * eb;
    const std::uint64_t device_tier =
        std::max<std::uint64_t>(two, std::min<std::uint64_t>(live, in.device_budget_bytes / 4));
    if (device_tier > in.device_budget_bytes / 2) {
        return Status::invalid_argument(
            str_cat("device.memory_budget: ", in.device_budget_bytes,
                    " bytes cannot hold two of the largest parameter partitions (", two,
                    " bytes) in half of it; raise it to at least ", 2 * two));
    }
    plan.parameter_host_tier_bytes = host;
    plan.parameter_device_tier_bytes = device_tier;

    plan.parameter_store.paths = op.nvme_path;
    plan.parameter_store.verify_checksums = config.swap.verify_checksums;
    plan.parameter_store.name = "parameters";
    plan.lock_parameter_host_tier = op.pin_memory;
    // pin_memory false: a pageable host tier (a GPU stages its copies through the driver).
    plan.mover.register_with_device = op.pin_memory || in.device_kind == DeviceKind::kCpu;
    // The compute waits for parameter fetches; the optimizer states' I/O can wait for them.
    plan.mover.urgent = true;
    tier::ResidencyOptions& ro = plan.residency;
    ro.dtype = plan.dtype;
    ro.device_budget_bytes = static_cast<std::size_t>(device_tier);
    // buffer_count x buffer_size and max_in_cpu are folded into the host tier above.
    ro.host_budget_bytes = static_cast<std::size_t>(host);
    ro.prefetch_bucket_numel = zc.stage3_prefetch_bucket_size_numel;
    ro.max_live_numel = zc.stage3_max_live_parameters_numel;
    ro.partition_capacity = std::max<std::size_t>(in.parameter_numels.size(), 1);
    return Status::ok();
}

// The domain cut into runs of consecutive global flat indices (OffloadPlan::state_segments):
// one per parameter slice of this rank (partitioned) or per padded parameter (the full layout),
// adjacent runs merged.
std::vector<kernels::StateSegment> state_segments(const zero::Partitioning& part,
                                                  bool partitioned) {
    std::vector<kernels::StateSegment> out;
    std::uint64_t global = 0;  // G_p: the earlier parameters rounded up to whole blocks
    for (std::size_t i = 0; i < part.parameter_count(); ++i) {
        const zero::ParameterSlot& slot = part.slot(i);
        kernels::StateSegment seg;
        seg.offset = partitioned ? slot.partition_offset_numel : slot.full_offset_numel;
        seg.numel = partitioned ? slot.slice_numel : slot.padded_numel;
        seg.global_index =
            global + (partitioned ? static_cast<std::uint64_t>(part.rank()) * slot.slice_numel : 0);
        ZINF_ASSERT(seg.numel % kStateBlockNumel == 0 && seg.offset % kStateBlockNumel == 0);
        global += align_up(slot.numel, kStateBlockNumel);
        if (!out.empty() && out.back().offset + out.back().numel == seg.offset &&
            out.back().global_index + out.back().numel == seg.global_index) {
            out.back().numel += seg.numel;
        } else {
            out.push_back(seg);
        }
    }
    return out;
}

// The seed of compressed states' stochastic rounding (bf16 and int8): the config's seed, mixed
// (splitmix64's finaliser) so that it differs from the model's initialisation streams.
std::uint64_t rounding_seed_of(std::uint64_t seed) noexcept {
    std::uint64_t z = seed + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// offload_optimizer "nvme": the swapper's sub-groups and its pinned buffers (one group: the
// rank's optimizer domain), sized as every NVMe optimizer is (swap::layout_optimizer_stack).
Status size_optimizer_swap(const config::EngineConfig& config, std::size_t first_partition,
                           int world_size, OffloadPlan& plan) {
    const auto& zc = config.zero;
    const auto& oo = zc.offload_optimizer;
    swap::OptimizerStackOptions so;
    so.group_numels = {plan.domain_numel};
    so.sub_group_numel = plan.sub_group_numel;
    so.kind = plan.optimizer.kind;
    so.amsgrad = plan.optimizer.amsgrad;
    so.pipeline_read = oo.pipeline_read;
    so.pipeline_write = oo.pipeline_write;
    so.read_ahead = config.swap.optimizer_read_ahead;
    if (so.read_ahead > 1 && !oo.pipeline_read) {
        return Status::invalid_argument(
            str_cat("swap.optimizer_read_ahead ", so.read_ahead,
                    " reads sub-groups ahead of the update: it needs "
                    "zero_optimization.offload_optimizer.pipeline_read true"));
    }
    so.first_partition = static_cast<swap::PartitionId>(first_partition);
    so.pool_name = "offload_optimizer";
    so.state_dtype = plan.state_dtype;
    so.segments = plan.state_segments;
    so.rounding_seed = plan.rounding_seed;
    ZINF_ASSIGN_OR_RETURN(plan.optimizer_stack, swap::layout_optimizer_stack(so));
    plan.optimizer_store.paths = oo.nvme_path;
    plan.optimizer_store.verify_checksums = config.swap.verify_checksums;
    plan.optimizer_store.name = "optimizer";
    plan.stores_shared =
        plan.parameters == Home::kNvme && oo.nvme_path == zc.offload_param.nvme_path;
    // swap.background_checkpoint: the states alternate between two extents, so that a
    // checkpoint's snapshot stays readable while the next step runs (a shared store is the
    // parameters' one: all of it is copy-on-write). One rank only: several write their
    // checkpoints in the foreground, and their stores stay single.
    const bool cow = config.swap.background_checkpoint && world_size == 1;
    plan.optimizer_store.copy_on_write = cow;
    if (plan.stores_shared) plan.parameter_store.copy_on_write = cow;
    return Status::ok();
}

io::DirectMode direct_mode(config::Tristate t) noexcept {
    switch (t) {
        case config::Tristate::kAuto:
            return io::DirectMode::kAuto;
        case config::Tristate::kOn:
            return io::DirectMode::kOn;
        case config::Tristate::kOff:
            return io::DirectMode::kOff;
    }
    return io::DirectMode::kAuto;
}

// Where parameters, gradients and optimizer states live, how new parameters go back, the
// optimizer's unit of work and the coordinator's options. What may combine with what was checked
// by config::load, once.
void place_states(const config::EngineConfig& config, const PlanInputs& in, OffloadPlan& plan) {
    const auto& zc = config.zero;
    plan.parameters = home_of(zc.offload_param.device);
    plan.optimizer_states = home_of(zc.offload_optimizer.device);
    const bool cpu_device = in.device_kind == DeviceKind::kCpu;
    // DeepSpeed keeps the gradient partition in host memory under offload; on the CPU device
    // that is registered host memory outside the budget, read in place by the optimizer. Whether
    // it streams to NVMe instead is decided once the pinned buffers are sized
    // (choose_gradient_home).
    const bool host_gradients =
        plan.stage_plan.optimizer_partitioned && cpu_device &&
        (plan.parameters_offloaded() || plan.optimizer_states == Home::kNvme);
    plan.gradients = host_gradients ? Home::kHost : Home::kDevice;
    // The CPU optimizer reads gradients in host memory: a copy is made for host states (as
    // DeepSpeed's CPU offload keeps one), and for NVMe states on a GPU.
    plan.gradients_copied_to_host = plan.optimizer_states == Home::kHost ||
                                    (plan.optimizer_states == Home::kNvme && !cpu_device);
    // Stages 1-2 over several ranks: the rank's slices sit apart in the full layout.
    const bool slices_apart = plan.stage_plan.optimizer_partitioned &&
                              !plan.stage_plan.parameters_partitioned && in.world_size > 1;
    if (plan.parameters_offloaded() || !cpu_device || slices_apart) {
        plan.parameter_update = ParameterUpdate::kThroughCoordinator;
    } else {
        plan.parameter_update = plan.dtype == DType::kFloat32 ? ParameterUpdate::kCopyMaster
                                                              : ParameterUpdate::kInPlace;
    }

    // The optimizer's unit of work: sub_group_size elements (a multiple of 16 in memory, for
    // the kernels' alignment; the NVMe swapper takes it as given), at most the domain. 0 is
    // DeepSpeed's "one parameter per sub-group": here, sub-groups of the largest partition.
    std::uint64_t sgs =
        zc.sub_group_size_numel != 0 ? zc.sub_group_size_numel : plan.largest_partition_numel;
    // Compressed states: whole blocks of the global flat index (the domain is made of them).
    if (plan.state_dtype != StateDType::kFp32)
        sgs = align_up(std::max<std::uint64_t>(sgs, 1), kStateBlockNumel);
    plan.sub_group_numel =
        plan.optimizer_states == Home::kNvme
            ? static_cast<std::size_t>(
                  std::min<std::uint64_t>(std::max<std::uint64_t>(sgs, 16), plan.domain_numel))
            : std::min<std::size_t>(
                  plan.domain_numel,
                  std::max<std::size_t>(16, static_cast<std::size_t>(sgs / 16 * 16)));

    zero::CoordinatorOptions& co = plan.coordinator;
    co.stage = zc.stage;
    co.dtype = plan.dtype;
    co.persistence_threshold_numel = zc.stage3_param_persistence_threshold_numel;
    co.max_live_parameters_numel = zc.stage3_max_live_parameters_numel;
    co.host_gradients = host_gradients;
}

// Under NVMe optimizer offload (stages 2-3) the gradient partition may stream to the swap files
// as backward produces it, so that host memory does not grow with the model. It is slower than
// host memory (every gradient is written and read back once more), so by default
// (stream_gradients "auto") it streams only when the partition does not fit in the host budget
// beside the pinned buffers; true and false force either home.
void choose_gradient_home(const config::EngineConfig& config, OffloadPlan& plan) {
    const std::uint64_t bytes =
        static_cast<std::uint64_t>(plan.domain_numel) * dtype_size_bytes(plan.dtype);
    const std::uint64_t pinned = plan.parameter_host_tier_bytes + plan.optimizer_pinned_bytes();
    const bool can_stream = plan.gradients == Home::kHost && plan.optimizer_states == Home::kNvme &&
                            plan.stage_plan.gradients_partitioned;
    if (!can_stream) {
        if (plan.gradients == Home::kHost) plan.gradients_reason = "the optimizer reads them there";
        return;
    }
    const config::Tristate mode = config.zero.offload_optimizer.stream_gradients;
    const bool fits = plan.host_budget_bytes == 0 || pinned + bytes <= plan.host_budget_bytes;
    bool stream = false;
    switch (mode) {
        case config::Tristate::kOn:
            stream = true;
            plan.gradients_reason = "offload_optimizer.stream_gradients is true";
            break;
        case config::Tristate::kOff:
            plan.gradients_reason = "offload_optimizer.stream_gradients is false";
            break;
        case config::Tristate::kAuto:
            stream = !fits;
            plan.gradients_reason =
                plan.host_budget_bytes == 0
                    ? std::string("no device.host_memory_budget limits them")
                    : str_cat(format_bytes(bytes), " + ", format_bytes(pinned), " pinned ",
                              fits ? "fit in" : "exceed", " the host budget of ",
                              format_bytes(plan.host_budget_bytes));
            break;
    }
    if (stream) {
        plan.gradients = Home::kNvme;
        plan.coordinator.host_gradients = false;
    }
}

// swap.overlap_step: one rank, stages 2-3 (each gradient reduced as backward produces it),
// optimizer states on NVMe, gradients in host memory read in place by the CPU optimizer.
std::string overlap_step_unusable(const OffloadPlan& plan, int world_size, DeviceKind device) {
    if (world_size != 1) return "several ranks";
    if (device != DeviceKind::kCpu) return "a GPU device";
    if (plan.optimizer_states != Home::kNvme) return "the optimizer states are not on NVMe";
    if (!plan.stage_plan.gradients_partitioned) {
        return str_cat("ZeRO stage ", plan.stage,
                       " reduces the gradients at the step (stages 2-3 hand each one over as "
                       "backward produces it)");
    }
    if (plan.gradients == Home::kNvme) return "the gradients stream to NVMe";
    if (plan.gradients_copied_to_host) return "the gradients are copied to the host at the step";
    return "";
}

void plan_overlap_step(const config::EngineConfig& config, const PlanInputs& in,
                       OffloadPlan& plan) {
    if (!config.swap.overlap_step) return;
    plan.overlap_step_reason = overlap_step_unusable(plan, in.world_size, in.device_kind);
    plan.overlap_step = plan.overlap_step_reason.empty();
    if (!plan.overlap_step) return;
    // The speculated step writes shadows: the states (and a store they share) copy-on-write.
    plan.optimizer_store.copy_on_write = true;
    if (plan.stores_shared) plan.parameter_store.copy_on_write = true;
}

}  // namespace

namespace {

// The fields the two spellings of the aio block share (all but use_direct's type).
template <typename To, typename From>
void copy_aio_fields(To& to, const From& from) {
    to.block_size_bytes = from.block_size_bytes;
    to.queue_depth = from.queue_depth;
    to.intra_op_parallelism = from.intra_op_parallelism;
    to.single_submit = from.single_submit;
    to.overlap_events = from.overlap_events;
    to.backend = from.backend;
    to.register_buffers = from.register_buffers;
    to.sqpoll = from.sqpoll;
}

}  // namespace

io::AioOptions aio_options(const config::AioConfig& aio) {
    io::AioOptions o;
    copy_aio_fields(o, aio);
    o.use_direct = direct_mode(aio.use_direct);
    return o;
}

config::AioConfig aio_config(const io::AioOptions& aio) {
    config::AioConfig c;
    copy_aio_fields(c, aio);
    c.use_direct = aio.use_direct == io::DirectMode::kOn    ? config::Tristate::kOn
                   : aio.use_direct == io::DirectMode::kOff ? config::Tristate::kOff
                                                            : config::Tristate::kAuto;
    return c;
}

std::string_view home_name(Home home) noexcept {
    switch (home) {
        case Home::kDevice:
            return "device";
        case Home::kHost:
            return "cpu";
        case Home::kNvme:
            return "nvme";
    }
    return "device";
}

Result<OffloadPlan> make_offload_plan(const config::EngineConfig& config, const PlanInputs& in) {
    const auto& zc = config.zero;
    OffloadPlan plan;
    plan.stage = zc.stage;
    plan.stage_plan = zero::StagePlan::for_stage(zc.stage);
    plan.dtype = config.bf16.enabled   ? DType::kBFloat16
                 : config.fp16.enabled ? DType::kFloat16
                                       : DType::kFloat32;
    plan.state_dtype = zc.offload_optimizer.state_dtype;
    if (plan.state_dtype != StateDType::kFp32) plan.partition_align_numel = kStateBlockNumel;
    plan.coordinator.partition_align_numel = plan.partition_align_numel;
    ZINF_ASSIGN_OR_RETURN(auto part,
                          zero::Partitioning::create(in.parameter_numels, in.world_size, in.rank,
                                                     plan.partition_align_numel));
    plan.model_numel = part.model_numel();
    plan.domain_numel =
        plan.stage_plan.optimizer_partitioned ? part.partition_numel() : part.full_numel();
    for (std::size_t i = 0; i < part.parameter_count(); ++i) {
        plan.largest_partition_numel =
            std::max(plan.largest_partition_numel, part.slot(i).slice_numel);
    }
    plan.optimizer = optimizer_params(config.optimizer);
    plan.cpu_isa = config.cpu_optimizer.isa;
    plan.cpu_threads = config.cpu_optimizer.threads;
    plan.state_count =
        swap::OptimizerSwapper::state_count(plan.optimizer.kind, plan.optimizer.amsgrad);
    if (plan.state_dtype != StateDType::kFp32) {
        plan.state_segments = state_segments(part, plan.stage_plan.optimizer_partitioned);
        plan.rounding_seed = rounding_seed_of(config.seed);
    }

    place_states(config, in, plan);

    if (plan.parameters == Home::kNvme) ZINF_TRY(size_parameter_tiers(config, in, plan));
    if (plan.optimizer_states == Home::kNvme) {
        ZINF_TRY(size_optimizer_swap(config, part.parameter_count(), in.world_size, plan));
        plan.optimizer_pool_registered_with_device =
            in.device_kind != DeviceKind::kCpu && zc.offload_optimizer.pin_memory;
    }
    plan.needs_io = plan.parameters == Home::kNvme || plan.optimizer_states == Home::kNvme;
    plan.io.aio = aio_options(config.aio);

    plan.host_budget_bytes = config.device.host_memory_budget_bytes;
    choose_gradient_home(config, plan);
    plan_overlap_step(config, in, plan);
    const std::uint64_t pinned = plan.parameter_host_tier_bytes + plan.optimizer_pinned_bytes();
    if (plan.host_budget_bytes > 0 && pinned > plan.host_budget_bytes) {
        return Status::invalid_argument(str_cat(
            "device.host_memory_budget: ", plan.host_budget_bytes,
            " bytes is less than the pinned memory the offload config needs: ",
            plan.parameter_host_tier_bytes,
            " bytes for parameters (offload_param buffer_count x buffer_size) + ",
            plan.optimizer_pinned_bytes(), " bytes for optimizer sub-groups (sub_group_size ",
            plan.sub_group_numel, ", swap.optimizer_read_ahead ", config.swap.optimizer_read_ahead,
            "); raise it to at least ", pinned));
    }
    return plan;
}

namespace {
// "12", "8", "6.004": whole numbers plain, others to three places.
std::string bytes_per_element_text(double b) {
    char buf[32];
    if (b == static_cast<double>(static_cast<std::uint64_t>(b))) {
        std::snprintf(buf, sizeof buf, "%.0f", b);
    } else {
        std::snprintf(buf, sizeof buf, "%.3f", b);
    }
    return buf;
}
}  // namespace

double OffloadPlan::state_bytes_per_element() const noexcept {
    if (domain_numel == 0) return 4.0 * static_cast<double>(state_count);
    std::uint64_t bytes = static_cast<std::uint64_t>(domain_numel) * 4;
    for (std::size_t i = 1; i < state_count; ++i) {
        bytes += state_moment_size_bytes(state_dtype, domain_numel);
    }
    return static_cast<double>(bytes) / static_cast<double>(domain_numel);
}

std::string OffloadPlan::describe() const {
    const std::size_t eb = dtype_size_bytes(dtype);
    std::string s = str_cat("  plan: ZeRO stage ", stage, ", ", dtype_name(dtype),
                            " parameters and gradients, ", model_numel, " parameters, ",
                            domain_numel, " in this rank's optimizer domain");
    s += "\n    parameters: ";
    switch (parameters) {
        case Home::kDevice:
            s += stage_plan.parameters_partitioned ? "device (partitioned, gathered per use)"
                                                   : "device";
            break;
        case Home::kHost:
            s += "cpu (pageable host memory, gathered to the device per use)";
            break;
        case Home::kNvme:
            s += str_cat("nvme (", joined(parameter_store.paths), "; host tier ",
                         format_bytes(parameter_host_tier_bytes),
                         lock_parameter_host_tier ? " pinned" : " pageable", ", device tier ",
                         format_bytes(parameter_device_tier_bytes), ", prefetch ",
                         format_bytes(residency.prefetch_depth_bytes()), " ahead, checksums ",
                         parameter_store.verify_checksums ? "on" : "off", ")");
            break;
    }
    s += str_cat("\n    gradients: ",
                 gradients == Home::kNvme   ? "nvme (streamed to the optimizer's store as backward "
                                              "produces them, read back per sub-group)"
                 : gradients == Home::kHost ? "host memory"
                                            : "device",
                 gradients_copied_to_host ? " (copied to host memory for the optimizer)" : "", ", ",
                 format_bytes(domain_numel * eb), " in the optimizer domain");
    if (!gradients_reason.empty()) s += str_cat(" (", gradients_reason, ")");
    s += str_cat("\n    optimizer states (fp32 master + ", state_count - 1, " ",
                 state_dtype_name(state_dtype), " state", state_count == 2 ? "" : "s",
                 optimizer.amsgrad ? " with amsgrad's maximum" : "", ", ",
                 bytes_per_element_text(state_bytes_per_element()), " B per parameter, ",
                 format_bytes(static_cast<std::uint64_t>(static_cast<double>(domain_numel) *
                                                         state_bytes_per_element())),
                 "): ", home_name(optimizer_states), ", sub-groups of ", sub_group_numel,
                 " elements");
    if (optimizer_states == Home::kNvme) {
        s += str_cat(
            " (", joined(optimizer_store.paths), stores_shared ? ", the parameters' store" : "",
            "; ", optimizer_stack.swappers[0].pipeline_read ? "pipelined reads" : "serial reads",
            ", ", optimizer_stack.swappers[0].pipeline_write ? "pipelined writes" : "serial writes",
            "; pinned ", format_bytes(optimizer_pinned_bytes()),
            !optimizer_store.copy_on_write ? ""
            : overlap_step                 ? "; copy-on-write: the step runs beside backward"
                                           : "; copy-on-write for background checkpoints",
            ")");
    }
    if (host_budget_bytes > 0) {
        s += str_cat("\n    host budget ", format_bytes(host_budget_bytes), ", pinned ",
                     format_bytes(parameter_host_tier_bytes + optimizer_pinned_bytes()));
    }
    return s;
}

}  // namespace zinf::engine
