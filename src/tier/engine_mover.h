// EngineMover: a tier::Mover over io::Engine and a Device. Every partition has a fixed extent in
// one swap file opened through the engine (created exclusively, preallocated); host buffers come
// from one caller-owned region registered with the engine (fixed buffers) and the device
// (page-locking on a GPU); host ↔ device copies run on one device stream and complete through
// device events. It does no I/O syscalls of its own.
//
// Training moves parameters through StoreMover (the swap store: checksums, validity, per-run
// directory); this one stays for benches and tests that time the engine alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/engine.h"
#include "src/base/device.h"
#include "src/tier/mover.h"
#include "src/tier/mover_slots.h"

namespace zinf::tier {

struct EngineMoverOptions {
    // The swap file: created exclusively (mode 0600), or, with create_file false, an existing
    // file that the caller created exclusively. Either way the caller removes it when done.
    std::string path;
    bool create_file = true;
    // Bytes reserved for partitions' extents (preallocated: a full disk fails here, not later).
    std::uint64_t capacity_bytes = 0;
    // Moves in flight at once (I/O handles and device events are sized to it at create).
    std::size_t max_in_flight = 64;
};

class EngineMover final : public Mover {
public:
    // `engine` and `device` (null when no device copies are made) must outlive the mover. The
    // host region is borrowed: it must outlive the mover and the engine (the engine keeps it
    // registered until it is destroyed); it must be aligned to 4096 bytes. Registration failures
    // (e.g. RLIMIT_MEMLOCK) are logged and the mover works without fixed buffers. Errors: the
    // engine's open errors (kNoSpace, kIo, kInvalidArgument naming the path).
    static Result<std::unique_ptr<EngineMover>> create(io::Engine& engine, Device* device,
                                                       std::span<std::byte> host_region,
                                                       const EngineMoverOptions& options);
    // Asserts no move is in flight; closes the file and unregisters the host region from the
    // device.
    ~EngineMover() override;
    EngineMover(const EngineMover&) = delete;
    EngineMover& operator=(const EngineMover&) = delete;

    std::span<std::byte> host_region() noexcept override { return host_region_; }
    std::size_t host_alignment_bytes() const noexcept override { return alignment_bytes_; }
    std::size_t max_in_flight() const noexcept override { return options_.max_in_flight; }
    // Extents are laid out in reserve() order at aligned offsets. kNoSpace beyond capacity.
    Status reserve(PartitionId id, std::size_t size_bytes) override;
    Result<MoveToken> start(const Move& move) noexcept override;
    Result<bool> poll(MoveToken token) noexcept override;
    Status wait(MoveToken token) noexcept override;

    // For benches and tests that fill or read the file directly.
    io::FileId file() const noexcept { return file_; }
    io::Engine& engine() noexcept { return engine_; }
    // The extent's offset in the file; asserts `id` was reserved.
    std::uint64_t offset_of(PartitionId id) const;
    std::uint64_t reserved_bytes() const noexcept { return next_offset_bytes_; }

private:
    struct Slot {
        bool busy = false;
        MoveKind kind = MoveKind::kSwapIn;
        PartitionId id = kNoPartition;
        std::uint64_t size_bytes = 0;
        EventId event = 0;
        io::IoHandle io;
    };
    EngineMover(io::Engine& engine, Device* device, std::span<std::byte> host_region,
                const EngineMoverOptions& options);
    void free_slot(MoveToken token) noexcept;
    // Wraps a failed move's status with the partition and operation (only on error).
    Status failed(const Slot& s, const Status& status) const;

    io::Engine& engine_;
    Device* device_;
    std::span<std::byte> host_region_;
    EngineMoverOptions options_;
    io::FileId file_ = 0;
    bool file_open_ = false;
    HostRegionLinks links_;
    std::size_t alignment_bytes_ = kDefaultHostAlignmentBytes;
    std::vector<std::uint64_t> offsets_;  // per partition id; kNoOffset if not reserved
    std::uint64_t next_offset_bytes_ = 0;
    MoveSlots<Slot> slots_;

    static constexpr std::size_t kDefaultHostAlignmentBytes = 4096;
    static constexpr std::uint64_t kNoOffset = ~std::uint64_t{0};
};

}  // namespace zinf::tier
