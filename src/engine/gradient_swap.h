// GradientSwap: the optimizer domain's gradients streamed to NVMe (optimizer offload to NVMe,
// stages 2-3, CPU device), so that host memory holds a few buffers instead of the whole
// gradient partition (2 or 4 bytes per parameter).
//
// Backward: ParameterCoordinator hands each reduced parameter slice to store() (a
// zero::GradientStorage); the slice is copied into one of four write buffers and written to its
// partition of the optimizer's swap store, while backward goes on. A second gradient of the same
// parameter in the window (gradient accumulation) reads the partition back and adds, rounding as
// the coordinator does in memory. In the window's last micro-step the parameter's partial sum of
// squares is taken from the final slice, in exactly the chunks Engine::gradient_stats uses, so
// the norm (and clipping) is bitwise what it is with the gradients in memory.
//
// Step: as a swap::GradientSource, it gives the optimizer each sub-group's gradients: the runs
// of partitions the sub-group covers are read into a staging buffer and compacted into a
// contiguous view (parameters without a gradient in the window read as zeros, with no I/O), and
// the next sub-group is read while the optimizer works on this one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/optimizer.h"
#include "src/base/aligned.h"
#include "src/base/device.h"
#include "src/base/dtype.h"
#include "src/base/status.h"
#include "swap/swap_store.h"
#include "zero/gradient_storage.h"
#include "zero/partition.h"

namespace zinf::engine {

// The first partition id of the gradients in the optimizer's swap store (parameters use ids from
// 0, the optimizer's sub-groups from their own base).
inline constexpr swap::PartitionId kGradientPartitionBase = 0x60000000u;
// The norm's chunk (Engine::gradient_stats sums each parameter slice in chunks of this many).
inline constexpr std::size_t kNormChunkNumel = std::size_t{1} << 18;

// Reserves partition kGradientPartitionBase + i of slice_numel(i) x dtype bytes for every
// parameter slice of `part` in `store` (before its commit).
Status reserve_gradient_partitions(swap::SwapStore& store, const zero::Partitioning& part,
                                   DType dtype);

class GradientSwap final : public zero::GradientStorage {
public:
    // `store` (committed, partitions reserved by reserve_gradient_partitions), `device` and
    // `kernel` are borrowed and outlive the swap. Allocates the buffers (their bytes:
    // host_bytes()). Stages 2-3 of one rank's partition layout.
    static Result<std::unique_ptr<GradientSwap>> create(swap::SwapStore& store,
                                                        const zero::Partitioning& part, DType dtype,
                                                        std::size_t sub_group_numel, Device& device,
                                                        const kernels::OptimizerKernel& kernel);
    ~GradientSwap() override;
    GradientSwap(const GradientSwap&) = delete;
    GradientSwap& operator=(const GradientSwap&) = delete;

    // Whether the coming backward is the window's last micro-step (its slices are final).
    void set_final_micro_step(bool final) noexcept { final_ = final; }

    // ---- zero::GradientStorage ----
    Status store(std::size_t index, const void* slice, std::size_t numel, bool first,
                 StreamId stream) override;
    Status end_window(StreamId stream) override;

    // After end_window: parameter i's sum of squares (chunks of kNormChunkNumel from the slice
    // start, summed in order, as Engine::gradient_stats does) and whether it had an inf or NaN.
    double partial(std::size_t i) const noexcept { return partials_[i]; }
    std::size_t nonfinite_chunks(std::size_t i) const noexcept { return nonfinite_[i]; }

    // The sub-group [offset_numel, offset_numel + numel) of the domain, contiguous, in the
    // dtype; valid until the next call. Starts reading the following sub-group.
    Result<std::span<const std::byte>> gradients(std::uint64_t offset_numel, std::uint64_t numel);

    // The gradients' I/O of one window of `micro_steps` without its compute (zinfinity-train
    // --measure-overlap): per micro-step, every partition stored in the last window is read and
    // written back with the same bytes. As many reads and writes as training does (backward
    // writes each micro-step, reads back to accumulate in all but the first, and the optimizer
    // reads once); nothing changes on disk. Not counted in bytes_read/bytes_written, but in
    // io_only_bytes_read/io_only_bytes_written (the partitions' bytes).
    Status io_only_pass(std::uint64_t micro_steps);
    std::uint64_t io_only_bytes_read() const noexcept { return io_only_bytes_read_; }
    std::uint64_t io_only_bytes_written() const noexcept { return io_only_bytes_written_; }

    std::size_t host_bytes() const noexcept { return host_bytes_; }
    std::uint64_t bytes_written() const noexcept { return bytes_written_; }
    std::uint64_t bytes_read() const noexcept { return bytes_read_; }
    // Stores that added to a stored sum, and those whose sum the read-ahead had brought in.
    std::uint64_t accumulations() const noexcept { return accumulations_; }
    std::uint64_t read_ahead_hits() const noexcept { return read_ahead_hits_; }

private:
    enum class OnDisk : std::uint8_t { kNothing, kStored };
    struct WriteSlot {
        AlignedBuffer buffer;
        swap::SwapHandle handle;
        std::size_t param = 0;
    };
    // One sub-group being read: its runs' handles, the staging buffer the runs land in, and
    // the contiguous copy handed to the optimizer.
    struct ReadSlot {
        AlignedBuffer staging;
        AlignedBuffer contiguous;
        std::unique_ptr<swap::SwapHandle[]> handles;
        std::size_t handles_used = 0;
        bool holds = false;
        std::uint64_t offset_numel = 0;
        std::uint64_t numel = 0;
        std::size_t first_param = 0;
        std::size_t last_param = 0;
    };

    GradientSwap(swap::SwapStore& store, const zero::Partitioning& part, DType dtype,
                 std::size_t sub_group_numel, Device& device,
                 const kernels::OptimizerKernel& kernel);
    swap::PartitionId partition(std::size_t i) const noexcept {
        return kGradientPartitionBase + static_cast<swap::PartitionId>(i);
    }
    std::size_t slice_bytes(std::size_t i) const noexcept;
    // The parameters whose slices overlap [offset, offset + numel) of the domain.
    void covering(std::uint64_t offset, std::uint64_t numel, std::size_t& first,
                  std::size_t& last) const noexcept;
    void take_partial(std::size_t i, const std::byte* values);
    Status wait_writes();
    // Waits for parameter i's write in flight, if any: a partition is read back only after its
    // last write (the store marks it valid when waited).
    Status wait_write_of(std::size_t i);
    static constexpr std::size_t kAddChunk = 2048;
    // out = round(a + b) in the dtype; `out` may be `a`.
    void add_rounded(std::byte* out, const std::byte* a, const std::byte* b,
                     std::size_t numel) const;
    // Accumulation read-ahead (below): starts reading parameter i's stored sum into ahead_.
    Status start_ahead(std::size_t i);
    void drop_ahead() noexcept;
    void drop_reads() noexcept;
    Status start_read(ReadSlot& slot, std::uint64_t offset, std::uint64_t numel);
    Status finish_read(ReadSlot& slot);

    swap::SwapStore& store_;
    zero::Partitioning part_;  // a copy: the engine's is a local of its creation
    DType dtype_;
    std::size_t eb_;
    std::size_t sub_group_numel_;
    Device& device_;
    const kernels::OptimizerKernel& kernel_;
    std::vector<OnDisk> on_disk_;
    std::vector<bool> stored_;         // this window
    std::vector<bool> partial_taken_;  // this window
    std::vector<double> partials_;
    std::vector<std::size_t> nonfinite_;
    std::vector<WriteSlot> writes_;
    std::size_t next_write_ = 0;
    ReadSlot reads_[2];
    std::size_t next_read_ = 0;
    std::vector<swap::PartitionId> run_;  // start_read's current run of partitions
    bool final_ = true;
    // Accumulation read-ahead. Backward stores the slices in the same order every micro-step:
    // the window's first micro-step records it, and from the second on, while one slice is
    // added, the next one's stored sum is read into ahead_ (a wrong guess is dropped and read
    // synchronously, as without it).
    static constexpr std::size_t kNoParam = ~std::size_t{0};
    std::vector<std::size_t> order_;
    std::size_t position_ = 0;  // accumulating stores so far in the window
    AlignedBuffer ahead_;
    swap::SwapHandle ahead_handle_;
    std::size_t ahead_param_ = kNoParam;
    std::size_t host_bytes_ = 0;
    std::uint64_t bytes_written_ = 0;
    std::uint64_t bytes_read_ = 0;
    std::uint64_t io_only_bytes_read_ = 0;
    std::uint64_t io_only_bytes_written_ = 0;
    std::uint64_t accumulations_ = 0;
    std::uint64_t read_ahead_hits_ = 0;
};

}  // namespace zinf::engine
