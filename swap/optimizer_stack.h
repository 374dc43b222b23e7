// The NVMe optimizer's stack, sized and wired in one place for every user: the engine's offload
// plan (one group, the rank's optimizer domain) and the Python package's NVMeOptimizer (one group
// per torch parameter group) both size it with layout_optimizer_stack and build it with
// create_optimizer_pool and create_optimizer_swappers, over a swap store and an I/O engine the
// caller owns. docs/decisions/0010-one-nvme-optimizer-factory.md says why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/engine.h"
#include "kernels/optimizer.h"
#include "src/base/device.h"
#include "src/base/status.h"
#include "swap/optimizer_swapper.h"
#include "swap/pinned_pool.h"
#include "swap/swap_store.h"

namespace zinf::swap {

struct OptimizerStackOptions {
    std::vector<std::uint64_t> group_numels;  // elements of each group (one swapper each), > 0
    std::uint64_t sub_group_numel = 0;        // `sub_group_size`, capped at each group's size
    kernels::OptimizerKind kind = kernels::OptimizerKind::kAdamW;
    bool amsgrad = false;
    bool pipeline_read = true;
    bool pipeline_write = true;
    std::size_t read_ahead = 1;       // OptimizerSwapperOptions::read_ahead
    PartitionId first_partition = 0;  // the groups' partitions follow one another from here
    std::string pool_name = "offload_optimizer";
    // How the moments are stored, and (compressed) the runs of global flat indices and the
    // rounding key: OptimizerSwapperOptions' fields, for every group.
    StateDType state_dtype = StateDType::kFp32;
    std::vector<kernels::StateSegment> segments;
    std::uint64_t rounding_seed = 0;
};

// What the stack needs, computed without allocating anything but the layout.
struct OptimizerStackLayout {
    std::vector<OptimizerSwapperOptions> swappers;  // one per group
    PinnedPoolOptions pool;                         // shared by every group's swapper
    std::uint64_t pinned_bytes = 0;                 // the pool's bytes (page-rounded buffers)
    PartitionId end_partition = 0;                  // one past the last partition used
};

// Pure. Errors: kInvalidArgument for no group, an empty group or a zero sub_group_size.
Result<OptimizerStackLayout> layout_optimizer_stack(const OptimizerStackOptions& options);

// The pinned pool of `layout` (NUMA-placed near `near_device` when given), registered with
// `engine` as fixed buffers (refused registration leaves plain opcodes: logged at debug level)
// and, with `register_with_device`, with the device (pinned for a GPU's copies; a refusal is a
// warning, pageable still works). Errors: PinnedPool::create's.
Result<std::unique_ptr<PinnedPool>> create_optimizer_pool(const OptimizerStackLayout& layout,
                                                          io::Engine& engine, Device* near_device,
                                                          bool register_with_device);

// One swapper per group of `layout`, reserving its partitions in `store` (not yet committed:
// the caller commits once every user has reserved). `store`, `pool` and `kernel` are borrowed
// and outlive the swappers. Errors: OptimizerSwapper::create's.
Result<std::vector<std::unique_ptr<OptimizerSwapper>>> create_optimizer_swappers(
    const OptimizerStackLayout& layout, SwapStore& store, PinnedPool& pool,
    const kernels::OptimizerKernel& kernel);

}  // namespace zinf::swap
