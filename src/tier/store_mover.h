// StoreMover: a tier::Mover over a borrowed swap::SwapStore and a Device. Partitions moved to and
// from NVMe go through the store, so they get its guarantees: an XXH3 checksum per 64 KiB swap
// block, computed on the way out and verified on the way in; a locked per-run directory; files
// created exclusively with mode 0600; and a copy that counts as valid only once its swap-out has
// completed. Host buffers come from one caller-owned region registered with the store's engine
// (fixed buffers) and the device (page-locking on a GPU); host ↔ device copies run on one device
// stream and complete through device events, as in EngineMover.
//
// Lifecycle. Partitions reach the store in one of two ways, both before store.commit():
//  - through the manager: ResidencyManager::register_partition → reserve() → store.reserve();
//  - directly: the caller reserves a partition in the store itself (to write its initial
//    contents); reserve() then adopts it, provided the sizes agree.
// The caller commits the store once every partition is reserved. No NVMe move can run before
// that (kInvalidArgument), so partitions registered with the manager straight into the host or
// device tier must fit there without a write-back until then. A partition registered with the
// manager as Tier::kNvme must have a valid copy in the store (store.swap_out + wait) before it is
// first swapped in; one that does not fails its swap-in with the store's kNotFound, which names
// the partition.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "src/base/device.h"
#include "src/tier/mover.h"
#include "src/tier/mover_slots.h"
#include "swap/swap_store.h"

namespace zinf::tier {

struct StoreMoverOptions {
    // Moves in flight at once (swap handles and device events are sized to it at create).
    std::size_t max_in_flight = 64;
    // Page-lock the host region with the device (cudaHostRegister on a GPU) for asynchronous
    // copies: `pin_memory`. false: a pageable host tier; the driver stages its copies.
    bool register_with_device = true;
    // Its NVMe moves go ahead of the engine's other operations (io::IoHandle::set_urgent): the
    // parameter tiers, whose fetches the compute waits for, over the optimizer states' reads
    // and writes that share the engine.
    bool urgent = false;
};

class StoreMover final : public Mover {
public:
    // `store` and `device` (null when no device copies are made) must outlive the mover. The host
    // region is borrowed: it must outlive the mover and the store's engine (the engine keeps it
    // registered until it is destroyed); it must be aligned to 4096 bytes. Registration failures
    // with the engine (e.g. RLIMIT_MEMLOCK) are logged and the mover works without fixed buffers.
    // Errors: kInvalidArgument (unaligned region, max_in_flight 0), the device's errors when
    // creating its stream or registering the region. Init only: allocates.
    static Result<std::unique_ptr<StoreMover>> create(swap::SwapStore& store, Device* device,
                                                      std::span<std::byte> host_region,
                                                      const StoreMoverOptions& options);
    // Asserts no move is in flight; unregisters the host region from the device.
    ~StoreMover() override;
    StoreMover(const StoreMover&) = delete;
    StoreMover& operator=(const StoreMover&) = delete;

    std::span<std::byte> host_region() noexcept override { return host_region_; }
    // The store's extent alignment (4096: the largest O_DIRECT logical block size expected).
    std::size_t host_alignment_bytes() const noexcept override { return kAlignmentBytes; }
    std::size_t max_in_flight() const noexcept override { return options_.max_in_flight; }
    // Reserves the partition in the store (before store.commit()), or adopts one that the caller
    // reserved there directly (before or after commit) when its size is size_bytes. Errors:
    // kInvalidArgument for a size of 0, a second reserve of `id`, a size that differs from the
    // store's, or a new partition after commit. The store checks free space at commit (kNoSpace
    // there, not here). Init only: allocates.
    Status reserve(PartitionId id, std::size_t size_bytes) override;
    // kSwapIn reads the whole partition into `host` and verifies it when the move completes;
    // kSwapOut hashes `host` on the calling thread (the store's checksums), then writes it.
    // Preconditions (asserted): `host` lies in the region and is aligned. Errors at start: kBusy
    // (every slot in flight), kInvalidArgument (an NVMe move before the store is committed), the
    // store's submit errors (kNotFound: no valid copy to swap in), the device's errors; each
    // names the partition.
    // Never blocks, never allocates on success.
    Result<MoveToken> start(const Move& move) noexcept override;
    // A completed NVMe move is finished through its swap handle here: a swap-out marks the
    // store's copy valid (or leaves it invalid on error), a swap-in is verified (kCorruption
    // naming the partition and the bad block). Errors name the partition and the operation.
    Result<bool> poll(MoveToken token) noexcept override;
    Status wait(MoveToken token) noexcept override;

    // The store behind the mover: its stats (bytes, checksum time, corruptions), validity and
    // layout.
    swap::SwapStore& store() noexcept { return store_; }
    const swap::SwapStore& store() const noexcept { return store_; }

private:
    struct Slot {
        bool busy = false;
        MoveKind kind = MoveKind::kSwapIn;
        PartitionId id = kNoPartition;
        std::uint64_t size_bytes = 0;
        EventId event = 0;
        swap::SwapHandle swap;
    };
    StoreMover(swap::SwapStore& store, Device* device, std::span<std::byte> host_region,
               const StoreMoverOptions& options);
    void free_slot(MoveToken token) noexcept;
    // Wraps a failed move's status with the partition and operation (only on error).
    Status failed(const Slot& s, const Status& status) const;

    static constexpr std::size_t kAlignmentBytes = 4096;
    static_assert(kAlignmentBytes % swap::kExtentAlignmentBytes == 0);

    swap::SwapStore& store_;
    Device* device_;
    std::span<std::byte> host_region_;
    StoreMoverOptions options_;
    HostRegionLinks links_;
    std::vector<bool> reserved_;  // per partition id: reserved through this mover
    MoveSlots<Slot> slots_;
};

}  // namespace zinf::tier
