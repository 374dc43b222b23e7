// StateStore: the fp32 master parameters and optimizer moments of one rank's optimizer domain,
// wherever the plan puts them — device memory, host memory or NVMe (through
// swap::OptimizerSwapper) — behind one interface: initialise, step over every sub-group, and
// read or write the states chunk by chunk (checkpoints, tests). The engine has one code path
// over it. OptimizerIo is the other half of a step: where the gradients are read and where the
// new parameters go, chosen once from the plan.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/optimizer.h"
#include "src/base/aligned.h"
#include "src/base/device.h"
#include "src/base/device_buffer.h"
#include "src/base/optimizer_descriptor.h"
#include "src/base/status.h"
#include "src/engine/gradient_swap.h"
#include "src/engine/offload_plan.h"
#include "swap/optimizer_swapper.h"
#include "zero/parameter_coordinator.h"

namespace zinf::engine {

// The states of elements [offset, offset + master.size()) of the domain: the fp32 master and the
// kept moments in the optimizer descriptor's order; the spans past the kept ones are empty.
struct StateChunk {
    std::span<float> master;
    std::array<std::span<float>, kMaxMoments> moments{};
};
struct ConstStateChunk {
    std::span<const float> master;
    std::array<std::span<const float>, kMaxMoments> moments{};
};

// Which fp32 arrays the optimizer keeps besides the master: its descriptor's moments, the
// amsgrad-only ones only with amsgrad (Adam/AdamW exp_avg and exp_avg_sq, and max_exp_avg_sq with
// amsgrad; Adagrad its running sum; Lion exp_avg).
struct StateLayout {
    const OptimizerDescriptor* optimizer = nullptr;
    std::size_t moment_count = 0;  // kept
    static StateLayout of(const kernels::OptimizerParams& params) noexcept;
    // The i-th kept moment (< moment_count).
    const MomentDescriptor& moment(std::size_t i) const noexcept;
    std::size_t arrays() const noexcept { return 1 + moment_count; }
};

// Host buffers of one chunk of every state the layout keeps (checkpoints, tests).
class ChunkBuffers {
public:
    ChunkBuffers(const StateLayout& layout, std::size_t chunk_numel) : master_(chunk_numel) {
        for (std::size_t i = 0; i < layout.moment_count; ++i) moments_[i].resize(chunk_numel);
    }
    // Spans of `numel` elements (none for a state not kept).
    StateChunk chunk(std::size_t numel) {
        StateChunk c;
        c.master = std::span<float>(master_.data(), numel);
        for (std::size_t i = 0; i < kMaxMoments; ++i) {
            if (!moments_[i].empty()) c.moments[i] = std::span<float>(moments_[i].data(), numel);
        }
        return c;
    }

private:
    std::vector<float> master_;
    std::array<std::vector<float>, kMaxMoments> moments_;
};

// The const view of a chunk (for write_chunk).
ConstStateChunk as_const(const StateChunk& c) noexcept;

class StateStore {
public:
    virtual ~StateStore() = default;

    virtual Home home() const noexcept = 0;
    std::size_t numel() const noexcept { return numel_; }
    // The unit of a step and of chunked reads and writes: chunk k holds elements
    // [k * chunk_numel(), min((k + 1) * chunk_numel(), numel())).
    std::size_t chunk_numel() const noexcept { return chunk_numel_; }
    std::size_t chunk_count() const noexcept {
        return chunk_numel_ == 0 ? 0 : (numel_ + chunk_numel_ - 1) / chunk_numel_;
    }
    // The elements of chunk k.
    std::size_t chunk_length(std::size_t k) const noexcept;
    const StateLayout& layout() const noexcept { return layout_; }
    // How the moments are stored (offload_optimizer.state_dtype). read_chunk and write_chunk
    // convert from and to fp32: bf16 and int8 values survive a round trip bit for bit.
    StateDType state_dtype() const noexcept { return dtype_; }
    // Bytes of states held (in the store's home).
    std::uint64_t state_bytes() const noexcept;

    // Master values from `initial` (chunk by chunk), moments zero. Blocks until stored.
    virtual Status initialize(swap::ParamSource& initial) = 0;
    // One optimizer step over every chunk in order: gradients from `io`, new parameters handed
    // to `io` after each chunk. params.kind and amsgrad must be the store's. Errors: the kernel's
    // kInvalidArgument (nothing changed), `io`'s, the NVMe store's I/O errors (naming the
    // partition); after an error the chunks already stepped keep the new values, so the caller
    // restores a checkpoint before stepping again.
    virtual Status step(const kernels::OptimizerParams& params, swap::GradientSource& io) = 0;
    // Copies chunk k's states out (`out` spans of chunk_length(k), moments empty when not
    // kept) or in. Block. Errors: the NVMe store's I/O errors and kCorruption.
    virtual Status read_chunk(std::size_t k, const StateChunk& out) = 0;
    virtual Status write_chunk(std::size_t k, const ConstStateChunk& in) = 0;
    // The reads and writes of a step without its compute (NVMe only; nothing elsewhere).
    virtual Status io_only_pass() { return Status::ok(); }
    // Seconds the last step waited for reads (NVMe only).
    virtual double last_read_wait_seconds() const noexcept { return 0.0; }

    // Snapshots (NVMe on a copy-on-write store): pin_snapshot() holds every chunk's states as
    // they are now; read_snapshot_chunk() reads chunk k of it from another thread while steps go
    // on (a step waits only for a chunk still pinned where it would write), and
    // release_snapshot_chunk() lets go of it. `scratch` is the reading thread's buffer.
    virtual bool snapshots() const noexcept { return false; }
    virtual Status pin_snapshot() {
        return Status::not_supported(
            "state snapshots need optimizer states on a copy-on-write "
            "NVMe store (swap.background_checkpoint)");
    }
    virtual Status read_snapshot_chunk(std::size_t /*k*/, const StateChunk& /*out*/,
                                       AlignedBuffer& /*scratch*/) const {
        return Status::not_supported("no state snapshot");
    }
    virtual void release_snapshot_chunk(std::size_t /*k*/) {}
    // Seconds steps have waited for pinned chunks, in all.
    virtual double snapshot_wait_seconds() const noexcept { return 0.0; }

protected:
    StateStore(std::size_t numel, std::size_t chunk_numel, StateLayout layout,
               StateDType dtype) noexcept
        : numel_(numel), chunk_numel_(chunk_numel), layout_(layout), dtype_(dtype) {}
    // Asserts that each span of a chunk has chunk_length(k) elements, or none when not kept.
    template <typename Chunk>
    void check_chunk(std::size_t k, const Chunk& c) const;

private:
    std::size_t numel_;
    std::size_t chunk_numel_;
    StateLayout layout_;
    StateDType dtype_;
};

// Bytes of state array i (0 the fp32 master, then the kept moments as plan.state_dtype stores
// them) in a device or host store: what they allocate and the memory prediction counts.
std::uint64_t in_memory_state_bytes(const OffloadPlan& plan, std::size_t i) noexcept;

// The store the plan asks for: device memory (plan.optimizer_states kDevice; a host-addressable
// device), host memory (kHost) or NVMe (kNvme: `swapper`, borrowed, must be non-null). `device`
// and `kernel` are borrowed for the store's life. Allocates every state now (zeroed).
// Errors: kNoSpace from the device budget or the host allocation.
Result<std::unique_ptr<StateStore>> make_state_store(const OffloadPlan& plan, Device& device,
                                                     const kernels::OptimizerKernel& kernel,
                                                     swap::OptimizerSwapper* swapper);

// Where a step reads the gradients and where the new parameters go, as the plan says: the
// domain's gradients in place or a host copy of them (gradients_copied_to_host, refreshed by
// prepare()); the new parameters written by the kernel in place, copied from the master, or
// handed to the coordinator through a host staging buffer (plan.parameter_update).
class OptimizerIo final : public swap::GradientSource {
public:
    // Allocates the host copy of the gradients and the 16-bit staging buffer when the plan
    // needs them. `coordinator` and `device` are borrowed for the object's life.
    // `streamed` (borrowed; null unless the plan streams the gradients) supplies them instead.
    static Result<std::unique_ptr<OptimizerIo>> create(const OffloadPlan& plan,
                                                       zero::ParameterCoordinator& coordinator,
                                                       Device& device,
                                                       GradientSwap* streamed = nullptr);

    // Makes the gradients readable by the CPU optimizer (copies them to host memory when the
    // plan says so) and returns where they are. Blocks until copied.
    Result<const std::byte*> prepare(StreamId stream);
    // The gradients prepare() made readable, for the norm.
    const std::byte* gradients() const noexcept { return grads_; }

    Result<kernels::GradView> gradients(std::size_t sub_group, std::uint64_t offset_numel,
                                        std::uint64_t numel) override;
    kernels::ParamCopy param_copy(std::size_t sub_group, std::uint64_t offset_numel,
                                  std::uint64_t numel) override;
    Status updated(std::size_t sub_group, std::uint64_t offset_numel,
                   std::span<const float> params) override;

    // New parameters of domain elements [offset_numel, offset_numel + bytes / dtype size), in
    // the parameters' dtype, to where the next forward reads them (the step beside backward,
    // swap.overlap_step, held them until its commit). Blocks until copied. `staged`:
    // parameters on NVMe are staged instead: the next forward copies each from `bytes` as it
    // reads it and writes it to NVMe beside its compute, rather than this call writing them all
    // before the forward reads them back (ParameterCoordinator::write_domain_parameters).
    // `bytes` then stays unchanged until ParameterCoordinator::take_staged_parameters().
    Status store_parameters(std::uint64_t offset_numel, std::span<const std::byte> bytes,
                            StreamId stream, bool staged = false);

    // Host bytes held (the gradient copy and the staging buffer).
    std::size_t host_bytes() const noexcept { return host_grads_.size() + staging_.size(); }

private:
    OptimizerIo(const OffloadPlan& plan, zero::ParameterCoordinator& coordinator, Device& device);

    zero::ParameterCoordinator& coordinator_;
    Device& device_;
    DType dtype_;
    ParameterUpdate update_;
    bool copy_gradients_;
    bool master_persists_;      // the stepped master stays in memory (not the NVMe store's buffer)
    AlignedBuffer host_grads_;  // the domain's gradients, when copied to host memory
    AlignedBuffer staging_;     // one chunk of new 16-bit parameters (kThroughCoordinator)
    const std::byte* grads_ = nullptr;
    GradientSwap* streamed_ = nullptr;
};

}  // namespace zinf::engine
