// ResidencyManager: per-partition copy states, budgets, trace recording, prefetch and eviction.
//
// Each partition has a copy state per tier (device, host: absent, filling or valid; NVMe: valid
// or not) and at most one move in flight. A copy is *dirty* when it is valid and no slower tier
// holds the same bytes; a dirty copy is written one tier down before it may be dropped, so the
// last valid copy of a partition is never discarded.
#include "src/tier/residency_manager.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "src/base/aligned.h"
#include "src/base/log.h"

namespace zinf::tier {

namespace {

int tier_index(Tier tier) {
    return static_cast<int>(tier);
}

}  // namespace

std::string_view partition_state_name(PartitionState state) noexcept {
    switch (state) {
        case PartitionState::kOnNvme:
            return "on nvme";
        case PartitionState::kReading:
            return "reading";
        case PartitionState::kOnHost:
            return "on host";
        case PartitionState::kCopyingToDevice:
            return "copying to device";
        case PartitionState::kOnDevice:
            return "on device";
        case PartitionState::kDirty:
            return "dirty";
        case PartitionState::kWriting:
            return "writing";
        case PartitionState::kCopyingToHost:
            return "copying to host";
        case PartitionState::kStaged:
            return "staged";
    }
    return "?";
}

// ---------------------------------------------------------------------------------------------
// Construction

Result<std::unique_ptr<ResidencyManager>> ResidencyManager::create(const ResidencyOptions& options,
                                                                   Mover& mover, Device* device) {
    if (options.partition_capacity == 0) {
        return Status::invalid_argument("residency: partition_capacity must be > 0");
    }
    const std::size_t host_alignment = mover.host_alignment_bytes();
    ZINF_ASSERT_GT(host_alignment, 0u);
    ZINF_ASSERT_EQ(host_alignment & (host_alignment - 1), 0u);
    if (options.device_alignment_bytes == 0 ||
        (options.device_alignment_bytes & (options.device_alignment_bytes - 1)) != 0) {
        return Status::invalid_argument(
            str_cat("residency: device_alignment_bytes must be a power of two, got ",
                    options.device_alignment_bytes));
    }
    const std::span<std::byte> region = mover.host_region();
    if (options.host_budget_bytes > region.size()) {
        return Status::invalid_argument(
            str_cat("residency: host budget of ", options.host_budget_bytes,
                    " bytes exceeds the mover's host region of ", region.size(), " bytes"));
    }
    if (options.host_budget_bytes > 0 && !is_aligned(region.data(), host_alignment)) {
        return Status::invalid_argument(
            "residency: the mover's host region is not aligned to its alignment");
    }
    if (options.device_budget_bytes > 0 && device == nullptr) {
        return Status::invalid_argument("residency: a device budget needs a Device");
    }
    if (options.dirty_weight < 0) {
        return Status::invalid_argument("residency: dirty_weight must be >= 0");
    }
    std::unique_ptr<ResidencyManager> manager(new ResidencyManager(options, mover, device));
    if (options.device_budget_bytes > 0) {
        ZINF_ASSIGN_OR_RETURN(
            manager->device_memory_,
            DeviceBuffer::allocate(*device, options.device_budget_bytes, "residency: device tier"));
        manager->device_region_ = manager->device_memory_.as<std::byte>();
    }
    return manager;
}

ResidencyManager::ResidencyManager(const ResidencyOptions& options, Mover& mover, Device* device)
    : options_(options),
      mover_(mover),
      device_(device),
      host_region_(mover.host_region().first(options.host_budget_bytes)),
      device_alloc_(options.device_budget_bytes, options.device_alignment_bytes,
                    options.partition_capacity),
      host_alloc_(options.host_budget_bytes, mover.host_alignment_bytes(),
                  options.partition_capacity),
      parts_(options.partition_capacity) {
    in_flight_.reserve(options.partition_capacity);
    write_behind_.reserve(options.partition_capacity);
    candidates_.reserve(options.partition_capacity);
    // Free extents never outnumber allocated ones by more than one.
    extents_.reserve(2 * options.partition_capacity + 1);
    recording_.reserve(options.trace_capacity);
}

ResidencyManager::~ResidencyManager() {
    const Status drained = drain();
    if (!drained.is_ok())
        log::warning("residency: a move failed while draining at shutdown: ", drained.to_string());
    for (const Partition& p : parts_) ZINF_ASSERT_EQ(p.pin_count, 0u);
    // device_memory_ frees the device tier: nothing is in flight any more.
}

// ---------------------------------------------------------------------------------------------
// Small accessors

double ResidencyManager::ms_since_created() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - created_at_)
        .count();
}

ResidencyManager::Partition& ResidencyManager::part(PartitionId id) {
    ZINF_ASSERT_LT(id, parts_.size());
    ZINF_ASSERT_MSG(parts_[id].registered, str_cat("partition ", id, " is not registered"));
    return parts_[id];
}

const ResidencyManager::Partition& ResidencyManager::part(PartitionId id) const {
    ZINF_ASSERT_LT(id, parts_.size());
    ZINF_ASSERT_MSG(parts_[id].registered, str_cat("partition ", id, " is not registered"));
    return parts_[id];
}

ResidencyManager::Copy& ResidencyManager::copy(Partition& p, Tier tier) {
    ZINF_ASSERT(tier != Tier::kNvme);
    return tier == Tier::kDevice ? p.device : p.host;
}

ResidencyManager::Copy ResidencyManager::copy(const Partition& p, Tier tier) const {
    ZINF_ASSERT(tier != Tier::kNvme);
    return tier == Tier::kDevice ? p.device : p.host;
}

bool ResidencyManager::valid(const Partition& p, Tier tier) const {
    if (tier == Tier::kNvme) return p.nvme_valid;
    return copy(p, tier) == Copy::kValid;
}

bool ResidencyManager::is_dirty(const Partition& p, Tier tier) const {
    if (tier == Tier::kNvme || !valid(p, tier)) return false;
    if (p.nvme_valid) return false;
    return tier == Tier::kDevice ? p.host != Copy::kValid : true;
}

std::byte* ResidencyManager::host_ptr(const Partition& p) {
    ZINF_ASSERT_NE(p.host_offset, kNoOffset);
    return host_region_.data() + p.host_offset;
}

std::byte* ResidencyManager::device_ptr(const Partition& p) {
    ZINF_ASSERT_NE(p.device_offset, kNoOffset);
    return device_region_ + p.device_offset;
}

ExtentAllocator& ResidencyManager::allocator(Tier tier) {
    ZINF_ASSERT(tier != Tier::kNvme);
    return tier == Tier::kDevice ? device_alloc_ : host_alloc_;
}

void ResidencyManager::note_allocation(Tier tier) {
    const std::size_t used = allocator(tier).used_bytes();
    std::size_t& peak = peak_bytes_[tier_index(tier)];
    if (used > peak) peak = used;
}

void ResidencyManager::check_budgets() const {
    // Hard budgets: the allocators carve from regions of exactly the budget, so these hold by
    // construction; asserting them after every change keeps it that way.
    ZINF_ASSERT_LE(device_alloc_.used_bytes(), options_.device_budget_bytes);
    ZINF_ASSERT_LE(host_alloc_.used_bytes(), options_.host_budget_bytes);
    ZINF_ASSERT_LE(nvme_used_bytes_, options_.nvme_budget_bytes);
    ZINF_ASSERT_LE(peak_bytes_[0], options_.device_budget_bytes);
    ZINF_ASSERT_LE(peak_bytes_[1], options_.host_budget_bytes);
#ifdef NDEBUG
    if (!options_.check_invariants) return;
#endif
    // O(n): every extent held by a partition is accounted for, and nothing else is.
    std::size_t device_bytes = 0;
    std::size_t host_bytes = 0;
    for (const Partition& p : parts_) {
        if (!p.registered) continue;
        ZINF_ASSERT_EQ(p.device == Copy::kAbsent, p.device_offset == kNoOffset);
        ZINF_ASSERT_EQ(p.host == Copy::kAbsent, p.host_offset == kNoOffset);
        if (p.device != Copy::kAbsent) device_bytes += device_alloc_.rounded(p.size_bytes);
        if (p.host != Copy::kAbsent) host_bytes += host_alloc_.rounded(p.size_bytes);
        // Never lose the last copy (a staged partition's is the caller's source).
        ZINF_ASSERT(p.nvme_valid || p.host != Copy::kAbsent || p.device != Copy::kAbsent ||
                    p.source != nullptr);
        ZINF_ASSERT(p.source == nullptr ||
                    (p.host == Copy::kAbsent && p.device == Copy::kAbsent && !p.nvme_valid));
    }
    ZINF_ASSERT_EQ(device_bytes, device_alloc_.used_bytes());
    ZINF_ASSERT_EQ(host_bytes, host_alloc_.used_bytes());
}

// ---------------------------------------------------------------------------------------------
// Registration

Status ResidencyManager::register_partition(PartitionId id, std::size_t size_bytes, DType dtype,
                                            Tier initial) {
    if (id >= parts_.size()) {
        return Status::invalid_argument(str_cat("residency: partition id ", id,
                                                " is beyond partition_capacity ", parts_.size()));
    }
    if (parts_[id].registered)
        return Status::invalid_argument(str_cat("residency: partition ", id, " registered twice"));
    if (size_bytes == 0)
        return Status::invalid_argument(str_cat("residency: partition ", id, " has size 0"));
    if (initial == Tier::kDevice && device_region_ == nullptr) {
        return Status::invalid_argument(
            str_cat("residency: partition ", id, " starts on the device, which has no budget"));
    }
    const std::uint64_t nvme_bytes = align_up(size_bytes, mover_.host_alignment_bytes());
    if (nvme_used_bytes_ + nvme_bytes > options_.nvme_budget_bytes) {
        return Status::no_space(str_cat("residency: partition ", id, " (", size_bytes,
                                        " bytes) would exceed the NVMe budget of ",
                                        options_.nvme_budget_bytes, " bytes (", nvme_used_bytes_,
                                        " reserved)"));
    }
    std::size_t offset = kNoOffset;
    if (initial != Tier::kNvme) {
        ZINF_ASSIGN_OR_RETURN(const std::optional<std::size_t> room,
                              make_room(initial, size_bytes, id, false, 0));
        offset = room.value();  // a demand either makes room or fails
    }
    const Status reserved = mover_.reserve(id, size_bytes);
    if (!reserved.is_ok()) {
        if (offset != kNoOffset) allocator(initial).free(offset, size_bytes);
        return reserved.with_context(str_cat("residency: reserving NVMe space for partition ", id));
    }
    Partition& p = parts_[id];
    p = Partition{};
    p.registered = true;
    p.dtype = dtype;
    p.size_bytes = size_bytes;
    ++registered_count_;
    nvme_used_bytes_ += nvme_bytes;
    switch (initial) {
        case Tier::kNvme:
            p.nvme_valid = true;
            break;
        case Tier::kHost:
            p.host_offset = offset;
            p.host = Copy::kValid;
            std::memset(host_ptr(p), 0, size_bytes);
            break;
        case Tier::kDevice:
            p.device_offset = offset;
            p.device = Copy::kValid;
            ZINF_TRY(device_->fill_zero(device_ptr(p), size_bytes, 0));
            ZINF_TRY(device_->synchronize(0));
            break;
    }
    check_budgets();
    return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Trace

bool ResidencyManager::following_trace() const noexcept {
    return !trace_.empty() && !recording_on_;
}

std::uint64_t ResidencyManager::next_use(PartitionId id) const {
    return following_trace() ? trace_.next_use_distance(id, cursor_) : kNoNextUse;
}

void ResidencyManager::begin_iteration() {
    ZINF_ASSERT(!in_iteration_);
    in_iteration_ = true;
    cursor_ = 0;
    diverged_ = false;
    if (trace_.empty()) {
        recording_on_ = true;
        recording_.clear();
    }
}

void ResidencyManager::end_iteration() {
    ZINF_ASSERT(in_iteration_);
    if (!recording_on_ && cursor_ != trace_.size()) {
        // The iteration ended early: it followed the trace up to the cursor, so that prefix is
        // what this iteration accessed.
        ++stats_.trace_changes;
        log::warning("residency: access order changed: the iteration ended after ", cursor_,
                     " of the ", trace_.size(), " recorded accesses; re-recording the trace");
        recording_.assign(trace_.accesses().begin(),
                          trace_.accesses().begin() + static_cast<std::ptrdiff_t>(cursor_));
        recording_on_ = true;
    }
    if (recording_on_) {
        trace_.assign(recording_, parts_.size());
        trace_bytes_ = 0;
        for (const Access& a : trace_.accesses()) trace_bytes_ += part(a.id).size_bytes;
        ++stats_.trace_recordings;
        log::info("residency: recorded the access trace: ", trace_.size(), " accesses, ",
                  trace_bytes_, " bytes");
        recording_on_ = false;
    }
    in_iteration_ = false;
    diverged_ = false;
    cursor_ = 0;
    // Training repeats: start bringing in what the next iteration begins with.
    issue_prefetches();
}

void ResidencyManager::detect_change(std::size_t position, const Access& got) {
    ++stats_.trace_changes;
    if (position < trace_.size()) {
        const Access& expected = trace_.at(position);
        log::warning("residency: access order changed at access ", position, " of ", trace_.size(),
                     ": expected partition ", expected.id, " (", tier_name(expected.tier),
                     "), got ", got.id, " (", tier_name(got.tier),
                     "); prefetch paused, re-recording the trace");
    } else {
        log::warning("residency: access order changed: more than the ", trace_.size(),
                     " recorded accesses; prefetch paused, re-recording the trace");
    }
    // Re-record: this iteration so far followed the trace up to `position`.
    recording_.assign(trace_.accesses().begin(),
                      trace_.accesses().begin() + static_cast<std::ptrdiff_t>(position));
    recording_on_ = true;
    diverged_ = true;
}

void ResidencyManager::trace_access(PartitionId id, Tier tier) {
    if (!in_iteration_) return;
    const Access access{id, tier};
    if (recording_on_) {
        // Grows only past trace_capacity, and only in a recording iteration.
        recording_.push_back(access);
        return;
    }
    if (cursor_ < trace_.size() && trace_.at(cursor_) == access) {
        ++cursor_;
        return;
    }
    detect_change(cursor_, access);
    recording_.push_back(access);
}

// ---------------------------------------------------------------------------------------------
// Moves

Status ResidencyManager::start_move(PartitionId id, MoveKind kind, bool prefetch) {
    Partition& p = part(id);
    ZINF_ASSERT(!p.in_flight);
    ZINF_ASSERT_EQ(p.pin_count, 0u);
    Move move;
    move.kind = kind;
    move.id = id;
    move.size_bytes = p.size_bytes;
    Copy* filling = nullptr;
    Tier filling_tier = Tier::kHost;
    switch (kind) {
        case MoveKind::kSwapIn:
            ZINF_ASSERT(p.nvme_valid);
            ZINF_ASSERT(p.host == Copy::kAbsent);
            filling = &p.host;
            filling_tier = Tier::kHost;
            break;
        case MoveKind::kSwapOut:
            ZINF_ASSERT(p.host == Copy::kValid);
            ZINF_ASSERT(!p.nvme_valid);
            break;
        case MoveKind::kToDevice:
            ZINF_ASSERT(p.host == Copy::kValid);
            ZINF_ASSERT(p.device == Copy::kAbsent);
            filling = &p.device;
            filling_tier = Tier::kDevice;
            break;
        case MoveKind::kToHost:
            ZINF_ASSERT(p.device == Copy::kValid);
            ZINF_ASSERT(p.host == Copy::kAbsent);
            filling = &p.host;
            filling_tier = Tier::kHost;
            break;
    }
    // The extent being filled was allocated by the caller; the source copy is valid.
    move.host = host_ptr(p);
    if (kind == MoveKind::kToDevice || kind == MoveKind::kToHost) move.device = device_ptr(p);
    Result<MoveToken> token = mover_.start(move);
    if (!token.has_value()) {
        // Nothing started: give back the extent that was to be filled.
        if (filling != nullptr) {
            std::size_t& offset = filling_tier == Tier::kDevice ? p.device_offset : p.host_offset;
            allocator(filling_tier).free(offset, p.size_bytes);
            offset = kNoOffset;
        }
        return token.error();
    }
    if (filling != nullptr) *filling = Copy::kFilling;
    p.in_flight = true;
    p.op = kind;
    p.token = *token;
    p.op_is_prefetch = prefetch;
    ZINF_ASSERT_LT(in_flight_.size(), in_flight_.capacity());  // reserved: never reallocates
    in_flight_.push_back(id);
    if (prefetch) {
        ++stats_.prefetches_started;
        p.prefetched = true;
    }
    log::debug("residency: ", ms_since_created(), " ms: start ", move_kind_name(kind), " of ", id,
               prefetch ? " (prefetch)" : "", "; ", in_flight_.size(), " in flight");
    if (observer_ != nullptr) observer_->move_started(id, kind, prefetch, p.size_bytes);
    return Status::ok();
}

void ResidencyManager::complete_move(PartitionId id, const Status& status) {
    Partition& p = part(id);
    ZINF_ASSERT(p.in_flight);
    const auto it = std::find(in_flight_.begin(), in_flight_.end(), id);
    ZINF_ASSERT(it != in_flight_.end());
    in_flight_.erase(it);
    p.in_flight = false;
    log::debug("residency: ", ms_since_created(), " ms: done ", move_kind_name(p.op), " of ", id,
               status.is_ok() ? "" : " (failed)");
    if (observer_ != nullptr) observer_->move_completed(id, p.op, p.op_is_prefetch, status.is_ok());
    if (status.is_ok()) {
        switch (p.op) {
            case MoveKind::kSwapIn:
                ZINF_ASSERT(p.host == Copy::kFilling);
                p.host = Copy::kValid;
                stats_.bytes_swapped_in += p.size_bytes;
                break;
            case MoveKind::kSwapOut:
                ZINF_ASSERT(p.host == Copy::kValid);
                p.nvme_valid = true;
                stats_.bytes_swapped_out += p.size_bytes;
                break;
            case MoveKind::kToDevice:
                ZINF_ASSERT(p.device == Copy::kFilling);
                p.device = Copy::kValid;
                stats_.bytes_to_device += p.size_bytes;
                break;
            case MoveKind::kToHost:
                ZINF_ASSERT(p.host == Copy::kFilling);
                p.host = Copy::kValid;
                stats_.bytes_to_host += p.size_bytes;
                break;
        }
    } else {
        // Back to the state before the move: the copy being filled is discarded, the source
        // stays valid (a failed write-back leaves the copy dirty).
        ++stats_.failed_moves;
        switch (p.op) {
            case MoveKind::kSwapIn:
            case MoveKind::kToHost:
                ZINF_ASSERT(p.host == Copy::kFilling);
                host_alloc_.free(p.host_offset, p.size_bytes);
                p.host_offset = kNoOffset;
                p.host = Copy::kAbsent;
                break;
            case MoveKind::kToDevice:
                ZINF_ASSERT(p.device == Copy::kFilling);
                device_alloc_.free(p.device_offset, p.size_bytes);
                p.device_offset = kNoOffset;
                p.device = Copy::kAbsent;
                break;
            case MoveKind::kSwapOut:
                break;
        }
        if (p.op_is_prefetch) {
            log::warning("residency: prefetch of partition ", id, " failed (", move_kind_name(p.op),
                         "): ", status.to_string());
        }
    }
    check_budgets();
}

void ResidencyManager::defer(const Status& status) {
    if (!status.is_ok() && deferred_.is_ok()) deferred_ = status;
}

Status ResidencyManager::wait_move(PartitionId id) {
    if (id == kNoPartition) {
        ZINF_ASSERT(!in_flight_.empty());
        id = in_flight_.front();
    }
    Partition& p = part(id);
    ZINF_ASSERT(p.in_flight);
    Status status = mover_.wait(p.token);
    complete_move(id, status);
    return status;
}

void ResidencyManager::poll_moves_quietly() {
    std::size_t i = 0;
    // Bounded: each round either completes (and removes) a move or moves past it.
    const std::size_t bound = in_flight_.size();
    for (std::size_t round = 0; round <= bound && i < in_flight_.size(); ++round) {
        const PartitionId id = in_flight_[i];
        Result<bool> done = mover_.poll(parts_[id].token);
        if (!done.has_value()) {
            complete_move(id, done.error());  // logged there for prefetches
            defer(done.error());
        } else if (*done) {
            complete_move(id, Status::ok());
        } else {
            ++i;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Space

void ResidencyManager::drop_copy(PartitionId id, Tier tier) {
    Partition& p = part(id);
    ZINF_ASSERT(!p.in_flight);
    Copy& c = copy(p, tier);
    ZINF_ASSERT(c != Copy::kFilling);
    if (c == Copy::kAbsent) return;
    std::size_t& offset = tier == Tier::kDevice ? p.device_offset : p.host_offset;
    allocator(tier).free(offset, p.size_bytes);
    offset = kNoOffset;
    c = Copy::kAbsent;
}

Result<std::optional<std::size_t>> ResidencyManager::make_room(Tier tier, std::size_t size_bytes,
                                                               PartitionId for_id, bool prefetch,
                                                               std::uint64_t max_distance) {
    ExtentAllocator& alloc = allocator(tier);
    if (alloc.rounded(size_bytes) > alloc.capacity_bytes()) {
        return Status::no_space(str_cat("residency: partition ", for_id, " (", size_bytes,
                                        " bytes) is larger than the ", tier_name(tier),
                                        " budget of ", alloc.capacity_bytes(), " bytes"));
    }
    const std::size_t bound = loop_bound();
    for (std::size_t step = 0; step < bound; ++step) {
        if (const std::optional<std::size_t> offset = alloc.allocate(size_bytes)) {
            // Checked by the caller once the extent is recorded in its partition.
            note_allocation(tier);
            return offset;
        }
        collect_candidates(tier, for_id, prefetch, max_distance);
        // A prefetch evicts only when evicting every candidate would make room: dropping copies
        // and then finding no room anyway (a large partition, the rest of the tier pinned, in
        // flight or needed sooner) only made the next poll read them again, over and over.
        if (prefetch && step == 0 && !room_after_evicting(alloc, tier, size_bytes)) {
            return std::optional<std::size_t>();
        }
        if (candidates_.empty()) {
            // Not an error, and common: no Status (which would allocate) on this path.
            if (prefetch) return std::optional<std::size_t>();
            if (!in_flight_.empty()) {
                // Copies on their way in or out become evictable once they land.
                defer(wait_move(kNoPartition));
                continue;
            }
            return Status::no_space(str_cat("residency: no room for partition ", for_id, " (",
                                            size_bytes, " bytes) in the ", tier_name(tier),
                                            " tier: budget ", alloc.capacity_bytes(), " bytes, ",
                                            alloc.used_bytes(), " in use by acquired partitions"));
        }
        const EvictionCandidate victim = candidates_[choose_victim(candidates_, eviction_policy())];
        if (victim.write_back_bytes == 0) {
            ZINF_ASSERT(!is_dirty(parts_[victim.id], tier));
            drop_copy(victim.id, tier);
            ++stats_.drops;
            check_budgets();
            continue;
        }
        ZINF_TRY(write_back(victim.id, tier));
    }
    ZINF_ASSERT_MSG(false, str_cat("residency: make_room did not converge in ", bound, " rounds"));
    return Status::internal("unreachable");
}

void ResidencyManager::collect_candidates(Tier tier, PartitionId for_id, bool prefetch,
                                          std::uint64_t max_distance) {
    candidates_.clear();
    for (PartitionId id = 0; id < parts_.size(); ++id) {
        const Partition& p = parts_[id];
        if (!p.registered || id == for_id || id == keep_ || p.in_flight) continue;
        if (copy(p, tier) != Copy::kValid) continue;
        const bool dirty = is_dirty(p, tier);
        // An acquired partition keeps its copy in the acquired tier; its clean copies in other
        // tiers may go (dropping starts no move on it, writing back would).
        if (p.pin_count > 0 && (p.pinned_tier == tier || dirty)) continue;
        std::uint64_t distance = next_use(id);
        // A host copy beside a valid device copy is not what the next access reads (the device
        // copy serves it): it only saves a read if the device copy is dropped before then.
        // Ranked behind every host copy an access will read, or the copies prefetched for the
        // next accesses are the ones evicted, and read again (a host tier about the size of the
        // prefetch window read each byte ~2.4 times per step that way).
        if (tier == Tier::kHost && p.device == Copy::kValid && distance != kNoNextUse) {
            distance += trace_.size();
        }
        // A prefetch never writes back and never evicts what is needed as soon as (or sooner
        // than) what it brings in.
        if (prefetch && (dirty || distance <= max_distance)) continue;
        candidates_.push_back(
            EvictionCandidate{id, distance, p.last_use_tick, dirty ? p.size_bytes : 0u});
    }
}

EvictionPolicy ResidencyManager::eviction_policy() const noexcept {
    EvictionPolicy policy;
    policy.use_trace = following_trace();
    policy.bytes_per_access =
        trace_.empty()
            ? 1.0
            : std::max(1.0, static_cast<double>(trace_bytes_) / static_cast<double>(trace_.size()));
    policy.dirty_weight = options_.dirty_weight;
    return policy;
}

// Writes the dirty copy of `id` in `tier` one tier down (making room on the host for a device
// copy first) and waits for it: the copy is then clean, to be dropped on make_room's next round.
// A busy mover is waited on instead (its oldest move), and the next round tries again.
Status ResidencyManager::write_back(PartitionId id, Tier tier) {
    Partition& v = part(id);
    Status started;
    if (tier == Tier::kDevice) {
        ZINF_ASSIGN_OR_RETURN(const std::optional<std::size_t> room,
                              make_room(Tier::kHost, v.size_bytes, id, false, 0));
        v.host_offset = room.value();
        started = start_move(id, MoveKind::kToHost, false);
    } else {
        started = start_move(id, MoveKind::kSwapOut, false);
    }
    if (started.code() == StatusCode::kBusy) {
        ZINF_ASSERT(!in_flight_.empty());
        defer(wait_move(kNoPartition));
        return Status::ok();
    }
    ZINF_TRY(started);
    ++stats_.write_backs;
    if (Status waited = wait_move(id); !waited.is_ok()) {
        return waited.with_context(str_cat("residency: writing back partition ", id));
    }
    return Status::ok();
}

bool ResidencyManager::room_after_evicting(const ExtentAllocator& alloc, Tier tier,
                                           std::size_t size_bytes) {
    extents_.clear();
    const std::span<const ExtentAllocator::Extent> free = alloc.free_extents();
    extents_.insert(extents_.end(), free.begin(), free.end());
    for (const EvictionCandidate& c : candidates_) {
        const Partition& p = parts_[c.id];
        extents_.push_back(
            {tier == Tier::kDevice ? p.device_offset : p.host_offset, alloc.rounded(p.size_bytes)});
    }
    std::sort(extents_.begin(), extents_.end(),
              [](const auto& a, const auto& b) { return a.offset_bytes < b.offset_bytes; });
    const std::size_t need = alloc.rounded(size_bytes);
    std::size_t run_start = 0;
    std::size_t run_end = 0;
    for (const ExtentAllocator::Extent& e : extents_) {
        if (e.offset_bytes != run_end) run_start = e.offset_bytes;
        run_end = e.offset_bytes + e.size_bytes;
        if (run_end - run_start >= need) return true;
    }
    return false;
}

// ---------------------------------------------------------------------------------------------
// Residency

Result<ResidencyManager::Step> ResidencyManager::step_toward(PartitionId id, Tier tier,
                                                             bool prefetch,
                                                             std::uint64_t distance) {
    Partition& p = part(id);
    ZINF_ASSERT(tier != Tier::kNvme);
    if (p.source != nullptr) {
        // Staged bytes: copied into the host tier, never read; a device access goes on from
        // there below (its copy to the device before the write behind).
        ZINF_ASSIGN_OR_RETURN(const bool taken, take_source(id, prefetch, distance));
        if (!taken) return Step::kNoRoom;
        if (valid(p, tier)) return Step::kTaken;
    }
    if (valid(p, tier) || p.in_flight) return Step::kNothingToDo;
    ZINF_ASSERT(p.device != Copy::kFilling);
    ZINF_ASSERT(p.host != Copy::kFilling);
    // Checked here rather than met as kBusy from the mover: no room is made for a move that
    // cannot start, and no Status is built on this common path.
    if (in_flight_.size() >= mover_.max_in_flight()) return Step::kMoverBusy;
    MoveKind kind;
    Tier room_tier;
    if (tier == Tier::kDevice) {
        if (p.host == Copy::kValid) {
            kind = MoveKind::kToDevice;
            room_tier = Tier::kDevice;
        } else {
            ZINF_ASSERT_MSG(p.nvme_valid, str_cat("partition ", id, " has no valid copy"));
            kind = MoveKind::kSwapIn;
            room_tier = Tier::kHost;
        }
    } else {
        // A device copy (even a clean one) is a cheaper source than NVMe.
        kind = p.device == Copy::kValid ? MoveKind::kToHost : MoveKind::kSwapIn;
        if (kind == MoveKind::kSwapIn)
            ZINF_ASSERT_MSG(p.nvme_valid, str_cat("partition ", id, " has no valid copy"));
        room_tier = Tier::kHost;
    }
    // The source copy must survive the room-making: a dirty victim written back to the host
    // tier could otherwise evict it.
    ZINF_ASSERT_EQ(keep_, kNoPartition);
    keep_ = id;
    Result<std::optional<std::size_t>> room =
        make_room(room_tier, p.size_bytes, id, prefetch, distance);
    keep_ = kNoPartition;
    if (!room.has_value()) return room.error();
    if (!room->has_value()) {
        ZINF_ASSERT(prefetch);
        return Step::kNoRoom;
    }
    // make_room may have waited and completed moves; `p` is still ours (nothing else moves it).
    (room_tier == Tier::kDevice ? p.device_offset : p.host_offset) = **room;
    const Status started = start_move(id, kind, prefetch);
    if (started.code() == StatusCode::kBusy) return Step::kMoverBusy;
    ZINF_TRY(started);
    return Step::kStarted;
}

Status ResidencyManager::ensure_resident(PartitionId id, Tier tier) {
    const std::size_t bound = loop_bound();
    for (std::size_t step = 0; step < bound; ++step) {
        Partition& p = part(id);
        if (p.in_flight) {
            if (Status waited = wait_move(id); !waited.is_ok()) {
                return waited.with_context(str_cat("residency: acquiring partition ", id));
            }
            continue;
        }
        if (valid(p, tier)) return Status::ok();
        ZINF_ASSIGN_OR_RETURN(const Step step_taken, step_toward(id, tier, false, 0));
        ZINF_ASSERT(step_taken != Step::kNoRoom);  // demand makes room or fails
        ZINF_ASSERT(step_taken != Step::kNothingToDo);
        if (step_taken == Step::kTaken) continue;  // resident now
        if (step_taken == Step::kMoverBusy) {
            // The mover is saturated: let its oldest move finish.
            ZINF_ASSERT(!in_flight_.empty());
            defer(wait_move(kNoPartition));
            continue;
        }
        // Queue what comes next behind the demand move before blocking on it.
        issue_prefetches();
        if (Status waited = wait_move(id); !waited.is_ok()) {
            return waited.with_context(str_cat("residency: acquiring partition ", id));
        }
    }
    ZINF_ASSERT_MSG(false, str_cat("residency: acquire of partition ", id, " did not converge in ",
                                   bound, " steps"));
    return Status::internal("unreachable");
}

void ResidencyManager::issue_prefetches() {
    if (!following_trace()) {
        start_writes_behind();
        return;
    }
    const std::size_t n = trace_.size();
    const std::uint64_t depth_bytes = options_.prefetch_depth_bytes();
    const std::uint64_t max_live_bytes = options_.max_live_bytes();
    std::uint64_t bytes_ahead = 0;
    // Live device bytes: what is acquired on the device, plus every device access of the window
    // up to here, whatever its state: those reach the device before anything further does, so
    // their room is reserved even while they are still on their way to the host.
    std::uint64_t live_bytes = pinned_device_bytes_;
    bool live_full = false;
    for (std::size_t k = 0; k < n; ++k) {
        const Access& a = trace_.at((cursor_ + k) % n);
        Partition& p = part(a.id);
        // The bucket counts the bytes still to be fetched (as DeepSpeed's counts parameters
        // not yet available): resident accesses do not use it up, so the window reaches past
        // a run of them and the disk keeps working while they are computed on. The first access
        // to fetch is always in the window, however small the bucket.
        if (!valid(p, a.tier)) {
            if (bytes_ahead > 0 && bytes_ahead + p.size_bytes > depth_bytes) break;
            bytes_ahead += p.size_bytes;
        }
        if (p.pin_count > 0 || p.prefetch_blocked) continue;
        bool may_reach_device = false;
        if (a.tier == Tier::kDevice && !live_full) {
            if (live_bytes + p.size_bytes <= max_live_bytes) {
                live_bytes += p.size_bytes;
                may_reach_device = true;
            } else {
                live_full = true;  // nothing further may jump the queue
            }
        }
        if (valid(p, a.tier) || p.in_flight) continue;
        // Past the live bound a device access is still staged on the host (a staged
        // partition is taken there, no further).
        if (a.tier == Tier::kDevice && p.host == Copy::kValid && !may_reach_device) continue;
        const Tier step_tier = a.tier == Tier::kDevice && !may_reach_device ? Tier::kHost : a.tier;
        Result<Step> step = step_toward(a.id, step_tier, true, k);
        if (!step.has_value()) {
            log::warning("residency: prefetch of partition ", a.id,
                         " not started: ", step.error().to_string());
            p.prefetch_blocked = true;
            continue;
        }
        // No free move: nothing further can start either. No room for this step (say, no
        // device room while it waits on the host): a later access may still need a step
        // that has room (a read into a free pinned buffer), so that the disk keeps working.
        if (*step == Step::kMoverBusy) break;
    }
    // After the accesses' moves: a partition's copy to the device goes before its write.
    start_writes_behind();
}

Result<bool> ResidencyManager::take_source(PartitionId id, bool prefetch, std::uint64_t distance) {
    Partition& p = part(id);
    ZINF_ASSERT(p.source != nullptr);
    ZINF_ASSERT(!p.in_flight);
    ZINF_ASSERT_EQ(keep_, kNoPartition);
    keep_ = id;
    Result<std::optional<std::size_t>> room =
        make_room(Tier::kHost, p.size_bytes, id, prefetch, distance);
    keep_ = kNoPartition;
    if (!room.has_value()) return room.error();
    if (!room->has_value()) return false;
    p.host_offset = **room;
    std::memcpy(host_ptr(p), p.source, p.size_bytes);
    p.host = Copy::kValid;  // dirty: the only copy
    p.source = nullptr;
    --staged_count_;
    ++stats_.staged_taken;
    if (!p.write_behind) {
        p.write_behind = true;
        ZINF_ASSERT_LT(write_behind_.size(), write_behind_.capacity());  // never reallocates
        write_behind_.push_back(id);
    }
    check_budgets();
    return true;
}

void ResidencyManager::start_writes_behind() {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < write_behind_.size(); ++i) {
        const PartitionId id = write_behind_[i];
        Partition& p = parts_[id];
        if (!p.write_behind || !is_dirty(p, Tier::kHost)) {
            // Written already (evicted, flushed), or replaced since (overwritten, or a newer
            // device copy that its own eviction writes).
            p.write_behind = false;
            continue;
        }
        const bool free_mover = in_flight_.size() < mover_.max_in_flight();
        if (p.in_flight || p.pin_count > 0 || !free_mover) {
            write_behind_[kept++] = id;  // later
            continue;
        }
        const Status started = start_move(id, MoveKind::kSwapOut, false);
        if (started.code() == StatusCode::kBusy) {
            write_behind_[kept++] = id;
            continue;
        }
        p.write_behind = false;
        if (!started.is_ok()) {
            defer(started);  // stays dirty: eviction or flush writes it and reports
            continue;
        }
        ++stats_.written_behind;
    }
    write_behind_.resize(kept);
}

Status ResidencyManager::stage_overwrite(PartitionId id, const std::byte* source) {
    ZINF_ASSERT(source != nullptr);
    Partition& p = part(id);
    ZINF_ASSERT(p.registered);
    ZINF_ASSERT_EQ(p.pin_count, 0u);
    if (!deferred_.is_ok()) return std::exchange(deferred_, Status());
    poll_moves_quietly();
    if (p.in_flight) {
        // A prefetch or a write-back of the old bytes: let it land before they are dropped.
        if (Status waited = wait_move(id); !waited.is_ok()) {
            return waited.with_context(str_cat("residency: staging partition ", id));
        }
    }
    drop_copy(id, Tier::kDevice);
    drop_copy(id, Tier::kHost);
    p.nvme_valid = false;
    if (p.write_behind) {
        p.write_behind = false;
        write_behind_.erase(std::find(write_behind_.begin(), write_behind_.end(), id));
    }
    if (p.source == nullptr) ++staged_count_;
    p.source = source;
    p.prefetch_blocked = false;
    ++stats_.staged;
    check_budgets();
    return Status::ok();
}

Status ResidencyManager::take_staged() {
    // Every source first (the caller frees or reuses them next), then a deferred failure.
    for (PartitionId id = 0; id < parts_.size() && staged_count_ > 0; ++id) {
        if (!parts_[id].registered || parts_[id].source == nullptr) continue;
        ZINF_ASSIGN_OR_RETURN(const bool taken, take_source(id, false, 0));
        ZINF_ASSERT(taken);  // demand makes room or fails
        start_writes_behind();
    }
    if (!deferred_.is_ok()) return std::exchange(deferred_, Status());
    return Status::ok();
}

void* ResidencyManager::pin_resident(Partition& p, Tier tier) {
    ++p.pin_count;
    p.pinned_tier = tier;
    p.prefetch_blocked = false;
    p.prefetched = false;
    p.last_use_tick = ++tick_;
    issue_prefetches();
    check_budgets();
    return tier == Tier::kDevice ? static_cast<void*>(device_ptr(p))
                                 : static_cast<void*>(host_ptr(p));
}

Result<void*> ResidencyManager::acquire(PartitionId id, Tier tier) {
    ZINF_ASSERT(tier != Tier::kNvme);
    Partition& p = part(id);
    if (tier == Tier::kDevice) ZINF_ASSERT(device_region_ != nullptr);
    if (p.pin_count > 0)
        ZINF_ASSERT_MSG(p.pinned_tier == tier,
                        str_cat("partition ", id, " is acquired in another tier"));
    // A move nobody waited for (a prefetch, a write-back on the way) failed since the last
    // acquire: report it once here, so that no I/O error goes unseen; the data is intact (the
    // failed copy was discarded) and the next acquire retries.
    if (!deferred_.is_ok()) return std::exchange(deferred_, Status());
    ++stats_.acquires;
    trace_access(id, tier);
    poll_moves_quietly();
    // Counted as live from now: prefetches issued while it is fetched must leave room for it.
    const bool first_pin_on_device = p.pin_count == 0 && tier == Tier::kDevice;
    if (first_pin_on_device) pinned_device_bytes_ += p.size_bytes;
    if (valid(p, tier) && !p.in_flight) {
        ++stats_.hits;
    } else {
        if (p.in_flight || p.prefetched) {
            ++stats_.late;
        } else {
            ++stats_.misses;
        }
        const auto start = std::chrono::steady_clock::now();
        const Status status = ensure_resident(id, tier);
        stats_.stall_time += std::chrono::steady_clock::now() - start;
        log::debug(
            "residency: ", ms_since_created(), " ms: acquire of ", id, " stalled ",
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count(),
            " ms");
        if (!status.is_ok()) {
            if (first_pin_on_device) pinned_device_bytes_ -= p.size_bytes;
            return status;
        }
    }
    ZINF_ASSERT(valid(p, tier));
    ZINF_ASSERT(!p.in_flight);
    return pin_resident(p, tier);
}

Result<void*> ResidencyManager::acquire_for_overwrite(PartitionId id, Tier tier) {
    ZINF_ASSERT(tier != Tier::kNvme);
    Partition& p = part(id);
    if (tier == Tier::kDevice) ZINF_ASSERT(device_region_ != nullptr);
    // Acquired already (the caller's own reference): the bytes it holds are the ones replaced.
    if (p.pin_count > 0) return acquire(id, tier);
    if (!deferred_.is_ok()) return std::exchange(deferred_, Status());
    ++stats_.acquires;
    trace_access(id, tier);
    poll_moves_quietly();
    if (p.in_flight) {
        // A prefetch or a write-back of the old bytes: let it land before they are replaced.
        const auto start = std::chrono::steady_clock::now();
        const Status waited = wait_move(id);
        stats_.stall_time += std::chrono::steady_clock::now() - start;
        if (!waited.is_ok()) {
            return waited.with_context(str_cat("residency: overwriting partition ", id));
        }
    }
    const bool first_pin_on_device = tier == Tier::kDevice;
    if (first_pin_on_device) pinned_device_bytes_ += p.size_bytes;
    if (valid(p, tier)) {
        ++stats_.hits;
    } else {
        ++stats_.misses;
        ZINF_ASSERT_EQ(keep_, kNoPartition);
        keep_ = id;
        Result<std::optional<std::size_t>> room = make_room(tier, p.size_bytes, id, false, 0);
        keep_ = kNoPartition;
        if (!room.has_value()) {
            if (first_pin_on_device) pinned_device_bytes_ -= p.size_bytes;
            return room.error().with_context(str_cat("residency: overwriting partition ", id));
        }
        // make_room may have completed moves; none of them was of `p` (kept, not in flight).
        ZINF_ASSERT(!p.in_flight);
        (tier == Tier::kDevice ? p.device_offset : p.host_offset) = room->value();
        copy(p, tier) = Copy::kValid;
    }
    // The copy in `tier` is the partition now: the others would be stale once it is written.
    for (const Tier other : {Tier::kDevice, Tier::kHost}) {
        if (other != tier) drop_copy(id, other);
    }
    p.nvme_valid = false;
    if (p.source != nullptr) {  // superseded
        p.source = nullptr;
        --staged_count_;
    }
    return pin_resident(p, tier);
}

void ResidencyManager::release(PartitionId id, bool dirty) {
    Partition& p = part(id);
    ZINF_ASSERT_GT(p.pin_count, 0u);
    ZINF_ASSERT(!p.in_flight);  // nothing starts on an acquired partition
    const Tier tier = p.pinned_tier;
    ZINF_ASSERT(valid(p, tier));
    if (dirty) {
        // The acquired copy is now the only current one.
        for (const Tier other : {Tier::kDevice, Tier::kHost}) {
            if (other != tier) drop_copy(id, other);
        }
        p.nvme_valid = false;
    }
    --p.pin_count;
    if (p.pin_count == 0 && tier == Tier::kDevice) {
        ZINF_ASSERT_GE(pinned_device_bytes_, p.size_bytes);
        pinned_device_bytes_ -= p.size_bytes;
    }
    p.last_use_tick = ++tick_;
    poll_moves_quietly();
    issue_prefetches();
    check_budgets();
}

Status ResidencyManager::poll() {
    poll_moves_quietly();
    issue_prefetches();
    check_budgets();
    return Status::ok();
}

Status ResidencyManager::drain() {
    Status first;
    const std::size_t bound = in_flight_.size();
    for (std::size_t i = 0; i < bound && !in_flight_.empty(); ++i) {
        Status status = wait_move(kNoPartition);
        if (!status.is_ok() && first.is_ok()) first = std::move(status);
    }
    ZINF_ASSERT(in_flight_.empty());
    return first;
}

Status ResidencyManager::flush() {
    if (!deferred_.is_ok()) return std::exchange(deferred_, Status());
    ZINF_TRY(take_staged());
    ZINF_TRY(drain());
    for (PartitionId id = 0; id < parts_.size(); ++id) {
        if (!parts_[id].registered) continue;
        ZINF_ASSERT_EQ(parts_[id].pin_count, 0u);
        const std::size_t bound = loop_bound();
        std::size_t step = 0;
        for (; step < bound; ++step) {
            Partition& p = parts_[id];
            Status started;
            if (is_dirty(p, Tier::kDevice)) {
                ZINF_ASSIGN_OR_RETURN(const std::optional<std::size_t> room,
                                      make_room(Tier::kHost, p.size_bytes, id, false, 0));
                p.host_offset = room.value();
                started = start_move(id, MoveKind::kToHost, false);
            } else if (is_dirty(p, Tier::kHost)) {
                started = start_move(id, MoveKind::kSwapOut, false);
            } else {
                break;
            }
            if (started.code() == StatusCode::kBusy) {
                defer(wait_move(kNoPartition));
                continue;
            }
            ZINF_TRY(started);
            if (Status waited = wait_move(id); !waited.is_ok()) {
                return waited.with_context(str_cat("residency: flushing partition ", id));
            }
        }
        ZINF_ASSERT_LT(step, bound);
        ZINF_ASSERT(parts_[id].nvme_valid);
    }
    return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Queries

PartitionState ResidencyManager::state(PartitionId id) const {
    const Partition& p = part(id);
    if (p.in_flight) {
        switch (p.op) {
            case MoveKind::kSwapIn:
                return PartitionState::kReading;
            case MoveKind::kSwapOut:
                return PartitionState::kWriting;
            case MoveKind::kToDevice:
                return PartitionState::kCopyingToDevice;
            case MoveKind::kToHost:
                return PartitionState::kCopyingToHost;
        }
    }
    if (p.device == Copy::kValid)
        return is_dirty(p, Tier::kDevice) ? PartitionState::kDirty : PartitionState::kOnDevice;
    if (p.host == Copy::kValid)
        return is_dirty(p, Tier::kHost) ? PartitionState::kDirty : PartitionState::kOnHost;
    if (p.source != nullptr) return PartitionState::kStaged;
    ZINF_ASSERT(p.nvme_valid);
    return PartitionState::kOnNvme;
}

bool ResidencyManager::is_resident(PartitionId id, Tier tier) const {
    const Partition& p = part(id);
    return valid(p, tier);
}

ResidencyStats ResidencyManager::stats() const {
    ResidencyStats s = stats_;
    s.tiers[0] =
        TierStats{options_.device_budget_bytes, device_alloc_.used_bytes(), peak_bytes_[0]};
    s.tiers[1] = TierStats{options_.host_budget_bytes, host_alloc_.used_bytes(), peak_bytes_[1]};
    s.tiers[2] = TierStats{static_cast<std::size_t>(std::min<std::uint64_t>(
                               options_.nvme_budget_bytes, ~std::size_t{0})),
                           static_cast<std::size_t>(nvme_used_bytes_),
                           static_cast<std::size_t>(nvme_used_bytes_)};
    return s;
}

std::string ResidencyManager::stats_summary() const {
    const ResidencyStats s = stats();
    return str_cat("peak device ", s.tiers[0].peak_bytes, "/", s.tiers[0].budget_bytes, " B, host ",
                   s.tiers[1].peak_bytes, "/", s.tiers[1].budget_bytes, " B; swapped in ",
                   s.bytes_swapped_in, " B, out ", s.bytes_swapped_out, " B, to device ",
                   s.bytes_to_device, " B, to host ", s.bytes_to_host, " B; acquires ", s.acquires,
                   " (hits ", s.hits, ", late ", s.late, ", misses ", s.misses, "); drops ",
                   s.drops, ", write-backs ", s.write_backs, "; staged ", s.staged, " (taken ",
                   s.staged_taken, ", written behind ", s.written_behind, "); stall ",
                   std::chrono::duration<double, std::milli>(s.stall_time).count(), " ms; traces ",
                   s.trace_recordings, ", order changes ", s.trace_changes);
}

}  // namespace zinf::tier
