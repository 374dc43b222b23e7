// SwapStore: where partitions live on disk. It lays each partition out as an extent of one
// logical swap file (striped by io::Engine over the `nvme_path`s, inside a locked per-run
// directory), checksums every swap block of a partition on the way out and verifies it on the
// way in, and tracks which partitions have a valid copy on disk. It knows bytes, never ranks or
// models, and makes no data-I/O syscalls itself: everything goes through io::Engine.
//
// Layout. Partitions are laid out in reserve() order, each at a kExtentAlignmentBytes-aligned
// offset, so consecutive partitions are adjacent and a run of them moves in one engine
// operation (see swap_out_run). Every kSwapBlockBytes of a partition (partition-relative; the
// last block may be short) has an XXH3-64 checksum, seeded with the partition id and block
// index so that a block written to the wrong place also fails. The checksums are kept in memory
// only, one aligned extent per partition: swap files belong to one run and are never read by
// another, so a copy on disk would have no reader (checkpoints carry their own checksums). The
// swap file lives as long as the store.
//
// Copy-on-write (SwapStoreOptions::copy_on_write): every partition has two extents, one per
// "plane" (plane 1 is laid out like plane 0, after it). The partition's current copy lives in
// one plane; a shadow swap-out (WriteTarget::kShadow) writes the other, leaving the current
// bytes and their checksums intact and readable, so a speculative result can be written while
// the state it came from stays available. commit_shadows() then makes the written shadows
// current all at once, or refuses and changes nothing when one of them failed;
// discard_shadows() forgets them (a rollback: the old bytes are simply read again). A shadow
// write moves the same bytes as an in-place one; the cost is the second plane's disk space.
// pin() holds a partition's current copy where it is (a snapshot, e.g. for a checkpoint copied
// in the background): swap_in_pinned() reads it whatever was committed since, and a write that
// would land on a pinned extent waits until unpin() (the wait is counted in pin_wait_ns).
//
// Lifecycle: create() -> reserve()* -> commit() -> swap_out / swap_in ... -> destruction (removes
// the files and the run directory).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/engine.h"
#include "src/base/aligned.h"
#include "src/base/status.h"
#include "swap/run_dir.h"

namespace zinf::swap {

using PartitionId = std::uint32_t;

// The checksum unit. 64 KiB: large enough that XXH3 runs at memory speed and the table is
// 1/8192 of the data (3 MB for 24 GB), small enough that a verified sub-range read reads at most
// two extra blocks (128 KiB) beyond the bytes asked for.
inline constexpr std::size_t kSwapBlockBytes = std::size_t{64} * 1024;
// Every extent (data and checksums) starts at a multiple of this: the largest O_DIRECT logical
// block size we expect (512 B here, 4 KiB on 4Kn drives).
inline constexpr std::size_t kExtentAlignmentBytes = 4096;
static_assert(kSwapBlockBytes % kExtentAlignmentBytes == 0);
// The most partitions one run (one engine operation) may carry.
inline constexpr std::size_t kMaxRunPartitions = 256;

struct SwapStoreOptions {
    std::vector<std::string> paths;  // `nvme_path`: the base directories, one stripe each
    bool verify_checksums = true;    // `swap.verify_checksums`: compute, write and verify them
    // Bytes per stripe chunk over several paths; 0: the engine's aio.block_size.
    std::uint64_t stripe_chunk_bytes = 0;
    std::string name = "swap";  // named in messages ("optimizer", "params")
    // Two extents per partition (see above): shadow writes and commit_shadows(). Doubles the
    // file.
    bool copy_on_write = false;
};

// Where a swap-out goes: over the current copy (which is invalid until the write completes),
// or (copy-on-write stores) to the partition's shadow extent, the current copy untouched.
enum class WriteTarget : std::uint8_t { kCurrent, kShadow };

struct SwapStoreStats {
    std::uint64_t bytes_swapped_out = 0;
    std::uint64_t bytes_swapped_in = 0;
    std::uint64_t checksum_bytes = 0;  // hashed, out and in
    std::uint64_t checksum_ns = 0;     // time spent hashing and comparing
    std::uint64_t corruptions = 0;
    std::uint64_t pin_wait_ns = 0;  // writes waiting for a pinned extent's release
};

// Where a partition lives in the swap file.
struct Extent {
    // In the layout of one plane, kExtentAlignmentBytes-aligned: offsets of partitions in one
    // plane differ by their distance in a run buffer.
    std::uint64_t offset_bytes = 0;
    std::uint64_t size_bytes = 0;         // the partition's bytes
    std::uint32_t layout_index = 0;       // position in reserve() order
    std::uint32_t plane = 0;              // of the current copy (always 0 without copy-on-write)
    std::uint64_t file_offset_bytes = 0;  // of the current copy in the logical swap file
};

// The span a sub-range read transfers: the range widened to whole swap blocks when checksums
// are verified. The caller's buffer holds read_length_bytes; the bytes asked for start at
// skip_bytes in it.
struct RangeRead {
    std::uint64_t read_offset_bytes = 0;  // partition-relative
    std::uint64_t read_length_bytes = 0;
    std::uint64_t skip_bytes = 0;
};

class SwapStore;

// The caller's handle on one swap operation (one partition, or a run of adjacent ones). Owned
// by the caller; must stay alive, with its buffer, until wait() has returned. Completing it
// (wait) is what marks written partitions valid and verifies read ones: every started operation
// must be waited for, exactly once (asserted by the destructor). Poll with done() from any
// thread; wait from one.
class SwapHandle {
public:
    SwapHandle() = default;
    ~SwapHandle();
    SwapHandle(const SwapHandle&) = delete;
    SwapHandle& operator=(const SwapHandle&) = delete;

    // True when the transfer has finished (wait() will then not block); never blocks.
    bool done() const noexcept;
    // Blocks until the transfer finishes, then completes the operation: a swap-out marks its
    // partitions valid on success (and leaves them invalid on any error); a swap-in verifies the
    // checksums. Returns the operation's status: the engine's error (kIo, kNoSpace, ... naming
    // file, offset and length) with the partitions as context, or kCorruption naming the
    // partition and the offset of the bad block. Never allocates on success.
    Status wait();
    // Blocks until the transfer has finished, without completing the operation (no validity,
    // no verification): lets a pipeline start its next read before it verifies this one.
    // wait() must still follow.
    void wait_transfer() noexcept;
    // True between a successful submit and the return of wait().
    bool in_use() const noexcept { return store_ != nullptr; }
    // Its transfers go ahead of those not urgent in the engine's queue (io::IoHandle::set_urgent).
    void set_urgent(bool on) noexcept { data_io_.set_urgent(on); }

private:
    friend class SwapStore;
    SwapStore* store_ = nullptr;
    io::OpKind op_ = io::OpKind::kRead;
    bool shadow_ = false;            // a write to the shadow extents
    bool pinned_ = false;            // a read of pinned copies
    std::uint32_t plane_ = 0;        // the plane read or written
    std::uint32_t first_index_ = 0;  // layout index of the first partition
    std::uint32_t count_ = 0;        // partitions in the run
    // Sub-range read: what was read and where it sits (count_ == 1).
    bool range_ = false;
    std::uint64_t range_offset_bytes_ = 0;
    std::uint64_t range_length_bytes_ = 0;
    std::byte* buffer_ = nullptr;
    // A swap-out submitted while the engine discarded I/O (io::Engine::set_discard): its
    // checksums were not computed, so that the table keeps describing what is on disk.
    bool unhashed_ = false;
    io::IoHandle data_io_;
};

class SwapStore {
public:
    // Locks the base paths and creates this run's directory (see RunDir; a second run on the
    // same path is refused with kBusy naming the directory and the holder's pid). The engine
    // must outlive the store. Init only: allocates.
    static Result<std::unique_ptr<SwapStore>> create(io::Engine& engine,
                                                     const SwapStoreOptions& options);
    // Preconditions (asserted): no operation in flight. Closes the files, removes the run dir.
    ~SwapStore();
    SwapStore(const SwapStore&) = delete;
    SwapStore& operator=(const SwapStore&) = delete;

    // Declares a partition of size_bytes (> 0) before commit(). Errors: kInvalidArgument for a
    // duplicate id, a zero size, or a call after commit(). Single-threaded, init only.
    Status reserve(PartitionId partition, std::uint64_t size_bytes);
    // Fixes the layout, checks the free space of every path (kNoSpace stating bytes needed and
    // bytes free, before anything is written), creates the files exclusively with mode 0600
    // and preallocates them. Init only.
    Status commit();
    bool committed() const noexcept { return committed_; }

    // Asynchronous swap-out of one partition from `buffer` (size_bytes of the partition; aligned
    // to the file's alignment for O_DIRECT, otherwise the engine takes the buffered path).
    // Hashes the blocks on the calling thread, then submits; the partition is invalid from
    // now until wait() reports success. Preconditions (asserted): committed, no other
    // operation on the partition in flight, handle not in use. Errors at submit: kNotFound for
    // an unknown partition, the engine's submit errors. Thread-safe for distinct partitions.
    // kShadow (copy-on-write stores; kInvalidArgument otherwise): writes the shadow extent; the
    // current copy stays valid and readable meanwhile, and becomes the old one at
    // commit_shadows(). A write to the current copy supersedes (forgets) a pending shadow.
    Status swap_out(PartitionId partition, std::span<const std::byte> buffer, SwapHandle& handle,
                    WriteTarget target = WriteTarget::kCurrent);
    // Asynchronous swap-in of the whole partition into `buffer` (at least size_bytes). Errors
    // at submit: kNotFound for an unknown partition or one without a valid copy on disk.
    // Concurrent swap-ins of one partition are allowed; a swap-out concurrent with them is not.
    Status swap_in(PartitionId partition, std::span<std::byte> buffer, SwapHandle& handle);
    // Reads [offset_bytes, offset_bytes + length_bytes) of a partition. With checksums the
    // store reads whole swap blocks: size `buffer` with range_read(); the asked-for bytes start
    // at range_read().skip_bytes in it. kInvalidArgument for a range outside the partition.
    Status swap_in_range(PartitionId partition, std::uint64_t offset_bytes,
                         std::uint64_t length_bytes, std::span<std::byte> buffer,
                         SwapHandle& handle);
    RangeRead range_read(PartitionId partition, std::uint64_t offset_bytes,
                         std::uint64_t length_bytes) const;

    // Runs: partitions that are consecutive in the layout move in one engine operation. The
    // buffer holds each partition at (extent offset − first extent offset), i.e. run_bytes()
    // bytes with the alignment padding between them. Preconditions as for one partition;
    // kInvalidArgument when the ids are not consecutive in layout order or exceed
    // kMaxRunPartitions, or (copy-on-write) when their current copies are not in one plane.
    Status swap_out_run(std::span<const PartitionId> partitions, std::span<const std::byte> buffer,
                        SwapHandle& handle, WriteTarget target = WriteTarget::kCurrent);
    Status swap_in_run(std::span<const PartitionId> partitions, std::span<std::byte> buffer,
                       SwapHandle& handle);

    // Layout queries (after reserve; offsets final after commit). Never allocate.
    bool contains(PartitionId partition) const noexcept;
    Extent extent(PartitionId partition) const;  // asserts contains()
    // Bytes of a run buffer for partitions [first, last] in layout order (both included).
    std::uint64_t run_bytes(PartitionId first, PartitionId last) const;
    // The partition right after `partition` in the layout, if any.
    bool next_in_layout(PartitionId partition, PartitionId* next) const;
    // True when the last swap-out of the partition completed successfully.
    bool is_valid(PartitionId partition) const;
    // Forgets the disk copy (e.g. the tier layer holds a newer one); it will not be read.
    void invalidate(PartitionId partition);

    // Copy-on-write. True when the partition's shadow holds a completed write not yet committed.
    bool has_shadow(PartitionId partition) const;
    // Makes the completed shadows of partitions [first, first + count) (ids) current, all of them
    // or none: kIo, naming the partition and changing nothing, when one of their shadow writes
    // failed. Partitions without a shadow keep their current copy.
    // Preconditions (asserted): a copy-on-write store, no operation in flight on them, every id
    // reserved. Returns how many partitions switched.
    Result<std::size_t> commit_shadows(PartitionId first, std::size_t count);
    // Forgets every shadow of partitions [first, first + count): their current copies stay.
    void discard_shadows(PartitionId first, std::size_t count);
    bool copy_on_write() const noexcept { return planes_ == 2; }
    // Whether the engine discards the I/O (io::Engine::set_discard): a discarded write leaves
    // its partitions, and a discarded shadow write its shadows, as they were.
    bool discarding() const noexcept { return engine_.discarding(); }

    // Pins the current copies of partitions [first, first + count) (ids), each where it is now,
    // until unpin(). kInvalidArgument on a store without copy-on-write; kNotFound, pinning
    // nothing, when one has no valid current copy. Precondition (asserted): none of them pinned
    // or being written in place. Thread-safe with operations on other partitions and with
    // shadow writes.
    Status pin(PartitionId first, std::size_t count);
    // Reads the pinned copies of a run (consecutive in the layout, pinned in one plane) into
    // `buffer`, verified with that copy's checksums; safe beside any step on the same partitions
    // (their writes go to the other plane, or wait). kInvalidArgument when one is not pinned.
    Status swap_in_pinned_run(std::span<const PartitionId> partitions, std::span<std::byte> buffer,
                              SwapHandle& handle);
    // Releases the pins (no pinned read in flight, asserted); writes waiting for them go on.
    void unpin(PartitionId first, std::size_t count);
    bool is_pinned(PartitionId partition) const;

    std::size_t partition_count() const noexcept { return partitions_.size(); }
    // The partitions' bytes in one plane (with alignment padding); the file holds
    // data_bytes() × planes.
    std::uint64_t data_bytes() const noexcept { return data_bytes_; }
    std::uint64_t file_bytes() const noexcept { return data_bytes_ * planes_; }
    bool verify_checksums() const noexcept { return verify_; }
    const std::string& name() const noexcept { return name_; }
    // The stripes of the data file (tests flip bytes in them) and the run directories.
    std::vector<std::string> data_file_paths() const { return run_dir_.file_paths(kDataFileName); }
    const RunDir& run_dir() const noexcept { return run_dir_; }
    io::Engine& engine() noexcept { return engine_; }
    SwapStoreStats stats() const noexcept;
    void reset_stats() noexcept;

    static constexpr std::string_view kDataFileName = "swap.data";

private:
    friend class SwapHandle;
    enum class State : std::uint8_t { kEmpty, kWriting, kValid, kFailed };
    struct Partition {
        PartitionId id = 0;
        std::uint64_t size_bytes = 0;
        std::uint64_t offset_bytes = 0;       // data file
        std::uint64_t sums_offset_bytes = 0;  // checksum file and table
        std::uint32_t block_count = 0;
    };
    struct Live {  // per-partition state touched by concurrent operations
        std::atomic<State> state{State::kEmpty};  // of the current copy
        std::atomic<std::uint32_t> readers{0};
        // The state before the swap-out in flight: what a discarded write returns it to.
        State before_write = State::kEmpty;
        // Copy-on-write: the plane of the current copy, and the state of the other plane's
        // (the shadow's) copy. Changed only with nothing in flight on the partition.
        std::atomic<std::uint32_t> plane{0};
        std::atomic<State> shadow{State::kEmpty};
        // The plane held by pin(), or kUnpinned; reads of it in flight.
        std::atomic<std::uint32_t> pinned_plane{kUnpinned};
        std::atomic<std::uint32_t> pinned_readers{0};
    };
    static constexpr std::uint32_t kUnpinned = ~std::uint32_t{0};
    // Blocks while a partition of the run is pinned in `plane`.
    void wait_unpinned(std::uint32_t first, std::uint32_t count, std::uint32_t plane);

    SwapStore(io::Engine& engine, RunDir run_dir, const SwapStoreOptions& options);
    Result<std::uint32_t> index_of(PartitionId partition) const;
    Result<std::uint32_t> run_indices(std::span<const PartitionId> partitions) const;
    Status submit_out(std::uint32_t first, std::uint32_t count, std::span<const std::byte> buffer,
                      SwapHandle& handle, WriteTarget target);
    // The plane of the current copies of layout indices [first, first + count), or
    // kInvalidArgument when they are not all in one.
    Result<std::uint32_t> run_plane(std::uint32_t first, std::uint32_t count) const;
    Result<std::uint32_t> id_range(PartitionId first, std::size_t count) const;
    Status submit_in(std::uint32_t first, std::uint32_t count, std::uint64_t range_offset,
                     std::uint64_t range_length, bool range, std::span<std::byte> buffer,
                     SwapHandle& handle, bool pinned = false);
    Status complete(SwapHandle& handle);
    Status verify_blocks(const Partition& p, std::uint32_t plane, std::uint64_t from_bytes,
                         std::uint64_t to_bytes, const std::byte* data) noexcept;
    std::uint64_t* sums_of(const Partition& p, std::uint32_t plane) noexcept {
        return reinterpret_cast<std::uint64_t*>(sums_.data() + p.sums_offset_bytes +
                                                plane * sums_bytes_);
    }
    std::uint64_t file_offset(const Partition& p, std::uint32_t plane) const noexcept {
        return p.offset_bytes + plane * data_bytes_;
    }
    Status space_check() const;

    io::Engine& engine_;
    RunDir run_dir_;
    std::string name_;
    bool verify_ = true;
    std::uint64_t stripe_chunk_bytes_ = 0;
    std::uint32_t planes_ = 1;  // 2 with copy-on-write
    bool committed_ = false;
    std::vector<Partition> partitions_;                     // layout order
    std::unordered_map<PartitionId, std::uint32_t> index_;  // id -> layout index
    std::unique_ptr<Live[]> live_;
    std::uint64_t data_bytes_ = 0;
    std::uint64_t sums_bytes_ = 0;
    AlignedBuffer sums_;  // the trusted checksums, laid out like the checksum file
    io::FileId data_file_ = 0;
    bool files_open_ = false;
    std::atomic<std::uint32_t> in_flight_{0};

    std::atomic<std::uint64_t> bytes_out_{0};
    std::atomic<std::uint64_t> bytes_in_{0};
    std::atomic<std::uint64_t> checksum_bytes_{0};
    std::atomic<std::uint64_t> checksum_ns_{0};
    std::atomic<std::uint64_t> corruptions_{0};
    std::atomic<std::uint64_t> pin_wait_ns_{0};
    std::mutex pin_mutex_;
    std::condition_variable pin_released_;
};

}  // namespace zinf::swap
