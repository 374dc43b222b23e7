// Offload resources of an Engine, built from `zero_optimization.offload_param` /
// `offload_optimizer`: the I/O engine and swap store(s) over the `nvme_path`s, the parameter
// partitions' storage (pageable host memory for "cpu"; the tiered residency manager over the swap
// store for "nvme") and the NVMe optimizer swapper with its pinned pool. One SwapStore per set of
// paths: when both sections name the same paths they share one store (one run directory, one
// lock), parameters as partitions [0, P), optimizer sub-groups after them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/engine.h"
#include "kernels/optimizer.h"
#include "src/base/aligned.h"
#include "src/base/config.h"
#include "src/base/device.h"
#include "src/base/dtype.h"
#include "src/base/status.h"
#include "src/engine/offload_plan.h"
#include "src/engine/trace.h"
#include "src/tier/residency_manager.h"
#include "src/tier/store_mover.h"
#include "swap/optimizer_swapper.h"
#include "swap/pinned_pool.h"
#include "swap/swap_store.h"
#include "zero/partition.h"
#include "zero/partition_storage.h"

namespace zinf::engine {

// The nvme_path directories of the config's NVMe sections: with `create`, made when missing (as
// DeepSpeed does), then checked to be writable directories no other user controls
// (io::check_trusted_directory); without it, a missing one's nearest existing ancestor is checked
// and nothing is made. The engine calls it without `create` first (before planning), and with it
// once admission has passed, so that a refused config leaves no directory behind. Errors name the
// key: kNotFound / kIo / kInvalidArgument.
Status check_swap_directories(const config::EngineConfig& config, bool create = true);

// The config rank `rank` of several runs with: every nvme_path (both offload sections and the
// activation checkpoints, every stripe) becomes its subdirectory "rank<rank>", so that one config
// serves all ranks and no two ranks share a swap directory or its lock.
config::EngineConfig with_rank_swap_paths(const config::EngineConfig& config, int rank);

// offload_param "cpu": every slice in one pageable host buffer, registered with the (CPU) device
// so that its copies read the slices in place.
class HostPartitionStorage final : public zero::PartitionStorage {
public:
    static Result<std::unique_ptr<HostPartitionStorage>> create(const zero::Partitioning& part,
                                                                DType dtype, Device& device);
    ~HostPartitionStorage() override;
    Result<const void*> begin_read(std::size_t index, StreamId stream) override;
    Status end_read(std::size_t index, StreamId stream) override;
    Status write(std::size_t index, std::size_t offset_bytes,
                 std::span<const std::byte> bytes) override;
    Status read(std::size_t index, std::size_t offset_bytes, std::span<std::byte> bytes) override;
    std::size_t bytes() const noexcept { return buffer_.size(); }

private:
    HostPartitionStorage(const zero::Partitioning& part, DType dtype, Device& device)
        : part_(part), dtype_(dtype), device_(device) {}
    std::byte* slice(std::size_t index, std::size_t offset_bytes, std::size_t length) const;

    zero::Partitioning part_;
    DType dtype_;
    Device& device_;
    AlignedBuffer buffer_;
};

// offload_param "nvme": each slice is a partition of the residency manager (ids = parameter
// indices), moved NVMe → pinned host → device budget through the swap store, prefetched along
// the first micro-step's trace and evicted by Belady.
class TieredPartitionStorage final : public zero::PartitionStorage {
public:
    // `residency`, `store` and `device` are borrowed. Every slice must be written once, whole,
    // before it is read (the coordinator's initialize does): those first writes go straight to
    // the store.
    TieredPartitionStorage(tier::ResidencyManager& residency, swap::SwapStore& store,
                           Device& device, const zero::Partitioning& part, DType dtype,
                           AlignedBuffer staging);
    Result<const void*> begin_read(std::size_t index, StreamId stream) override;
    Status end_read(std::size_t index, StreamId stream) override;
    Status write(std::size_t index, std::size_t offset_bytes,
                 std::span<const std::byte> bytes) override;
    Status read(std::size_t index, std::size_t offset_bytes, std::span<std::byte> bytes) override;
    // Whole slices after their first write: ResidencyManager::stage_overwrite (the next read
    // copies them, the write to NVMe follows beside it).
    Status write_staged(std::size_t index, std::span<const std::byte> bytes) override;
    Status take_staged() override { return residency_.take_staged(); }
    void begin_iteration() override { residency_.begin_iteration(); }
    void end_iteration() override { residency_.end_iteration(); }
    // One iteration of the recorded access trace without compute: every access acquired and
    // released clean, in order (the I/O of a step's parameter reads). Nothing without a trace.
    Status replay_trace();

private:
    std::size_t slice_bytes(std::size_t index) const {
        return part_.slot(index).slice_numel * dtype_size_bytes(dtype_);
    }

    tier::ResidencyManager& residency_;
    swap::SwapStore& store_;
    Device& device_;
    zero::Partitioning part_;
    DType dtype_;
    AlignedBuffer staging_;      // first writes: one slice, aligned for O_DIRECT
    std::vector<bool> written_;  // a first whole write reached the store
};

// I/O figures of the offloaded states, cumulative.
struct OffloadFigures {
    std::uint64_t bytes_read = 0;
    std::uint64_t bytes_written = 0;
    double stall_seconds = 0;  // compute waiting for parameters, optimizer waiting for reads
    std::uint64_t faults_injected = 0;
};

class Offload {
public:
    // Builds what the plan places on the host or on NVMe (sized there): the I/O engine, the swap
    // store(s) (whose run directories check their base again), the optimizer swapper with its
    // pinned pool, and the parameter tiers.
    // `part`: the rank's partitioning; `kernel` is borrowed for the offload's life. Errors:
    // kInvalidArgument naming the key (an unusable directory), kNoSpace (disk), kBusy (another
    // run holds an nvme_path), the I/O engine's.
    static Result<std::unique_ptr<Offload>> create(const OffloadPlan& plan,
                                                   const zero::Partitioning& part,
                                                   const kernels::OptimizerKernel& kernel,
                                                   Device& device);
    ~Offload();
    Offload(const Offload&) = delete;
    Offload& operator=(const Offload&) = delete;

    // The parameter storage for the coordinator (null: parameters on the device).
    zero::PartitionStorage* parameters() noexcept { return parameters_.get(); }
    // The NVMe optimizer (null unless offload_optimizer is "nvme").
    swap::OptimizerSwapper* optimizer() noexcept { return optimizer_.get(); }
    // The optimizer states' swap store (also the streamed gradients'); null without NVMe states.
    swap::SwapStore* optimizer_store() noexcept { return optimizer_store_; }
    tier::ResidencyManager* residency() noexcept { return residency_.get(); }
    // The NVMe parameter storage (null unless offload_param is "nvme").
    TieredPartitionStorage* tiered_parameters() noexcept { return tiered_; }

    OffloadFigures figures() const;
    // io::Engine::set_discard on the offload's I/O engine, and the operations it discarded.
    void set_io_discard(bool on) noexcept;
    std::uint64_t io_ops_discarded() const;
    // Parameter moves (demand and prefetch) go to `recorder` as spans (borrowed; null: none).
    void set_trace(TraceRecorder* recorder);
    // Lines for the engine's start-up summary (what the plan does not say: the I/O backend).
    std::string summary() const;
    std::size_t pinned_bytes() const noexcept;

private:
    class MoveTrace;
    Offload() = default;
    Status open_stores(const OffloadPlan& plan, const zero::Partitioning& part,
                       const kernels::OptimizerKernel& kernel, Device& device);
    Status build_parameter_tiers(const OffloadPlan& plan, const zero::Partitioning& part,
                                 Device& device);

    // Declaration order is teardown order reversed: memory registered with the I/O engine
    // outlives it; stores outlive their users.
    std::unique_ptr<swap::PinnedPool> host_tier_;  // the residency manager's host tier
    std::unique_ptr<swap::PinnedPool> optimizer_pool_;
    std::unique_ptr<io::Engine> io_;
    std::unique_ptr<swap::SwapStore> param_store_;
    std::unique_ptr<swap::SwapStore> optimizer_store_own_;  // when its paths differ
    swap::SwapStore* optimizer_store_ = nullptr;
    std::unique_ptr<tier::StoreMover> mover_;
    std::unique_ptr<tier::ResidencyManager> residency_;
    std::unique_ptr<zero::PartitionStorage> parameters_;
    std::unique_ptr<swap::OptimizerSwapper> optimizer_;
    std::unique_ptr<MoveTrace> move_trace_;
    TieredPartitionStorage* tiered_ = nullptr;  // parameters_, when it is the tiered storage
};

}  // namespace zinf::engine
