// EngineMover: partitions at fixed offsets of one engine file; host ↔ device through a stream.
#include "src/tier/engine_mover.h"

#include <algorithm>

#include "src/base/aligned.h"
#include "src/base/log.h"
#include "src/tier/device_copy.h"

namespace zinf::tier {

Result<std::unique_ptr<EngineMover>> EngineMover::create(io::Engine& engine, Device* device,
                                                         std::span<std::byte> host_region,
                                                         const EngineMoverOptions& options) {
    if (options.path.empty()) return Status::invalid_argument("engine mover: no swap file path");
    if (options.max_in_flight == 0)
        return Status::invalid_argument("engine mover: max_in_flight must be > 0");
    if (!is_aligned(host_region.data(), kDefaultHostAlignmentBytes)) {
        return Status::invalid_argument("engine mover: the host region is not 4096-byte aligned");
    }
    std::unique_ptr<EngineMover> mover(new EngineMover(engine, device, host_region, options));
    io::FileOptions file_options;
    file_options.create = options.create_file;
    file_options.exclusive = options.create_file;
    file_options.mode = 0600;
    file_options.preallocate_bytes = options.capacity_bytes;
    ZINF_ASSIGN_OR_RETURN(mover->file_, engine.open(options.path, file_options));
    mover->file_open_ = true;
    // Buffers, offsets and lengths of O_DIRECT transfers are aligned to the larger of the file's
    // logical block size (queried by the engine) and a page (4Kn drives, and huge-page friendly).
    mover->alignment_bytes_ =
        std::max(kDefaultHostAlignmentBytes, engine.alignment_bytes(mover->file_));
    if (!is_aligned(host_region.data(), mover->alignment_bytes_)) {
        return Status::invalid_argument(str_cat("engine mover: the host region is not aligned to ",
                                                mover->alignment_bytes_, " bytes"));
    }
    ZINF_TRY(mover->links_.link("engine mover", engine, device, host_region, true));
    return mover;
}

EngineMover::EngineMover(io::Engine& engine, Device* device, std::span<std::byte> host_region,
                         const EngineMoverOptions& options)
    : engine_(engine),
      device_(device),
      host_region_(host_region),
      options_(options),
      slots_(options.max_in_flight) {}

EngineMover::~EngineMover() {
    ZINF_ASSERT(slots_.all_free());
    if (file_open_) {
        const Status s = engine_.close(file_);
        if (!s.is_ok()) log::warning("engine mover: closing ", options_.path, ": ", s.to_string());
    }
}

Status EngineMover::reserve(PartitionId id, std::size_t size_bytes) {
    if (size_bytes == 0)
        return Status::invalid_argument(str_cat("engine mover: partition ", id, " has size 0"));
    if (id >= offsets_.size()) offsets_.resize(static_cast<std::size_t>(id) + 1, kNoOffset);
    if (offsets_[id] != kNoOffset) {
        return Status::invalid_argument(str_cat("engine mover: partition ", id, " reserved twice"));
    }
    const std::uint64_t length = align_up(size_bytes, alignment_bytes_);
    if (next_offset_bytes_ + length > options_.capacity_bytes) {
        return Status::no_space(str_cat("engine mover: ", options_.path, ": partition ", id, " (",
                                        size_bytes, " bytes) does not fit: ", next_offset_bytes_,
                                        " of ", options_.capacity_bytes, " bytes reserved"));
    }
    offsets_[id] = next_offset_bytes_;
    next_offset_bytes_ += length;
    return Status::ok();
}

std::uint64_t EngineMover::offset_of(PartitionId id) const {
    ZINF_ASSERT_LT(id, offsets_.size());
    ZINF_ASSERT_NE(offsets_[id], kNoOffset);
    return offsets_[id];
}

void EngineMover::free_slot(MoveToken token) noexcept {
    slots_.give_back(token);
}

Status EngineMover::failed(const Slot& s, const Status& status) const {
    return status.with_context(
        str_cat("partition ", s.id, ": ", move_kind_name(s.kind), " (", s.size_bytes, " bytes)"));
}

Result<MoveToken> EngineMover::start(const Move& move) noexcept {
    ZINF_ASSERT(move.host != nullptr);
    ZINF_ASSERT_GT(move.size_bytes, 0u);
    const std::size_t length = align_up(move.size_bytes, alignment_bytes_);
    // The host buffer lies inside the region and is aligned (asserted here and, for NVMe
    // moves, again by the engine at submission).
    ZINF_ASSERT(move.host >= host_region_.data());
    ZINF_ASSERT_LE(move.host + length, host_region_.data() + host_region_.size());
    ZINF_ASSERT(is_aligned(move.host, alignment_bytes_));
    ZINF_ASSIGN_OR_RETURN(const MoveToken token, slots_.take("engine mover"));
    Slot& s = slots_.at(token);
    s.kind = move.kind;
    s.id = move.id;
    s.size_bytes = move.size_bytes;
    Status started;
    switch (move.kind) {
        case MoveKind::kSwapIn:
            started = engine_.submit_read(s.io, file_, offset_of(move.id),
                                          std::span<std::byte>(move.host, length));
            break;
        case MoveKind::kSwapOut:
            started = engine_.submit_write(s.io, file_, offset_of(move.id),
                                           std::span<const std::byte>(move.host, length));
            break;
        case MoveKind::kToDevice:
        case MoveKind::kToHost: {
            ZINF_ASSERT(device_ != nullptr);
            Result<EventId> event = start_device_copy(*device_, links_.stream(), move);
            if (event.has_value()) {
                s.event = *event;
            } else {
                started = event.error();
            }
            break;
        }
    }
    if (!started.is_ok()) {
        free_slot(token);
        return failed(s, started);
    }
    return token;
}

Result<bool> EngineMover::poll(MoveToken token) noexcept {
    Slot& s = slots_.at(token);
    Status status;
    if (s.kind == MoveKind::kSwapIn || s.kind == MoveKind::kSwapOut) {
        if (!s.io.done()) return false;
        status = s.io.wait();  // done: returns at once
    } else {
        Result<bool> done = poll_device_copy(*device_, s.event);
        if (done.has_value() && !*done) return false;
        status = done.status();
    }
    free_slot(token);
    if (!status.is_ok()) return failed(s, status);
    return true;
}

Status EngineMover::wait(MoveToken token) noexcept {
    Slot& s = slots_.at(token);
    Status status;
    if (s.kind == MoveKind::kSwapIn || s.kind == MoveKind::kSwapOut) {
        status = s.io.wait();
    } else {
        status = wait_device_copy(*device_, s.event);
    }
    free_slot(token);
    if (!status.is_ok()) return failed(s, status);
    return status;
}

}  // namespace zinf::tier
