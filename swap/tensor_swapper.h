// TensorSwapper: asynchronous swap-out and swap-in of partitions through pinned pool buffers.
// Partitions that are consecutive in the store's layout and fit one pool buffer together travel
// as one engine operation (many small partitions, one large I/O); sub-ranges of a partition
// can be read on their own. Each operation is carried by a SwapTicket the caller owns.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

#include "swap/pinned_pool.h"
#include "swap/swap_store.h"

namespace zinf::swap {

struct TensorSwapperOptions {
    // How long acquiring a pool buffer may wait before failing with kTimeout.
    std::chrono::milliseconds acquire_timeout{std::chrono::minutes(2)};
};

// One partition's bytes to swap out.
struct SwapOutItem {
    PartitionId partition = 0;
    std::span<const std::byte> data;  // exactly the partition's size
};

// A pool buffer and the operation on it. Owned by the caller; one thread uses a ticket at a
// time. Holds its buffer from the swap until release() (or destruction, which asserts that no
// operation is in flight), so the caller can read or update the data in place.
class SwapTicket {
public:
    SwapTicket() = default;
    ~SwapTicket() = default;  // SwapHandle asserts nothing is in flight; the buffer goes back
    SwapTicket(const SwapTicket&) = delete;
    SwapTicket& operator=(const SwapTicket&) = delete;

    bool done() const noexcept { return handle_.done(); }
    // Completes the operation (see SwapHandle::wait). The buffer stays held either way.
    Status wait() { return handle_.wait(); }
    // Blocks until the transfer is done without completing it (see SwapHandle).
    void wait_transfer() noexcept { handle_.wait_transfer(); }
    bool in_flight() const noexcept { return handle_.in_use(); }

    // The partitions carried, in layout order, and each one's bytes in the buffer. For a
    // sub-range read: one entry, the bytes asked for.
    std::size_t count() const noexcept { return count_; }
    PartitionId partition(std::size_t i) const noexcept;
    std::span<std::byte> data(std::size_t i) noexcept;
    bool holds_buffer() const noexcept { return buffer_.valid(); }
    // Returns the buffer to the pool. Precondition (asserted): not in flight.
    void release() noexcept;

private:
    friend class TensorSwapper;
    SwapHandle handle_;
    PinnedBuffer buffer_;
    std::uint32_t count_ = 0;
    bool range_ = false;
    std::array<PartitionId, kMaxRunPartitions> ids_{};
    std::array<std::uint64_t, kMaxRunPartitions> offsets_bytes_{};  // in the buffer
    std::array<std::uint64_t, kMaxRunPartitions> sizes_bytes_{};
};

class TensorSwapper {
public:
    // Borrows the store (committed before the first operation) and the pool; both outlive the
    // swapper. The pool's buffers should be registered with the store's engine
    // (PinnedPool::register_with).
    TensorSwapper(SwapStore& store, PinnedPool& pool, const TensorSwapperOptions& options = {});

    // Starts reading a run from the front of `partitions` into one pool buffer held by the
    // ticket (taken from the pool if the ticket holds none; waits up to acquire_timeout). The
    // run is the longest prefix whose partitions are consecutive in the layout and fit one
    // buffer; returns its length (>= 1); the caller continues with the rest on another ticket.
    // Errors: kInvalidArgument (a partition larger than a pool buffer: use swap_in_range),
    // kNotFound (unknown or not valid on disk), the pool's kBusy/kTimeout, engine errors.
    // Never allocates. Thread-safe with distinct tickets.
    Result<std::size_t> swap_in(std::span<const PartitionId> partitions, SwapTicket& ticket);
    // Copies the longest prefix of `items` that forms such a run into a pool buffer and starts
    // writing it; returns how many items it took. The caller's data may be reused at once.
    Result<std::size_t> swap_out(std::span<const SwapOutItem> items, SwapTicket& ticket);
    // Lays out the longest run from the front of `partitions` in a pool buffer held by the
    // ticket without any I/O, so the caller can fill ticket.data(i) in place and then call
    // write_back (zero-copy swap-out). Returns the run's length.
    Result<std::size_t> prepare(std::span<const PartitionId> partitions, SwapTicket& ticket);
    // Writes the ticket's partitions back from its buffer (after a completed swap_in whose data
    // the caller updated in place): no copy. Precondition: the ticket holds a completed
    // whole-partition swap-in or swap-out. kShadow: to the partitions' shadow extents
    // (copy-on-write stores; see SwapStore).
    Status write_back(SwapTicket& ticket, WriteTarget target = WriteTarget::kCurrent);
    // Reads bytes [offset_bytes, offset_bytes + length_bytes) of one partition; ticket.data(0)
    // is then exactly those bytes. kInvalidArgument when the (block-widened) range exceeds a
    // pool buffer.
    Status swap_in_range(PartitionId partition, std::uint64_t offset_bytes,
                         std::uint64_t length_bytes, SwapTicket& ticket);

    SwapStore& store() noexcept { return store_; }
    PinnedPool& pool() noexcept { return pool_; }

private:
    // How many of the `count` partitions get_id(0..) form one run from the front (>= 1).
    template <typename GetId>
    Result<std::size_t> plan_run(std::size_t count, GetId get_id) const;
    Status ensure_buffer(SwapTicket& ticket);

    SwapStore& store_;
    PinnedPool& pool_;
    TensorSwapperOptions options_;
};

}  // namespace zinf::swap
