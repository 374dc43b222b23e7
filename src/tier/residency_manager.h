// ResidencyManager: decides when each partition moves between the device, host and NVMe tiers,
// under hard per-tier budgets, and asks a tier::Mover to move it. The first iteration records the
// access trace; later iterations prefetch along it and evict by Belady (furthest next use, with a
// write-back penalty for dirty copies); without a trace, eviction is LRU. A change in the access
// order is detected, logged once and the trace re-recorded.
//
// Memory: one region per tier, carved at create and never grown: the host tier is the mover's
// host_region() (pinned where a device exists), the device tier one Device::allocate of the
// device budget. Every partition has a home on NVMe reserved at registration, so the NVMe tier
// never evicts; the device and host tiers hold copies.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "src/base/device.h"
#include "src/base/device_buffer.h"
#include "src/base/dtype.h"
#include "src/base/status.h"
#include "src/tier/access_trace.h"
#include "src/tier/eviction.h"
#include "src/tier/extent_allocator.h"
#include "src/tier/mover.h"
#include "src/tier/types.h"

namespace zinf::tier {

struct ResidencyOptions {
    // Hard budgets, bytes. The device tier needs a Device (create's `device`) when > 0. The host
    // budget must fit in the mover's host region. The NVMe budget bounds the homes reserved.
    std::size_t device_budget_bytes = 0;
    std::size_t host_budget_bytes = 0;
    std::uint64_t nvme_budget_bytes = ~std::uint64_t{0};

    // DeepSpeed's units (elements of `dtype`), converted to bytes inside:
    // prefetch depth = stage3_prefetch_bucket_size × dtype size: bytes of upcoming accesses
    // (counted along the trace from the next access) that are prefetched.
    std::uint64_t prefetch_bucket_numel = 50'000'000;
    // Bound on device bytes that are live (in use, arriving, or prefetched and not yet used):
    // stage3_max_live_parameters × dtype size. Prefetch stops at it.
    std::uint64_t max_live_numel = 1'000'000'000;
    DType dtype = DType::kFloat16;

    // Partition ids are dense: [0, partition_capacity). Sizes the tables once.
    std::size_t partition_capacity = 1024;
    // Accesses per iteration reserved for recording the trace (it may grow beyond, during
    // recording iterations only).
    std::size_t trace_capacity = 1 << 14;
    // Alignment of partitions' device extents.
    std::size_t device_alignment_bytes = 256;
    // Weight of the write-back penalty in Belady's choice (see eviction.h); 0 disables it.
    double dirty_weight = 1.0;
    // Run the O(partitions) consistency checks (every extent accounted for, no partition without
    // a copy) after every change, in release builds too (debug builds always do). For tests.
    bool check_invariants = false;

    std::uint64_t prefetch_depth_bytes() const noexcept {
        return prefetch_bucket_numel * dtype_size_bytes(dtype);
    }
    std::uint64_t max_live_bytes() const noexcept {
        return max_live_numel * dtype_size_bytes(dtype);
    }
};

// What a partition is doing, from the point of view of its fastest copy.
enum class PartitionState : std::uint8_t {
    kOnNvme,           // only the NVMe copy is valid
    kReading,          // being swapped in, NVMe → host
    kOnHost,           // fastest valid copy on host, also valid below (clean)
    kCopyingToDevice,  // host → device
    kOnDevice,         // fastest valid copy on device, also valid below (clean)
    kDirty,            // fastest valid copy (device or host) is newer than every copy below it
    kWriting,          // being written back, host → NVMe
    kCopyingToHost,    // being written back, device → host
    kStaged,           // its newest bytes are the caller's (stage_overwrite), not yet taken
};
std::string_view partition_state_name(PartitionState state) noexcept;

struct TierStats {
    std::size_t budget_bytes = 0;
    std::size_t used_bytes = 0;
    std::size_t peak_bytes = 0;
};

struct ResidencyStats {
    TierStats tiers[kTierCount];  // indexed by Tier
    // Bytes moved, per direction (NVMe moves count the partition's size, not the padding).
    std::uint64_t bytes_swapped_in = 0;   // NVMe → host
    std::uint64_t bytes_swapped_out = 0;  // host → NVMe
    std::uint64_t bytes_to_device = 0;    // host → device
    std::uint64_t bytes_to_host = 0;      // device → host
    std::uint64_t acquires = 0;
    std::uint64_t hits = 0;                // resident in the asked tier on arrival
    std::uint64_t late = 0;                // prefetch had started moving it, not finished
    std::uint64_t misses = 0;              // no prefetch had started: acquire fetched it
    std::uint64_t prefetches_started = 0;  // moves started by prefetch
    std::uint64_t drops = 0;               // clean copies evicted (no write needed)
    std::uint64_t write_backs = 0;         // dirty copies written one tier down to evict them
    std::uint64_t staged = 0;              // stage_overwrite calls
    std::uint64_t staged_taken = 0;        // staged bytes copied into the host tier (no read)
    std::uint64_t written_behind = 0;      // writes of taken bytes started beside what follows
    std::uint64_t failed_moves = 0;
    std::uint64_t trace_recordings = 0;      // traces adopted
    std::uint64_t trace_changes = 0;         // changes of access order detected
    std::chrono::nanoseconds stall_time{0};  // time acquire() spent blocked
};

// Sees the moves the manager starts and completes (zinfinity-train draws them in its trace).
// Called on the manager's thread; completion is when the manager notices it (poll, acquire,
// wait). Must not call back into the manager.
class MoveObserver {
public:
    virtual ~MoveObserver() = default;
    virtual void move_started(PartitionId id, MoveKind kind, bool prefetch,
                              std::size_t size_bytes) = 0;
    virtual void move_completed(PartitionId id, MoveKind kind, bool prefetch, bool ok) = 0;
};

// Thread-compatible: one thread (the computing thread) calls it. Moves run asynchronously in the
// mover; their completion is noticed in acquire(), release(), poll() and wait calls.
class ResidencyManager {
public:
    // `mover` and `device` are borrowed and must outlive the manager. `device` may be null when
    // device_budget_bytes is 0. Allocates the device region (Device::allocate) and every table.
    // Errors: kInvalidArgument (bad options: host budget beyond the mover's region, ...),
    // kNoSpace (the device budget cannot be allocated).
    static Result<std::unique_ptr<ResidencyManager>> create(const ResidencyOptions& options,
                                                            Mover& mover, Device* device);
    // Waits for every move in flight, then frees the device region. Asserts nothing is acquired.
    ~ResidencyManager();
    ResidencyManager(const ResidencyManager&) = delete;
    ResidencyManager& operator=(const ResidencyManager&) = delete;

    // Declares a partition and reserves its NVMe home through the mover. `initial`:
    //  - kNvme: its bytes already are in its NVMe home (written through the mover's store).
    //  - kHost / kDevice: it starts as a zero-filled, dirty copy there (space is made as for an
    //    acquire); write it with acquire() + release(dirty = true).
    // Not for the hot path. Errors: kInvalidArgument (id out of range or registered twice, size
    // 0), kNoSpace (NVMe budget, or the mover's space, or no room in the initial tier).
    Status register_partition(PartitionId id, std::size_t size_bytes, DType dtype, Tier initial);

    // Delimit one iteration (training step). The first iteration records the trace; later ones
    // follow it. Accesses outside an iteration are neither recorded nor checked.
    void begin_iteration();
    void end_iteration();

    // Makes the partition resident in `tier` (kDevice or kHost), blocking until it is, pins it
    // there and returns its address in that tier (device memory for kDevice). Advances the trace,
    // starts prefetches of what comes next, and evicts (Belady or LRU) to make room. The pointer
    // is valid until release(). A partition is acquired in one tier at a time (asserted);
    // acquiring it again in the same tier nests. Errors: kNoSpace (what is acquired does not fit
    // in the budget), the mover's error for a failed move (the partition stays as it was before
    // the failed move, so a retry is possible), and — once, before anything else happens — the
    // error of a background move (prefetch, write-back) that failed since the last acquire or
    // flush: no I/O error goes unreported, and every byte stays as it was.
    Result<void*> acquire(PartitionId id, Tier tier);
    // As acquire, for a caller that replaces every byte of the partition: a copy already in
    // `tier` is pinned as it is; otherwise room is made there and nothing is read (no swap-in),
    // the bytes undefined until the caller writes them. Every other copy is dropped at once
    // (the one in `tier` is the partition from now on) and the caller must release(id, true)
    // after writing all of it. A partition acquired already is acquired again as by acquire
    // (its copy is the one overwritten). Errors: as acquire (kNoSpace, a deferred background
    // failure; a move of it in flight is waited for).
    Result<void*> acquire_for_overwrite(PartitionId id, Tier tier);
    // Replaces every byte of the partition with `source` (host memory outside the tiers, of
    // size_bytes), without copying or writing anything now: every copy is dropped (NVMe's too,
    // stale from here), and the next access of the partition (a prefetch along the trace, an
    // acquire, flush, take_staged) copies the bytes into the host tier instead of reading them,
    // then writes them down to NVMe beside what follows (as a prefetch: when the mover has
    // room, never waited for by the computing thread unless it needs the partition's slot).
    // `source` stays the caller's and must not change until the partition is taken. A later
    // acquire_for_overwrite supersedes it. Precondition: not acquired. Waits for a move of the
    // partition in flight (the old bytes'). Errors: a deferred background failure (as acquire),
    // that move's error.
    Status stage_overwrite(PartitionId id, const std::byte* source);
    // Takes every staged partition not yet taken (into the host tier, written behind): after it
    // no source is read again and the caller may reuse them. Precondition: nothing acquired
    // that room must be made past. Errors: as acquire.
    Status take_staged();
    std::size_t staged_count() const noexcept { return staged_count_; }

    // Unpins. `dirty`: the bytes were modified in the acquired tier; every other copy becomes
    // stale and is dropped (it is written back when evicted or flushed). On a device with
    // several streams (a GPU), the caller's own work on a kDevice copy, reads included, must be
    // finished before release (synchronise its stream): the mover's stream does not wait for
    // it, and the extent may be reused or copied out at once.
    void release(PartitionId id, bool dirty);

    // Notices completed moves and issues prefetches; never blocks. Call it from long compute
    // loops to keep the pipeline moving; acquire() and release() call it too.
    Status poll();
    // Writes every dirty copy down to NVMe (e.g. before a checkpoint) and waits for it.
    // Precondition: nothing acquired. Reports a background move's failure first, as acquire.
    Status flush();
    // Waits for every move in flight.
    Status drain();

    PartitionState state(PartitionId id) const;
    bool is_resident(PartitionId id, Tier tier) const;
    bool has_trace() const noexcept { return !trace_.empty(); }
    const AccessTrace& trace() const noexcept { return trace_; }
    ResidencyStats stats() const;
    // One line: peaks per tier, bytes per direction, hits/late/misses, stall time.
    std::string stats_summary() const;
    const ResidencyOptions& options() const noexcept { return options_; }
    // Borrowed; null: none.
    void set_observer(MoveObserver* observer) noexcept { observer_ = observer; }

private:
    enum class Copy : std::uint8_t { kAbsent, kFilling, kValid };
    static constexpr std::size_t kNoOffset = ~std::size_t{0};

    struct Partition {
        bool registered = false;
        DType dtype = DType::kFloat16;
        std::size_t size_bytes = 0;
        Copy device = Copy::kAbsent;
        Copy host = Copy::kAbsent;
        bool nvme_valid = false;
        std::size_t device_offset = kNoOffset;
        std::size_t host_offset = kNoOffset;
        // At most one move per partition is in flight.
        bool in_flight = false;
        MoveKind op = MoveKind::kSwapIn;
        MoveToken token = 0;
        bool op_is_prefetch = false;
        // A prefetch of it could not start (an error other than no room): leave it to the next
        // acquire, which retries on demand and reports the error.
        bool prefetch_blocked = false;
        // A prefetch move was started for it since its last acquire (an acquire that finds it
        // on its way, in flight or part-way up the tiers, counts as late, not as a miss).
        bool prefetched = false;
        std::uint32_t pin_count = 0;
        Tier pinned_tier = Tier::kDevice;
        std::uint64_t last_use_tick = 0;
        // stage_overwrite's bytes, not yet taken (no copy is valid meanwhile).
        const std::byte* source = nullptr;
        // Taken from a source and not yet written down: issue_prefetches starts its write.
        bool write_behind = false;
    };

    ResidencyManager(const ResidencyOptions& options, Mover& mover, Device* device);
    // Keeps the first error of a move whose caller did not wait for it, for the next acquire or
    // flush to report (once).
    void defer(const Status& status);

    Partition& part(PartitionId id);
    const Partition& part(PartitionId id) const;
    Copy& copy(Partition& p, Tier tier);
    Copy copy(const Partition& p, Tier tier) const;
    bool valid(const Partition& p, Tier tier) const;
    // The copy in `tier` is the newest and nothing below holds it.
    bool is_dirty(const Partition& p, Tier tier) const;
    std::byte* host_ptr(const Partition& p);
    std::byte* device_ptr(const Partition& p);

    // Records or checks one access against the trace.
    void trace_access(PartitionId id, Tier tier);
    void detect_change(std::size_t position, const Access& got);
    // Distance from the cursor to the next use of `id` (kNoNextUse without a trace).
    std::uint64_t next_use(PartitionId id) const;
    bool following_trace() const noexcept;

    // Moves.
    Status start_move(PartitionId id, MoveKind kind, bool prefetch);
    void complete_move(PartitionId id, const Status& status);
    // Waits for the move of `id`, or for the oldest in-flight move when id is kNoPartition.
    Status wait_move(PartitionId id);
    // Notices completed moves without blocking. Failures are logged (prefetches) and leave the
    // partition as it was before the move; the demand path retries and reports them.
    void poll_moves_quietly();

    // Space. Makes an extent of size_bytes in `tier` and returns its offset. Demand: evicts by
    // policy, writing back dirty copies and waiting as needed; kNoSpace when what is pinned or
    // in flight leaves no room (a demand never returns nullopt). Prefetch: evicts only clean
    // copies whose next use is further than max_distance and never waits; nullopt when there
    // is no such room.
    Result<std::optional<std::size_t>> make_room(Tier tier, std::size_t size_bytes,
                                                 PartitionId for_id, bool prefetch,
                                                 std::uint64_t max_distance);
    // make_room's steps. Fills candidates_ with the copies in `tier` that may be evicted to make
    // room for `for_id` (for a prefetch: clean ones used later than max_distance). Allocates
    // nothing (candidates_ is reserved).
    void collect_candidates(Tier tier, PartitionId for_id, bool prefetch,
                            std::uint64_t max_distance);
    // Whether a free extent of size_bytes would exist in `tier` once every candidate (the
    // candidates_ of make_room) were evicted. Allocates nothing.
    bool room_after_evicting(const ExtentAllocator& alloc, Tier tier, std::size_t size_bytes);
    // Belady along the trace while it is followed, else LRU (see eviction.h).
    EvictionPolicy eviction_policy() const noexcept;
    Status write_back(PartitionId id, Tier tier);
    void drop_copy(PartitionId id, Tier tier);
    void note_allocation(Tier tier);
    ExtentAllocator& allocator(Tier tier);

    // Starts the next step toward making `id` resident in `tier`.
    enum class Step : std::uint8_t {
        kStarted,      // a move was started
        kNothingToDo,  // already resident, or a move of it is in flight
        kNoRoom,       // prefetch only: no clean copy used later than it could make room
        kMoverBusy,    // the mover has max_in_flight() moves outstanding
        kTaken,        // staged bytes were copied into the host tier, now resident there
    };
    Result<Step> step_toward(PartitionId id, Tier tier, bool prefetch, std::uint64_t distance);
    Status ensure_resident(PartitionId id, Tier tier);
    // acquire's last part, the copy in `tier` valid and nothing in flight: pins it, starts
    // prefetches and returns its address.
    void* pin_resident(Partition& p, Tier tier);
    void issue_prefetches();
    // Copies the staged bytes of `id` into the host tier (room made as for a prefetch, or on
    // demand) and queues their write behind. false: a prefetch found no room.
    Result<bool> take_source(PartitionId id, bool prefetch, std::uint64_t distance);
    // Starts the writes of taken bytes while the mover has room (prefetch priority).
    void start_writes_behind();

    void check_budgets() const;
    std::size_t loop_bound() const noexcept { return 64 + 16 * registered_count_; }

    ResidencyOptions options_;
    MoveObserver* observer_ = nullptr;
    Mover& mover_;
    Device* device_;
    std::span<std::byte> host_region_;
    Status deferred_;                     // see defer()
    DeviceBuffer device_memory_;          // the device tier
    std::byte* device_region_ = nullptr;  // device_memory_'s bytes
    ExtentAllocator device_alloc_;
    ExtentAllocator host_alloc_;
    std::uint64_t nvme_used_bytes_ = 0;
    std::size_t peak_bytes_[kTierCount] = {0, 0, 0};

    std::vector<Partition> parts_;
    std::size_t registered_count_ = 0;
    // Partitions with a move in flight, in start order (waits take the oldest first).
    std::vector<PartitionId> in_flight_;
    // Partitions taken from a source whose write has not started (reserved to capacity).
    std::vector<PartitionId> write_behind_;
    std::size_t staged_count_ = 0;  // sources not yet taken
    // Scratch for eviction candidates, reserved to partition_capacity.
    std::vector<EvictionCandidate> candidates_;
    // make_room's scratch: free extents and the candidates' extents (reserved at create).
    std::vector<ExtentAllocator::Extent> extents_;
    // The partition whose move is being prepared: never evicted while room is made for it.
    PartitionId keep_ = kNoPartition;
    std::uint64_t tick_ = 0;
    std::size_t pinned_device_bytes_ = 0;

    // Trace state.
    AccessTrace trace_;
    std::vector<Access> recording_;
    bool in_iteration_ = false;
    bool recording_on_ = false;      // this iteration is being recorded
    bool diverged_ = false;          // this iteration left the trace (re-recording)
    std::size_t cursor_ = 0;         // position of the next access in trace_
    std::uint64_t trace_bytes_ = 0;  // sum of accessed partitions' sizes over the trace

    ResidencyStats stats_;
    // For debug logs (ZINF_LOG_LEVEL=debug): milliseconds since creation.
    std::chrono::steady_clock::time_point created_at_ = std::chrono::steady_clock::now();
    double ms_since_created() const;
};

}  // namespace zinf::tier
