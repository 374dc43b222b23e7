// The NVMe optimizer's stack: layout (pure), pool, swappers.
#include "swap/optimizer_stack.h"

#include <algorithm>

#include "src/base/log.h"
#include "src/base/units.h"

namespace zinf::swap {

Result<OptimizerStackLayout> layout_optimizer_stack(const OptimizerStackOptions& options) {
    if (options.group_numels.empty() || options.sub_group_numel == 0) {
        return Status::invalid_argument(
            "NVMe optimizer: needs at least one parameter group and a positive sub_group_size");
    }
    OptimizerStackLayout layout;
    std::uint64_t buffer_bytes = 0;
    std::size_t buffers = 0;
    PartitionId next = options.first_partition;
    for (const std::uint64_t numel : options.group_numels) {
        if (numel == 0) return Status::invalid_argument("NVMe optimizer: an empty parameter group");
        OptimizerSwapperOptions o;
        o.numel = numel;
        o.sub_group_numel = std::min(options.sub_group_numel, numel);
        o.kind = options.kind;
        o.amsgrad = options.amsgrad;
        o.pipeline_read = options.pipeline_read;
        o.pipeline_write = options.pipeline_write;
        o.read_ahead = options.read_ahead;
        o.first_partition = next;
        o.state_dtype = options.state_dtype;
        o.segments = options.segments;
        o.rounding_seed = options.rounding_seed;
        const std::uint64_t groups = (numel + o.sub_group_numel - 1) / o.sub_group_numel;
        next += static_cast<PartitionId>(groups * OptimizerSwapper::state_count(o.kind, o.amsgrad));
        buffer_bytes =
            std::max(buffer_bytes, OptimizerSwapper::buffer_size_bytes(o.sub_group_numel, o.kind,
                                                                       o.amsgrad, o.state_dtype));
        buffers = std::max(buffers, OptimizerSwapper::buffers_needed(o));
        layout.swappers.push_back(o);
    }
    layout.pool.name = options.pool_name;
    layout.pool.buffer_count = buffers;
    layout.pool.buffer_size_bytes = static_cast<std::size_t>(buffer_bytes);
    layout.pool.allow_unlocked = true;
    layout.pinned_bytes = buffers * align_up(static_cast<std::size_t>(buffer_bytes), 4096);
    layout.end_partition = next;
    return layout;
}

Result<std::unique_ptr<PinnedPool>> create_optimizer_pool(const OptimizerStackLayout& layout,
                                                          io::Engine& engine, Device* near_device,
                                                          bool register_with_device) {
    PinnedPoolOptions po = layout.pool;
    po.near_device = near_device;
    ZINF_ASSIGN_OR_RETURN(auto pool, PinnedPool::create(po));
    const Status reg = pool->register_with(engine);
    if (!reg.is_ok()) log::debug(po.name, ": ", reg.to_string());
    if (register_with_device && near_device != nullptr) {
        // New parameters go from the pool's buffers to the GPU: pinned for the device, the
        // copies run at full speed without staging. Pageable still works.
        const Status pinned = pool->register_with_device(*near_device);
        if (!pinned.is_ok()) log::warning(po.name, ": ", pinned.to_string());
    }
    return pool;
}

Result<std::vector<std::unique_ptr<OptimizerSwapper>>> create_optimizer_swappers(
    const OptimizerStackLayout& layout, SwapStore& store, PinnedPool& pool,
    const kernels::OptimizerKernel& kernel) {
    std::vector<std::unique_ptr<OptimizerSwapper>> swappers;
    for (const OptimizerSwapperOptions& o : layout.swappers) {
        ZINF_ASSIGN_OR_RETURN(auto s, OptimizerSwapper::create(store, pool, kernel, o));
        swappers.push_back(std::move(s));
    }
    return swappers;
}

}  // namespace zinf::swap
