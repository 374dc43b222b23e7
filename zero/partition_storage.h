// PartitionStorage: where a stage-3 rank's parameter partitions live when `offload_param` moves
// them off the device. The coordinator reads a parameter's slice through it before gathering and
// writes slices through it (initial values, the optimizer's new values, checkpoints); an
// implementation decides where the bytes are (pageable host memory, or the tiered store over NVMe)
// and moves them. Slices are in the coordinator's dtype, slice_numel elements each (padding
// included), one per parameter index.
#pragma once

#include <cstddef>
#include <span>

#include "src/base/device.h"
#include "src/base/status.h"

namespace zinf::zero {

class PartitionStorage {
public:
    virtual ~PartitionStorage() = default;

    // Device-readable bytes of parameter `index`'s slice, valid on `stream` until end_read().
    // Blocks until they are there. Errors: the storage's move errors (kIo, kCorruption, kNoSpace),
    // naming the parameter.
    virtual Result<const void*> begin_read(std::size_t index, StreamId stream) = 0;
    // Ends the read: the storage may move or evict the slice once `stream` is past its uses.
    virtual Status end_read(std::size_t index, StreamId stream) = 0;

    // Host-side access to part of a slice: bytes [offset_bytes, offset_bytes + bytes.size()).
    virtual Status write(std::size_t index, std::size_t offset_bytes,
                         std::span<const std::byte> bytes) = 0;
    virtual Status read(std::size_t index, std::size_t offset_bytes,
                        std::span<std::byte> bytes) = 0;
    // Replaces the whole slice with `bytes`, which stay the caller's and unchanged until
    // take_staged(): the storage may copy them when the slice is next read (and write them down
    // from there) instead of now. This one writes at once.
    virtual Status write_staged(std::size_t index, std::span<const std::byte> bytes) {
        return write(index, 0, bytes);
    }
    // Every slice given to write_staged() is taken: its bytes are free for the caller again.
    virtual Status take_staged() { return Status::ok(); }

    // One training micro-step (forward and backward) runs between these: the accesses of the
    // first are the trace later ones are prefetched along.
    virtual void begin_iteration() {}
    virtual void end_iteration() {}
};

}  // namespace zinf::zero
