// ActivationStore: where activation checkpointing keeps block inputs outside device and host
// memory (zinfinity's activation_checkpointing.nvme_checkpointing: NVMe through the swap store).
// The model saves input i after block i's forward has read it and restores the inputs in reverse
// order in backward; the store writes in the background and reads one input ahead, so that the
// transfers overlap the blocks' compute.
#pragma once

#include <cstddef>

#include "src/base/device.h"
#include "src/base/status.h"

namespace zinf::model {

class ActivationStore {
public:
    virtual ~ActivationStore() = default;
    // The bytes of one kept input and how many the store holds (fixed at creation).
    virtual std::size_t input_bytes() const noexcept = 0;
    virtual std::size_t input_count() const noexcept = 0;
    // Starts keeping input `index` (< input_count) from device memory `src` (bytes bytes, at
    // most input_bytes(), produced by work enqueued on `stream` before the call). Returns once
    // `src` may be overwritten; the write goes on in the background. Errors: the copy's, an
    // earlier write's (kIo naming the input), kNoSpace.
    virtual Status save(std::size_t index, const void* src, std::size_t bytes, StreamId stream) = 0;
    // Copies input `index` back into device memory `dst` (ordered on `stream`), then starts
    // reading index - 1, which backward needs next. Waits for this input's own write and read.
    // Errors: kIo, kCorruption (a checksum), naming the input.
    virtual Status restore(std::size_t index, void* dst, std::size_t bytes, StreamId stream) = 0;
    // Bytes written and read since creation.
    virtual std::size_t bytes_written() const noexcept = 0;
    virtual std::size_t bytes_read() const noexcept = 0;
    // io::Engine::set_discard on the store's I/O (Engine::set_io_discard); a store without I/O
    // has nothing to discard.
    virtual void set_io_discard(bool /*on*/) noexcept {}
};

}  // namespace zinf::model
