// OptimizerSwapper: the optimizer step for NVMe-resident optimizer states. The fp32 master
// parameters and the optimizer's states are split into sub-groups of `sub_group_size`
// parameters; each sub-group is one run of consecutive partitions in the swap store (the
// master, then the optimizer's moments), so it moves in one read and one write. The step streams
// over the sub-groups through pinned pool buffers: read group i+1, update group i with the kernels/
// optimizer, write group i-1 (`pipeline_read` / `pipeline_write` of the `offload_optimizer` config
// turn each overlap on). The step is I/O-bound by design; the update runs hidden under the
// transfers.
//
// Speculation (copy-on-write stores): speculate() runs the same step but writes every sub-group
// to its shadow extents, so the states the step started from stay intact on disk. Then
// commit_speculation() makes the new states current at once, or discard_speculation() forgets
// them: a step taken with a guessed clipping coefficient is undone by reading the old bytes
// again, never by an arithmetic inverse, so a redo is bitwise the step taken directly. On such a
// store step() is speculate() and commit in one: the states alternate between the two extents,
// so a snapshot (pin_states) stays readable, by another thread, while the next step runs.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/optimizer.h"
#include "swap/pinned_pool.h"
#include "swap/swap_store.h"
#include "swap/tensor_swapper.h"

namespace zinf::swap {

struct OptimizerSwapperOptions {
    std::uint64_t numel = 0;            // parameters handled by this swapper
    std::uint64_t sub_group_numel = 0;  // `zero_optimization.sub_group_size`
    kernels::OptimizerKind kind = kernels::OptimizerKind::kAdamW;
    bool amsgrad = false;        // Adam, AdamW: a fourth state, the running maximum of exp_avg_sq
    bool pipeline_read = true;   // `offload_optimizer.pipeline_read`
    bool pipeline_write = true;  // `offload_optimizer.pipeline_write`
    // With pipeline_read: how many sub-groups are read ahead of the one being updated
    // (`swap.optimizer_read_ahead`), each in a pool buffer of its own. Deeper read-ahead lets
    // the step beside backward read states while it waits for gradients.
    std::size_t read_ahead = 1;
    // Partition ids [first_partition, first_partition + sub_group_count × state_count) are used.
    PartitionId first_partition = 0;
    std::chrono::milliseconds acquire_timeout{std::chrono::minutes(2)};
    // How the moments are stored (offload_optimizer.state_dtype; the master stays fp32). bf16 and
    // int8 need sub_group_numel a multiple of kStateBlockNumel.
    StateDType state_dtype = StateDType::kFp32;
    // Compressed states: the swapper's elements cut into runs of consecutive global flat indices
    // (kernels::step_segments); empty: element i has global index i.
    std::vector<kernels::StateSegment> segments;
    std::uint64_t rounding_seed = 0;  // the stochastic rounding's seed (bf16, int8)
};

// Where the step gets each sub-group's gradients (and, optionally, gives back the result).
// Called on the thread running step(), once per sub-group, in order; virtual calls are per
// sub-group, never per element.
class GradientSource {
public:
    virtual ~GradientSource() = default;
    // The gradients of parameters [offset_numel, offset_numel + numel) (sub-group `sub_group`):
    // fp32, bf16 or fp16, exactly numel of them, valid until the next call or the step's end.
    virtual Result<kernels::GradView> gradients(std::size_t sub_group, std::uint64_t offset_numel,
                                                std::uint64_t numel) = 0;
    // Where to write a bf16/fp16 copy of the updated parameters in the same pass (optional).
    virtual kernels::ParamCopy param_copy(std::size_t /*sub_group*/, std::uint64_t /*offset_numel*/,
                                          std::uint64_t /*numel*/) {
        return kernels::ParamCopy::none();
    }
    // Sees the updated fp32 parameters before they are written out (optional). An error stops
    // the step before this sub-group's states are written back (they stay as before the step).
    virtual Status updated(std::size_t /*sub_group*/, std::uint64_t /*offset_numel*/,
                           std::span<const float> /*params*/) {
        return Status::ok();
    }
};

// When a speculated step taken beside backward may update a sub-group (the overlapped step of
// swap.overlap_step): called on the stepping thread before each sub-group's update, after its
// states were read and the next sub-group's read was issued.
class SubGroupGate {
public:
    virtual ~SubGroupGate() = default;
    // Blocks until sub-group `sub_group`'s gradients are final. An error abandons the step (its
    // shadows are discarded; the states stay those from before it).
    virtual Status ready(std::size_t sub_group) = 0;
};

// Fills the initial master parameters of one sub-group (initialize()).
class ParamSource {
public:
    virtual ~ParamSource() = default;
    virtual Status fill(std::size_t sub_group, std::uint64_t offset_numel,
                        std::span<float> params) = 0;
};

struct OptimizerStepStats {
    double seconds = 0;            // the whole step
    double compute_seconds = 0;    // inside the optimizer kernel
    double read_wait_seconds = 0;  // blocked waiting for reads (including checksum verification)
    double write_wait_seconds = 0;
    std::uint64_t bytes_read = 0;
    std::uint64_t bytes_written = 0;
};

class OptimizerSwapper {
public:
    // Reserves the sub-groups' partitions in `store`, which must not be committed yet (the
    // caller commits it after every user has reserved). Borrows store, pool and kernel, which
    // outlive the swapper. Errors: kInvalidArgument (zero sizes; a pool whose buffers are
    // smaller than buffer_size_bytes() or fewer than buffers_needed(); read_ahead outside [1,
    // kMaxReadAhead]), the store's reserve errors. Init only: allocates.
    static Result<std::unique_ptr<OptimizerSwapper>> create(SwapStore& store, PinnedPool& pool,
                                                            const kernels::OptimizerKernel& kernel,
                                                            const OptimizerSwapperOptions& options);

    // The pool buffer size one sub-group needs, and how many buffers a step holds at once.
    static std::uint64_t buffer_size_bytes(std::uint64_t sub_group_numel,
                                           kernels::OptimizerKind kind, bool amsgrad = false,
                                           StateDType state_dtype = StateDType::kFp32);
    // The bytes of state `state` (0 the master, then the moments) of a sub-group of `numel`
    // elements in the swap store: fp32 for the master, the stored layout for the moments.
    static std::uint64_t state_bytes(std::size_t state, std::uint64_t numel,
                                     StateDType state_dtype) noexcept;
    static std::size_t buffers_needed(const OptimizerSwapperOptions& options);
    // 1 + the moments the optimizer keeps (its descriptor's): 3 for Adam/AdamW (4 with
    // amsgrad), 2 for Adagrad and Lion. In a sub-group: the master, then the moments in the
    // descriptor's order.
    static std::size_t state_count(kernels::OptimizerKind kind, bool amsgrad = false);
    static constexpr std::size_t kMaxStates = 1 + kMaxMoments;
    static constexpr std::size_t kMaxReadAhead = 8;

    // Writes the initial master parameters (from `source`) and zeroed states of every
    // sub-group, overlapping the writes. Blocks until all are on disk.
    Status initialize(ParamSource& source);

    // One optimizer step over all sub-groups with `params` (params.kind must match the
    // options; params.step is the 1-based step number). Blocks until every sub-group is
    // written. Allocates nothing. Errors: the gradient source's, the kernel's
    // kInvalidArgument (nothing changed), I/O errors, kCorruption from a verified read; after
    // an I/O error the sub-groups already written hold the new step and the failed one holds
    // no valid copy, so the caller restores a checkpoint.
    Status step(const kernels::OptimizerParams& params, GradientSource& grads);
    // The same step, written to the shadow extents (the store must be copy-on-write:
    // kInvalidArgument otherwise). The states read stay the current ones until
    // commit_speculation(); read_sub_group() still returns them. On any error the shadows are
    // discarded and every sub-group keeps the state from before the step. The gradient source
    // sees the new parameters (updated, param_copy) as in step(): after a discard the caller
    // republishes them.
    Status speculate(const kernels::OptimizerParams& params, GradientSource& grads);
    // The same over the sub-groups in `order` (a permutation of [0, sub_group_count()): the
    // reads follow it ahead of the updates), each updated only once `gate` lets it: the step
    // taken beside backward, whose gradients become final layer by layer from the last. The
    // result is bitwise that of speculate(params, grads). kInvalidArgument for an order that is
    // not a permutation (nothing read).
    Status speculate(const kernels::OptimizerParams& params, GradientSource& grads,
                     std::span<const std::uint32_t> order, SubGroupGate& gate);
    // Makes the speculated states current (all sub-groups or, on kIo, none).
    Status commit_speculation();
    // Forgets the speculated states: the next step starts from the ones before speculate().
    void discard_speculation();
    bool speculating() const noexcept { return speculating_; }

    // Snapshots (copy-on-write stores): pins every sub-group's current states (see
    // SwapStore::pin). read_pinned_sub_group() then reads a sub-group's pinned states from any
    // thread, beside steps on this one, into `scratch` (resized to pinned_read_bytes()), and
    // unpin_sub_group() releases it: a step that would overwrite a pinned sub-group waits for
    // that. Errors: kInvalidArgument without copy-on-write; the store's read errors.
    Status pin_states();
    Status read_pinned_sub_group(std::size_t sub_group, std::span<float> params,
                                 std::span<const std::span<float>> moments,
                                 AlignedBuffer& scratch) const;
    void unpin_sub_group(std::size_t sub_group);
    std::uint64_t pinned_read_bytes(std::size_t sub_group) const;
    // The same reads and writes in the same pattern without the optimizer: the I/O-bound limit
    // the step is measured against (zinfinity-bench optimizer). Leaves the states unchanged.
    Status io_only_pass();

    // Reads one sub-group's master parameters and moments (tests, checkpoints): `moments` holds
    // the kept moments in the optimizer descriptor's order, as many as the caller wants (at
    // most the kept ones); an empty span skips that moment. Blocks.
    Status read_sub_group(std::size_t sub_group, std::span<float> params,
                          std::span<const std::span<float>> moments);

    // Writes one sub-group's master parameters and moments (checkpoint load); the same shapes
    // as read_sub_group (a missing or empty moment span writes zeros). Blocks until it is on
    // disk.
    Status write_sub_group(std::size_t sub_group, std::span<const float> params,
                           std::span<const std::span<const float>> moments);

    std::size_t sub_group_count() const noexcept { return sub_group_count_; }
    std::uint64_t sub_group_numel(std::size_t sub_group) const noexcept;
    std::uint64_t sub_group_offset_numel(std::size_t sub_group) const noexcept {
        return sub_group * options_.sub_group_numel;
    }
    const OptimizerStepStats& last_step_stats() const noexcept { return stats_; }
    const OptimizerSwapperOptions& options() const noexcept { return options_; }
    const SwapStore& store() const noexcept { return store_; }

private:
    OptimizerSwapper(SwapStore& store, const kernels::OptimizerKernel& kernel,
                     const OptimizerSwapperOptions& options);
    Status run(const kernels::OptimizerParams* params, GradientSource* grads,
               WriteTarget target = WriteTarget::kCurrent,
               std::span<const std::uint32_t> order = {}, SubGroupGate* gate = nullptr);
    Status check_params(const kernels::OptimizerParams& params) const;
    std::size_t partition_count() const noexcept { return sub_group_count_ * state_count_; }
    Status issue_read(std::size_t sub_group, SwapTicket& ticket);
    Status update(std::size_t sub_group, SwapTicket& ticket, const kernels::OptimizerParams& params,
                  GradientSource& grads);
    PartitionId partition(std::size_t sub_group, std::size_t state) const noexcept {
        return options_.first_partition +
               static_cast<PartitionId>(sub_group * state_count_ + state);
    }
    void drain() noexcept;

    SwapStore& store_;
    const kernels::OptimizerKernel& kernel_;
    OptimizerSwapperOptions options_;
    std::size_t state_count_ = 0;
    std::size_t sub_group_count_ = 0;
    std::size_t ticket_count_ = 1;  // buffers_needed(): tickets_ holds that many
    bool speculating_ = false;      // shadows written by speculate(), not yet committed
    std::unique_ptr<TensorSwapper> swapper_;
    std::unique_ptr<SwapTicket[]> tickets_;
    OptimizerStepStats stats_;
};

}  // namespace zinf::swap
