// OffloadPlan: where every state of an Engine lives and how big every pool and tier is, computed
// once from a validated config and the model's parameter sizes by one pure function (no I/O, no
// allocation but the plan itself). It is the only place that turns config sections into the
// options of the layers below (io, swap, src/tier, zero, kernels), and the only place that
// decides placement: the Engine, Offload and the state stores read the plan's fields instead of
// re-deriving them from config flags. The engine summary prints it (describe()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/engine.h"
#include "kernels/optimizer.h"
#include "src/base/config.h"
#include "src/base/device.h"
#include "src/base/dtype.h"
#include "src/base/status.h"
#include "src/tier/residency_manager.h"
#include "src/tier/store_mover.h"
#include "swap/optimizer_stack.h"
#include "swap/pinned_pool.h"
#include "swap/swap_store.h"
#include "zero/parameter_coordinator.h"
#include "zero/partition.h"

namespace zinf::engine {

// Where a state lives.
enum class Home : std::uint8_t {
    kDevice,  // device memory (host memory under the budget on the CPU device)
    kHost,    // host memory outside the device budget
    kNvme,    // swap files under nvme_path, streamed through pinned host buffers
};
std::string_view home_name(Home home) noexcept;

// How the new parameters reach the model after the optimizer updated a sub-group.
enum class ParameterUpdate : std::uint8_t {
    // bf16/fp16 on a host-addressable device (the CPU device): the optimizer kernel writes the
    // 16-bit copy straight into the device's parameters in the same pass.
    kInPlace,
    // fp32 on the device: the updated master values are copied into the device's parameters.
    kCopyMaster,
    // Through the coordinator (write_domain_parameters): offloaded parameter partitions, or a
    // GPU whose parameters the host-side optimizer cannot write; 16-bit copies are staged in a
    // host buffer of one sub-group.
    kThroughCoordinator,
};

// What the plan needs to know besides the config: the model's parameter sizes (in parameter
// order), the rank's place, and the device.
struct PlanInputs {
    std::vector<std::size_t> parameter_numels;
    int world_size = 1;
    int rank = 0;
    DeviceKind device_kind = DeviceKind::kCpu;
    std::uint64_t device_budget_bytes = 0;
};

struct OffloadPlan {
    int stage = 0;
    zero::StagePlan stage_plan;
    DType dtype = DType::kFloat32;  // parameters and gradients on the device

    // ---- where each state lives ----
    Home parameters = Home::kDevice;  // the rank's parameter partition (stage 3) or all of them
    Home gradients = Home::kDevice;   // the optimizer domain's gradients
    std::string gradients_reason;     // why host memory or NVMe (for the summary)
    Home optimizer_states = Home::kDevice;  // fp32 master + moments
    // The CPU optimizer reads a host copy of the gradients (made before each step).
    bool gradients_copied_to_host = false;
    ParameterUpdate parameter_update = ParameterUpdate::kCopyMaster;

    // ---- sizes ----
    std::size_t model_numel = 0;
    std::size_t domain_numel = 0;  // elements the optimizer updates on this rank
    std::size_t largest_partition_numel = 0;
    std::size_t sub_group_numel = 0;  // the optimizer's (and the checkpoint's) unit of work
    std::size_t state_count = 0;      // arrays per element: the fp32 master + the moments
    // offload_optimizer.state_dtype: how the moments are stored (the master stays fp32).
    StateDType state_dtype = StateDType::kFp32;
    // Each parameter is padded to a multiple of world_size times this: kStateBlockNumel under
    // compressed states (every rank's slice starts on a block of the global flat index, so that
    // N ranks store the values one rank does), else Partitioning::kAlignNumel.
    std::size_t partition_align_numel = zero::Partitioning::kAlignNumel;
    // Compressed states: the domain cut into runs of consecutive global flat indices. The global
    // flat index of element j of parameter p is G_p + j, G_p the sum of the earlier parameters'
    // sizes rounded up to kStateBlockNumel: the same for any number of ranks. Empty for fp32.
    std::vector<kernels::StateSegment> state_segments;
    // Compressed states: the stochastic rounding's seed (from the config's seed).
    std::uint64_t rounding_seed = 0;
    // Bytes per domain element of the optimizer's states as stored (master and moments, the
    // int8 scales included): 12 for Adam in fp32, 8 in bf16, about 6 in int8.
    double state_bytes_per_element() const noexcept;
    std::uint64_t parameter_host_tier_bytes = 0;    // offload_param nvme: pinned host tier
    std::uint64_t parameter_device_tier_bytes = 0;  // offload_param nvme: device tier
    std::uint64_t optimizer_pinned_bytes() const noexcept { return optimizer_stack.pinned_bytes; }
    std::uint64_t host_budget_bytes = 0;  // device.host_memory_budget (0: none)

    // ---- options of the layers below, filled once here ----
    kernels::OptimizerParams optimizer;  // step, lr and grad_scale are set per step
    std::string cpu_isa = "auto";        // resolved (with ZINF_CPU_ISA) when the kernel is made
    int cpu_threads = 0;
    zero::CoordinatorOptions coordinator;  // offloaded_parameters is wired by the engine
    bool needs_io = false;                 // an io::Engine and swap store(s)
    io::EngineOptions io;
    swap::SwapStoreOptions parameter_store;  // used when parameters == kNvme
    swap::SwapStoreOptions optimizer_store;  // used when optimizer_states == kNvme
    bool stores_shared = false;  // both name the same paths: one store, one run directory
    // offload_optimizer nvme: one swapper over the domain and its pinned pool.
    swap::OptimizerStackLayout optimizer_stack;
    bool optimizer_pool_registered_with_device = false;  // pin_memory on a GPU
    tier::ResidencyOptions residency;
    tier::StoreMoverOptions mover;
    bool lock_parameter_host_tier = false;  // offload_param.pin_memory: mlock the host tier
    // swap.overlap_step: the step beside the window's last backward (src/engine/overlap_step.h)
    // on copy-on-write optimizer states; when asked for but not possible, why not (warned).
    bool overlap_step = false;
    std::string overlap_step_reason;

    bool parameters_offloaded() const noexcept { return parameters != Home::kDevice; }
    // Lines for the engine's start-up summary: where each state lives, with the sizes.
    std::string describe() const;
};

// The `aio` block as the I/O engine takes it, and back (zinfinity-bench tune writes an `aio`
// block from what it measured).
io::AioOptions aio_options(const config::AioConfig& aio);
config::AioConfig aio_config(const io::AioOptions& aio);

// Computes the plan. Pure: reads the config and the inputs only. Errors name the key and, for
// sizes, the size needed: kInvalidArgument (a buffer smaller than the largest parameter
// partition, a budget too small for the pinned memory the offload needs, ...), kNotSupported
// (a CPU optimizer variant this CPU lacks, through kernels::resolve_isa).
Result<OffloadPlan> make_offload_plan(const config::EngineConfig& config, const PlanInputs& inputs);

}  // namespace zinf::engine
