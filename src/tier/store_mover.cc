// StoreMover: NVMe moves through the swap store (checksummed, validity-tracked); host ↔ device
// through one device stream, as EngineMover does.
#include "src/tier/store_mover.h"

#include "src/base/aligned.h"
#include "src/base/log.h"
#include "src/tier/device_copy.h"

namespace zinf::tier {

Result<std::unique_ptr<StoreMover>> StoreMover::create(swap::SwapStore& store, Device* device,
                                                       std::span<std::byte> host_region,
                                                       const StoreMoverOptions& options) {
    if (options.max_in_flight == 0)
        return Status::invalid_argument("store mover: max_in_flight must be > 0");
    // O_DIRECT transfers need the buffer aligned to the file's logical block size; the store
    // lays its extents out at kExtentAlignmentBytes, the largest block size it expects.
    if (!is_aligned(host_region.data(), kAlignmentBytes)) {
        return Status::invalid_argument(
            str_cat("store mover: the host region is not ", kAlignmentBytes, "-byte aligned"));
    }
    std::unique_ptr<StoreMover> mover(new StoreMover(store, device, host_region, options));
    ZINF_TRY(mover->links_.link("store mover", store.engine(), device, host_region,
                                options.register_with_device));
    return mover;
}

StoreMover::StoreMover(swap::SwapStore& store, Device* device, std::span<std::byte> host_region,
                       const StoreMoverOptions& options)
    : store_(store),
      device_(device),
      host_region_(host_region),
      options_(options),
      slots_(options.max_in_flight) {}

StoreMover::~StoreMover() {
    // Every swap handle must have been waited for: the store asserts the same when it goes.
    ZINF_ASSERT(slots_.all_free());
}

Status StoreMover::reserve(PartitionId id, std::size_t size_bytes) {
    if (size_bytes == 0)
        return Status::invalid_argument(str_cat("store mover: partition ", id, " has size 0"));
    if (id < reserved_.size() && reserved_[id]) {
        return Status::invalid_argument(str_cat("store mover: partition ", id, " reserved twice"));
    }
    if (store_.contains(id)) {
        // Reserved in the store by the caller, who writes its initial contents there directly.
        const std::uint64_t stored_bytes = store_.extent(id).size_bytes;
        if (stored_bytes != size_bytes) {
            return Status::invalid_argument(str_cat("store mover: partition ", id, " has ",
                                                    size_bytes, " bytes, but swap '", store_.name(),
                                                    "' holds it with ", stored_bytes));
        }
    } else if (store_.committed()) {
        return Status::invalid_argument(str_cat("store mover: partition ", id,
                                                " reserved after swap '", store_.name(),
                                                "' was committed (reserve every partition first)"));
    } else {
        const Status reserved = store_.reserve(id, size_bytes);
        if (!reserved.is_ok()) return reserved.with_context(str_cat("store mover: partition ", id));
    }
    if (id >= reserved_.size()) reserved_.resize(static_cast<std::size_t>(id) + 1, false);
    reserved_[id] = true;
    return Status::ok();
}

void StoreMover::free_slot(MoveToken token) noexcept {
    // The store's operation is complete (waited for) or was never started.
    ZINF_ASSERT(!slots_.at(token).swap.in_use());
    slots_.give_back(token);
}

Status StoreMover::failed(const Slot& s, const Status& status) const {
    return status.with_context(
        str_cat("partition ", s.id, ": ", move_kind_name(s.kind), " (", s.size_bytes, " bytes)"));
}

Result<MoveToken> StoreMover::start(const Move& move) noexcept {
    ZINF_ASSERT(move.host != nullptr);
    ZINF_ASSERT_GT(move.size_bytes, 0u);
    const std::size_t length = align_up(move.size_bytes, kAlignmentBytes);
    // The host buffer lies inside the region and is aligned (asserted here and, for O_DIRECT,
    // again by the engine at submission).
    ZINF_ASSERT(move.host >= host_region_.data());
    ZINF_ASSERT_LE(move.host + length, host_region_.data() + host_region_.size());
    ZINF_ASSERT(is_aligned(move.host, kAlignmentBytes));
    const bool nvme = move.kind == MoveKind::kSwapIn || move.kind == MoveKind::kSwapOut;
    if (nvme && !store_.committed()) {
        // E.g. partitions registered straight into the host tier overflow it and one must be
        // written back before the caller has committed the store.
        return Status::invalid_argument(str_cat("store mover: partition ", move.id, ": ",
                                                move_kind_name(move.kind), " before swap '",
                                                store_.name(), "' was committed"));
    }
    ZINF_ASSIGN_OR_RETURN(const MoveToken token, slots_.take("store mover"));
    Slot& s = slots_.at(token);
    ZINF_ASSERT(!s.swap.in_use());
    s.swap.set_urgent(options_.urgent);
    s.kind = move.kind;
    s.id = move.id;
    s.size_bytes = move.size_bytes;
    Status started;
    switch (move.kind) {
        case MoveKind::kSwapIn:
            // The store reads size_bytes; the buffer's aligned tail is padding.
            started = store_.swap_in(move.id, std::span<std::byte>(move.host, length), s.swap);
            break;
        case MoveKind::kSwapOut:
            // Only the partition's bytes: the checksums cover exactly them.
            started = store_.swap_out(
                move.id, std::span<const std::byte>(move.host, move.size_bytes), s.swap);
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

Result<bool> StoreMover::poll(MoveToken token) noexcept {
    Slot& s = slots_.at(token);
    Status status;
    if (s.kind == MoveKind::kSwapIn || s.kind == MoveKind::kSwapOut) {
        if (!s.swap.done()) return false;
        // Done: completes at once, marking the copy valid or verifying the bytes read.
        status = s.swap.wait();
    } else {
        Result<bool> done = poll_device_copy(*device_, s.event);
        if (done.has_value() && !*done) return false;
        status = done.status();
    }
    free_slot(token);
    if (!status.is_ok()) return failed(s, status);
    return true;
}

Status StoreMover::wait(MoveToken token) noexcept {
    Slot& s = slots_.at(token);
    Status status;
    if (s.kind == MoveKind::kSwapIn || s.kind == MoveKind::kSwapOut) {
        status = s.swap.wait();
    } else {
        status = wait_device_copy(*device_, s.event);
    }
    free_slot(token);
    if (!status.is_ok()) return failed(s, status);
    return status;
}

}  // namespace zinf::tier
