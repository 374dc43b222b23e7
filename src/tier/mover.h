// tier::Mover: the only way the residency manager moves bytes. The manager decides *when* a
// partition moves between tiers; a Mover does the moving (NVMe through the I/O engine or the swap
// store, host ↔ device through the Device) and reports completion when polled. The manager owns no
// file descriptors, no I/O handles and no device streams.
//
// Kept small on purpose: StoreMover implements it over the swap/ store (checksums, validity,
// per-run directory) + Device, EngineMover over io::Engine + Device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "src/base/status.h"
#include "src/tier/types.h"

namespace zinf::tier {

enum class MoveKind : std::uint8_t {
    kSwapIn,    // NVMe → host: read the partition's NVMe copy into `host`
    kSwapOut,   // host → NVMe: write `host` to the partition's NVMe copy
    kToDevice,  // host → device: copy `host` to `device`
    kToHost,    // device → host: copy `device` to `host`
};

constexpr std::string_view move_kind_name(MoveKind kind) noexcept {
    switch (kind) {
        case MoveKind::kSwapIn:
            return "swap in";
        case MoveKind::kSwapOut:
            return "swap out";
        case MoveKind::kToDevice:
            return "copy to device";
        case MoveKind::kToHost:
            return "copy to host";
    }
    return "?";
}

struct Move {
    MoveKind kind = MoveKind::kSwapIn;
    PartitionId id = kNoPartition;
    // A host buffer inside the mover's host_region(), aligned to host_alignment_bytes().
    std::byte* host = nullptr;
    // Device memory (kToDevice, kToHost only).
    void* device = nullptr;
    // The partition's size. NVMe moves may transfer up to align_up(size_bytes,
    // host_alignment_bytes()) bytes: the host buffer is that long, and the tail is padding.
    std::size_t size_bytes = 0;
};

// A small integer naming a move in flight; valid from start() until poll() reports it done or
// wait() returns.
using MoveToken = std::uint32_t;

// Thread-compatible: the manager calls it from one thread at a time. Implementations may complete
// moves on their own threads, but report them only through poll()/wait().
class Mover {
public:
    virtual ~Mover() = default;

    // Host memory of the host tier: one region, registered with the I/O layer and the device
    // where that makes transfers faster. Owned by the mover (or borrowed by it for its lifetime);
    // the manager carves partitions' host buffers out of it and never frees it.
    virtual std::span<std::byte> host_region() noexcept = 0;
    // Alignment of host buffers, and of NVMe lengths (O_DIRECT). A power of two.
    virtual std::size_t host_alignment_bytes() const noexcept = 0;
    // Most moves in flight at once; start() beyond it returns kBusy.
    virtual std::size_t max_in_flight() const noexcept = 0;

    // Gives partition `id` a home on NVMe of at least size_bytes. Called once per partition at
    // registration (not on the hot path). kNoSpace when the NVMe space is exhausted;
    // kInvalidArgument when `id` already has one.
    virtual Status reserve(PartitionId id, std::size_t size_bytes) = 0;

    // Starts `move` asynchronously. The buffers stay the caller's and must not be touched until
    // the move is done. kBusy when max_in_flight() moves are outstanding; any other error means
    // nothing was started. Never blocks, never allocates.
    virtual Result<MoveToken> start(const Move& move) noexcept = 0;
    // Non-blocking. false: still in flight. true: done and successful. An error: done and failed
    // (the error names the partition, the operation and the cause). Once it reports done (true or
    // an error) the token is released and must not be polled again.
    virtual Result<bool> poll(MoveToken token) noexcept = 0;
    // Blocks until the move is done; returns its status and releases the token.
    virtual Status wait(MoveToken token) noexcept = 0;
};

}  // namespace zinf::tier
