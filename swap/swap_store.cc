// SwapStore: layout, checksums and validity of partitions in the swap files.
#include "swap/swap_store.h"

#include <sys/stat.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>

#include "src/base/file.h"
#include "src/base/log.h"
#include "src/base/units.h"

namespace zinf::swap {
namespace {

std::uint64_t block_seed(PartitionId partition, std::uint64_t block_index) noexcept {
    return (static_cast<std::uint64_t>(partition) << 32) ^ block_index;
}

std::uint64_t sums_extent_bytes(std::uint32_t block_count) noexcept {
    return align_up(static_cast<std::uint64_t>(block_count) * sizeof(std::uint64_t),
                    kExtentAlignmentBytes);
}

// Runs fn(k) for every block k in [0, count): on the calling thread for a few blocks, else on
// oneTBB's workers. Hashing 1 GB sub-groups on the step thread alone would put ~0.1 s per GB on
// the optimizer's critical path; blocks are independent, so they split across cores.
constexpr std::uint32_t kParallelHashBlocks = 32;  // 2 MiB: below this a fork costs more
template <typename Fn>
void for_each_block(std::uint32_t count, const Fn& fn) {
    if (count < kParallelHashBlocks) {
        for (std::uint32_t k = 0; k < count; ++k) fn(k);
        return;
    }
    tbb::parallel_for(tbb::blocked_range<std::uint32_t>(0, count, 8),
                      [&](const tbb::blocked_range<std::uint32_t>& r) {
                          for (std::uint32_t k = r.begin(); k != r.end(); ++k) fn(k);
                      });
}

std::uint64_t now_ns() noexcept {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now().time_since_epoch())
                                          .count());
}

std::string hex64(std::uint64_t v) {
    char text[24];
    std::snprintf(text, sizeof(text), "%016" PRIx64, v);
    return text;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// SwapHandle

SwapHandle::~SwapHandle() {
    // An operation that was started and never waited for would leave its partitions in limbo.
    ZINF_ASSERT_MSG(store_ == nullptr, "SwapHandle destroyed before wait()");
}

bool SwapHandle::done() const noexcept {
    if (store_ == nullptr) return true;
    return data_io_.done();
}

void SwapHandle::wait_transfer() noexcept {
    if (store_ == nullptr) return;
    // The statuses are read again by wait(); IoHandle::wait is idempotent once done.
    (void)data_io_.wait();
}

Status SwapHandle::wait() {
    ZINF_ASSERT_MSG(store_ != nullptr, "SwapHandle::wait() without an operation");
    return store_->complete(*this);
}

// ---------------------------------------------------------------------------------------------
// Creation, layout

SwapStore::SwapStore(io::Engine& engine, RunDir run_dir, const SwapStoreOptions& options)
    : engine_(engine),
      run_dir_(std::move(run_dir)),
      name_(options.name),
      verify_(options.verify_checksums),
      stripe_chunk_bytes_(options.stripe_chunk_bytes != 0 ? options.stripe_chunk_bytes
                                                          : engine.aio().block_size_bytes),
      planes_(options.copy_on_write ? 2 : 1) {}

Result<std::unique_ptr<SwapStore>> SwapStore::create(io::Engine& engine,
                                                     const SwapStoreOptions& options) {
    ZINF_ASSIGN_OR_RETURN(RunDir run_dir, RunDir::create(engine.file_system(), options.paths));
    return std::unique_ptr<SwapStore>(new SwapStore(engine, std::move(run_dir), options));
}

SwapStore::~SwapStore() {
    ZINF_ASSERT_MSG(in_flight_.load() == 0, str_cat("swap store '", name_, "' destroyed with ",
                                                    in_flight_.load(), " operation(s) in flight"));
    if (files_open_) {
        const Status a = engine_.close(data_file_);
        if (!a.is_ok()) log::warning("swap '", name_, "': ", a.to_string());
    }
    // run_dir_ then removes the files and the directories, and releases the locks.
}

Status SwapStore::reserve(PartitionId partition, std::uint64_t size_bytes) {
    if (committed_) {
        return Status::invalid_argument(
            str_cat("swap '", name_, "': reserve(", partition, ") after commit()"));
    }
    if (size_bytes == 0) {
        return Status::invalid_argument(
            str_cat("swap '", name_, "': partition ", partition, " has size 0"));
    }
    if (index_.contains(partition)) {
        return Status::invalid_argument(
            str_cat("swap '", name_, "': partition ", partition, " reserved twice"));
    }
    const std::uint64_t blocks = (size_bytes + kSwapBlockBytes - 1) / kSwapBlockBytes;
    if (blocks > UINT32_MAX) {
        return Status::invalid_argument(str_cat("swap '", name_, "': partition ", partition, " of ",
                                                size_bytes, " bytes is too large"));
    }
    Partition p;
    p.id = partition;
    p.size_bytes = size_bytes;
    p.block_count = static_cast<std::uint32_t>(blocks);
    p.offset_bytes = data_bytes_;
    p.sums_offset_bytes = sums_bytes_;
    data_bytes_ += align_up(size_bytes, kExtentAlignmentBytes);
    sums_bytes_ += sums_extent_bytes(p.block_count);
    index_.emplace(partition, static_cast<std::uint32_t>(partitions_.size()));
    partitions_.push_back(p);
    return Status::ok();
}

Status SwapStore::space_check() const {
    // Bytes needed per file system (several paths may share one): the data stripes round up to
    // whole chunks; the checksum file lives in the first path.
    const std::size_t paths = run_dir_.base_paths().size();
    const std::uint64_t file = file_bytes();
    const std::uint64_t chunks = (file + stripe_chunk_bytes_ - 1) / stripe_chunk_bytes_;
    const std::uint64_t per_path = (chunks + paths - 1) / paths * stripe_chunk_bytes_;
    struct Need {
        std::string path;
        std::uint64_t bytes = 0;
    };
    std::map<dev_t, Need> needs;
    for (std::size_t i = 0; i < paths; ++i) {
        const std::string& base = run_dir_.base_paths()[i];
        struct stat st {};
        if (::stat(base.c_str(), &st) != 0)
            return Status::from_errno(errno, str_cat("stat ", base));
        Need& n = needs[st.st_dev];
        if (n.path.empty()) n.path = base;
        n.bytes += std::min(per_path, file);
    }
    for (const auto& [dev, need] : needs) {
        ZINF_ASSIGN_OR_RETURN(const std::uint64_t free_bytes, free_space_bytes(need.path));
        if (free_bytes < need.bytes) {
            return Status::no_space(
                str_cat("swap '", name_, "': not enough space for the swap files on ", need.path,
                        ": need ", format_bytes(need.bytes), " (", need.bytes, " bytes), ",
                        format_bytes(free_bytes), " (", free_bytes, " bytes) free"));
        }
    }
    return Status::ok();
}

Status SwapStore::commit() {
    ZINF_ASSERT(!committed_);
    if (partitions_.empty()) {
        return Status::invalid_argument(str_cat("swap '", name_, "': commit() with no partition"));
    }
    ZINF_TRY(space_check());
    io::FileOptions data_options;
    data_options.create = true;
    data_options.exclusive = true;
    data_options.mode = 0600;
    data_options.trusted_directory = true;
    data_options.stripe_chunk_bytes = stripe_chunk_bytes_;
    data_options.preallocate_bytes = file_bytes();
    const std::vector<std::string> data_paths = run_dir_.file_paths(kDataFileName);
    ZINF_ASSIGN_OR_RETURN(data_file_, engine_.open(data_paths, data_options));
    if (verify_) {
        // The table lives in memory only: swap files belong to one run and are never read by
        // another, so a copy on disk would have no reader.
        auto sums = AlignedBuffer::allocate(sums_bytes_ * planes_, kExtentAlignmentBytes, true);
        if (!sums.has_value()) {
            (void)engine_.close(data_file_);
            return sums.error();
        }
        sums_ = std::move(*sums);
    }
    files_open_ = true;
    live_ = std::make_unique<Live[]>(partitions_.size());
    committed_ = true;
    log::info("swap '", name_, "': ", partitions_.size(), " partitions, ",
              format_bytes(file_bytes()), " in ", data_paths.size(), " path(s) under ",
              run_dir_.run_paths().front(), verify_ ? ", checksums on" : ", checksums off",
              planes_ == 2 ? ", copy-on-write" : "");
    return Status::ok();
}

bool SwapStore::contains(PartitionId partition) const noexcept {
    return index_.contains(partition);
}

Result<std::uint32_t> SwapStore::index_of(PartitionId partition) const {
    const auto it = index_.find(partition);
    if (it == index_.end()) {
        return Status::not_found(str_cat("swap '", name_, "': unknown partition ", partition));
    }
    return it->second;
}

Extent SwapStore::extent(PartitionId partition) const {
    const auto it = index_.find(partition);
    ZINF_ASSERT(it != index_.end());
    const Partition& p = partitions_[it->second];
    const std::uint32_t plane =
        committed_ ? live_[it->second].plane.load(std::memory_order_acquire) : 0;
    return Extent{p.offset_bytes, p.size_bytes, it->second, plane, file_offset(p, plane)};
}

std::uint64_t SwapStore::run_bytes(PartitionId first, PartitionId last) const {
    const Extent a = extent(first);
    const Extent b = extent(last);
    ZINF_ASSERT_LE(a.layout_index, b.layout_index);
    return b.offset_bytes + b.size_bytes - a.offset_bytes;
}

bool SwapStore::next_in_layout(PartitionId partition, PartitionId* next) const {
    const Extent e = extent(partition);
    if (e.layout_index + 1 >= partitions_.size()) return false;
    *next = partitions_[e.layout_index + 1].id;
    return true;
}

bool SwapStore::is_valid(PartitionId partition) const {
    const auto it = index_.find(partition);
    if (it == index_.end() || !committed_) return false;
    return live_[it->second].state.load(std::memory_order_acquire) == State::kValid;
}

void SwapStore::invalidate(PartitionId partition) {
    const Extent e = extent(partition);
    ZINF_ASSERT(committed_);
    Live& live = live_[e.layout_index];
    ZINF_ASSERT(live.state.load() != State::kWriting);
    ZINF_ASSERT_EQ(live.readers.load(), 0u);
    live.state.store(State::kEmpty, std::memory_order_release);
}

bool SwapStore::has_shadow(PartitionId partition) const {
    const auto it = index_.find(partition);
    if (it == index_.end() || !committed_) return false;
    return live_[it->second].shadow.load(std::memory_order_acquire) == State::kValid;
}

Result<std::uint32_t> SwapStore::id_range(PartitionId first, std::size_t count) const {
    ZINF_ASSIGN_OR_RETURN(const std::uint32_t index, index_of(first));
    for (std::size_t i = 1; i < count; ++i) {
        ZINF_ASSIGN_OR_RETURN(const std::uint32_t at,
                              index_of(first + static_cast<PartitionId>(i)));
        (void)at;
    }
    return index;
}

Result<std::size_t> SwapStore::commit_shadows(PartitionId first, std::size_t count) {
    ZINF_ASSERT(committed_);
    ZINF_ASSERT(copy_on_write());
    ZINF_ASSERT_MSG(id_range(first, count).has_value(), "a partition id not reserved");
    // First every check, then every switch: a failed shadow leaves all of them as they were, so
    // no commit ever yields a mix of two writes' results.
    for (std::size_t i = 0; i < count; ++i) {
        const Live& live = live_[index_.at(first + static_cast<PartitionId>(i))];
        const State shadow = live.shadow.load(std::memory_order_acquire);
        ZINF_ASSERT_MSG(shadow != State::kWriting && live.readers.load() == 0 &&
                            live.state.load() != State::kWriting,
                        "commit_shadows with an operation in flight");
        if (shadow == State::kFailed) {
            return Status::io_error(
                str_cat("swap '", name_, "': commit refused: the shadow write of partition ",
                        first + i, " failed; every partition keeps its current copy"),
                EIO);
        }
    }
    std::size_t switched = 0;
    for (std::size_t i = 0; i < count; ++i) {
        Live& live = live_[index_.at(first + static_cast<PartitionId>(i))];
        if (live.shadow.load(std::memory_order_relaxed) != State::kValid) continue;
        live.plane.store(1 - live.plane.load(std::memory_order_relaxed), std::memory_order_release);
        live.state.store(State::kValid, std::memory_order_release);
        live.shadow.store(State::kEmpty, std::memory_order_release);
        ++switched;
    }
    return switched;
}

void SwapStore::discard_shadows(PartitionId first, std::size_t count) {
    ZINF_ASSERT(committed_);
    ZINF_ASSERT_MSG(id_range(first, count).has_value(), "a partition id not reserved");
    for (std::size_t i = 0; i < count; ++i) {
        Live& live = live_[index_.at(first + static_cast<PartitionId>(i))];
        ZINF_ASSERT_MSG(live.shadow.load() != State::kWriting,
                        "discard_shadows with a shadow write in flight");
        live.shadow.store(State::kEmpty, std::memory_order_release);
    }
}

Status SwapStore::pin(PartitionId first, std::size_t count) {
    ZINF_ASSERT(committed_);
    if (!copy_on_write()) {
        return Status::invalid_argument(
            str_cat("swap '", name_, "': pinning partitions needs a copy-on-write store"));
    }
    ZINF_ASSERT_MSG(id_range(first, count).has_value(), "a partition id not reserved");
    for (std::size_t i = 0; i < count; ++i) {
        const Live& live = live_[index_.at(first + static_cast<PartitionId>(i))];
        const State state = live.state.load(std::memory_order_acquire);
        ZINF_ASSERT_MSG(state != State::kWriting, "pin() of a partition being written in place");
        ZINF_ASSERT_MSG(live.pinned_plane.load() == kUnpinned, "pin() of a pinned partition");
        if (state != State::kValid) {
            return Status::not_found(str_cat("swap '", name_, "': cannot pin partition ", first + i,
                                             ": no valid copy on disk"));
        }
    }
    const std::lock_guard lock(pin_mutex_);
    for (std::size_t i = 0; i < count; ++i) {
        Live& live = live_[index_.at(first + static_cast<PartitionId>(i))];
        live.pinned_plane.store(live.plane.load(std::memory_order_acquire),
                                std::memory_order_release);
    }
    return Status::ok();
}

void SwapStore::unpin(PartitionId first, std::size_t count) {
    ZINF_ASSERT(committed_);
    {
        const std::lock_guard lock(pin_mutex_);
        for (std::size_t i = 0; i < count; ++i) {
            Live& live = live_[index_.at(first + static_cast<PartitionId>(i))];
            ZINF_ASSERT_MSG(live.pinned_readers.load() == 0,
                            "unpin() with a pinned read in flight");
            live.pinned_plane.store(kUnpinned, std::memory_order_release);
        }
    }
    pin_released_.notify_all();
}

bool SwapStore::is_pinned(PartitionId partition) const {
    const auto it = index_.find(partition);
    if (it == index_.end() || !committed_) return false;
    return live_[it->second].pinned_plane.load(std::memory_order_acquire) != kUnpinned;
}

Status SwapStore::swap_in_pinned_run(std::span<const PartitionId> partitions,
                                     std::span<std::byte> buffer, SwapHandle& handle) {
    ZINF_ASSIGN_OR_RETURN(const std::uint32_t first, run_indices(partitions));
    return submit_in(first, static_cast<std::uint32_t>(partitions.size()), 0, 0, false, buffer,
                     handle, true);
}

void SwapStore::wait_unpinned(std::uint32_t first, std::uint32_t count, std::uint32_t plane) {
    if (!copy_on_write()) return;
    auto free = [&] {
        for (std::uint32_t i = first; i < first + count; ++i) {
            if (live_[i].pinned_plane.load(std::memory_order_acquire) == plane) return false;
        }
        return true;
    };
    if (free()) return;
    const std::uint64_t t0 = now_ns();
    std::unique_lock lock(pin_mutex_);
    pin_released_.wait(lock, free);
    pin_wait_ns_.fetch_add(now_ns() - t0, std::memory_order_relaxed);
}

Result<std::uint32_t> SwapStore::run_plane(std::uint32_t first, std::uint32_t count) const {
    const std::uint32_t plane = live_[first].plane.load(std::memory_order_acquire);
    for (std::uint32_t i = first + 1; i < first + count; ++i) {
        if (live_[i].plane.load(std::memory_order_acquire) != plane) {
            return Status::invalid_argument(
                str_cat("swap '", name_, "': partitions ", partitions_[first].id, " and ",
                        partitions_[i].id,
                        " of one run have their current copies in different "
                        "planes (a shadow of one was committed without the other)"));
        }
    }
    return plane;
}

Result<std::uint32_t> SwapStore::run_indices(std::span<const PartitionId> partitions) const {
    if (partitions.empty() || partitions.size() > kMaxRunPartitions) {
        return Status::invalid_argument(str_cat("swap '", name_, "': a run holds 1 to ",
                                                kMaxRunPartitions, " partitions, got ",
                                                partitions.size()));
    }
    ZINF_ASSIGN_OR_RETURN(const std::uint32_t first, index_of(partitions[0]));
    for (std::size_t i = 1; i < partitions.size(); ++i) {
        ZINF_ASSIGN_OR_RETURN(const std::uint32_t index, index_of(partitions[i]));
        if (index != first + i) {
            return Status::invalid_argument(str_cat(
                "swap '", name_, "': partitions of a run must be consecutive in the layout; ",
                partitions[i], " does not follow ", partitions[i - 1]));
        }
    }
    return first;
}

// ---------------------------------------------------------------------------------------------
// Operations

Status SwapStore::swap_out(PartitionId partition, std::span<const std::byte> buffer,
                           SwapHandle& handle, WriteTarget target) {
    ZINF_ASSIGN_OR_RETURN(const std::uint32_t index, index_of(partition));
    return submit_out(index, 1, buffer, handle, target);
}

Status SwapStore::swap_out_run(std::span<const PartitionId> partitions,
                               std::span<const std::byte> buffer, SwapHandle& handle,
                               WriteTarget target) {
    ZINF_ASSIGN_OR_RETURN(const std::uint32_t first, run_indices(partitions));
    return submit_out(first, static_cast<std::uint32_t>(partitions.size()), buffer, handle, target);
}

Status SwapStore::swap_in(PartitionId partition, std::span<std::byte> buffer, SwapHandle& handle) {
    ZINF_ASSIGN_OR_RETURN(const std::uint32_t index, index_of(partition));
    return submit_in(index, 1, 0, 0, false, buffer, handle);
}

Status SwapStore::swap_in_run(std::span<const PartitionId> partitions, std::span<std::byte> buffer,
                              SwapHandle& handle) {
    ZINF_ASSIGN_OR_RETURN(const std::uint32_t first, run_indices(partitions));
    return submit_in(first, static_cast<std::uint32_t>(partitions.size()), 0, 0, false, buffer,
                     handle);
}

RangeRead SwapStore::range_read(PartitionId partition, std::uint64_t offset_bytes,
                                std::uint64_t length_bytes) const {
    const Extent e = extent(partition);
    ZINF_ASSERT_LE(offset_bytes + length_bytes, e.size_bytes);
    if (!verify_) return RangeRead{offset_bytes, length_bytes, 0};
    const std::uint64_t from = align_down(offset_bytes, kSwapBlockBytes);
    const std::uint64_t to = std::min<std::uint64_t>(
        align_up(offset_bytes + length_bytes, kSwapBlockBytes), e.size_bytes);
    return RangeRead{from, to - from, offset_bytes - from};
}

Status SwapStore::swap_in_range(PartitionId partition, std::uint64_t offset_bytes,
                                std::uint64_t length_bytes, std::span<std::byte> buffer,
                                SwapHandle& handle) {
    ZINF_ASSIGN_OR_RETURN(const std::uint32_t index, index_of(partition));
    const Partition& p = partitions_[index];
    if (length_bytes == 0 || offset_bytes > p.size_bytes ||
        length_bytes > p.size_bytes - offset_bytes) {
        return Status::invalid_argument(str_cat("swap '", name_, "': range [", offset_bytes, ", +",
                                                length_bytes, ") outside partition ", partition,
                                                " of ", p.size_bytes, " bytes"));
    }
    const RangeRead r = range_read(partition, offset_bytes, length_bytes);
    return submit_in(index, 1, r.read_offset_bytes, r.read_length_bytes, true, buffer, handle);
}

Status SwapStore::submit_out(std::uint32_t first, std::uint32_t count,
                             std::span<const std::byte> buffer, SwapHandle& handle,
                             WriteTarget target) {
    ZINF_ASSERT(committed_);
    ZINF_ASSERT(!handle.in_use());
    ZINF_ASSERT_GT(count, 0u);
    const bool shadow = target == WriteTarget::kShadow;
    if (shadow && !copy_on_write()) {
        return Status::invalid_argument(
            str_cat("swap '", name_, "': a shadow swap-out of partition ", partitions_[first].id,
                    " needs a copy-on-write store"));
    }
    ZINF_ASSIGN_OR_RETURN(const std::uint32_t current_plane, run_plane(first, count));
    const std::uint32_t plane = shadow ? 1 - current_plane : current_plane;
    wait_unpinned(first, count, plane);
    const Partition& a = partitions_[first];
    const Partition& b = partitions_[first + count - 1];
    const std::uint64_t length = b.offset_bytes + b.size_bytes - a.offset_bytes;
    if (buffer.size() < length) {
        return Status::invalid_argument(str_cat("swap '", name_, "': swap-out of partition ", a.id,
                                                " needs a buffer of ", length, " bytes, got ",
                                                buffer.size()));
    }
    // Claim the partitions: from here until wait() none of them is valid on disk (a shadow
    // write: none of their shadows; the current copies stay valid and readable).
    for (std::uint32_t i = first; i < first + count; ++i) {
        Live& live = live_[i];
        if (shadow) {
            const State before = live.shadow.exchange(State::kWriting, std::memory_order_acq_rel);
            ZINF_ASSERT_MSG(before != State::kWriting, "two shadow writes of one partition");
            ZINF_ASSERT_MSG(live.state.load() != State::kWriting,
                            "a shadow write beside a write of the current copy");
            live.before_write = before;
            continue;
        }
        ZINF_ASSERT_MSG(live.readers.load(std::memory_order_acquire) == 0,
                        "swap_out of a partition that is being swapped in");
        ZINF_ASSERT_MSG(live.shadow.load() != State::kWriting,
                        "a write of the current copy beside a shadow write");
        const State before = live.state.exchange(State::kWriting, std::memory_order_acq_rel);
        ZINF_ASSERT_MSG(before != State::kWriting, "two swap-outs of one partition in flight");
        live.before_write = before;
        // The current copy is being rewritten: a pending shadow is superseded.
        live.shadow.store(State::kEmpty, std::memory_order_release);
    }
    // A write the engine will discard leaves the disk as it was: its checksums must too.
    handle.unhashed_ = engine_.discarding();
    if (verify_ && !handle.unhashed_) {
        const std::uint64_t t0 = now_ns();
        for (std::uint32_t i = first; i < first + count; ++i) {
            const Partition& p = partitions_[i];
            const std::byte* data = buffer.data() + (p.offset_bytes - a.offset_bytes);
            std::uint64_t* sums = sums_of(p, plane);
            for_each_block(p.block_count, [&](std::uint32_t k) {
                const std::uint64_t from = static_cast<std::uint64_t>(k) * kSwapBlockBytes;
                const std::uint64_t len =
                    std::min<std::uint64_t>(kSwapBlockBytes, p.size_bytes - from);
                sums[k] = XXH3_64bits_withSeed(data + from, len, block_seed(p.id, k));
            });
        }
        checksum_ns_.fetch_add(now_ns() - t0, std::memory_order_relaxed);
        checksum_bytes_.fetch_add(length, std::memory_order_relaxed);
    }
    handle.op_ = io::OpKind::kWrite;
    handle.shadow_ = shadow;
    handle.plane_ = plane;
    handle.first_index_ = first;
    handle.count_ = count;
    handle.range_ = false;
    handle.buffer_ = const_cast<std::byte*>(buffer.data());
    const Status s = engine_.submit_write(handle.data_io_, data_file_, file_offset(a, plane),
                                          std::span<const std::byte>(handle.buffer_, length));
    if (!s.is_ok()) {
        for (std::uint32_t i = first; i < first + count; ++i) {
            (shadow ? live_[i].shadow : live_[i].state)
                .store(State::kFailed, std::memory_order_release);
        }
        return s.with_context(str_cat("swap '", name_, "': swap-out of partition ", a.id));
    }
    in_flight_.fetch_add(1, std::memory_order_relaxed);
    handle.store_ = this;
    return Status::ok();
}

Status SwapStore::submit_in(std::uint32_t first, std::uint32_t count, std::uint64_t range_offset,
                            std::uint64_t range_length, bool range, std::span<std::byte> buffer,
                            SwapHandle& handle, bool pinned) {
    ZINF_ASSERT(committed_);
    ZINF_ASSERT(!handle.in_use());
    ZINF_ASSERT_GT(count, 0u);
    const Partition& a = partitions_[first];
    const Partition& b = partitions_[first + count - 1];
    std::uint32_t plane = 0;
    if (pinned) {
        plane = live_[first].pinned_plane.load(std::memory_order_acquire);
        for (std::uint32_t i = first; i < first + count; ++i) {
            if (plane == kUnpinned || live_[i].pinned_plane.load() != plane) {
                return Status::invalid_argument(str_cat(
                    "swap '", name_, "': pinned read of partition ", partitions_[i].id,
                    plane == kUnpinned ? ", which is not pinned" : ", pinned in another plane"));
            }
        }
    } else {
        ZINF_ASSIGN_OR_RETURN(plane, run_plane(first, count));
    }
    const std::uint64_t at = file_offset(a, plane) + (range ? range_offset : 0);
    const std::uint64_t length =
        range ? range_length : b.offset_bytes + b.size_bytes - a.offset_bytes;
    if (buffer.size() < length) {
        return Status::invalid_argument(str_cat("swap '", name_, "': swap-in of partition ", a.id,
                                                " needs a buffer of ", length, " bytes, got ",
                                                buffer.size()));
    }
    // A pinned copy was valid when pinned and is never written while pinned.
    for (std::uint32_t i = first; i < first + count && !pinned; ++i) {
        const State state = live_[i].state.load(std::memory_order_acquire);
        ZINF_ASSERT_MSG(state != State::kWriting, "swap_in of a partition being swapped out");
        if (state != State::kValid) {
            return Status::not_found(str_cat("swap '", name_, "': partition ", partitions_[i].id,
                                             " has no valid copy on disk (",
                                             state == State::kEmpty ? "never written or invalidated"
                                                                    : "its last swap-out failed",
                                             ")"));
        }
    }
    for (std::uint32_t i = first; i < first + count; ++i) {
        (pinned ? live_[i].pinned_readers : live_[i].readers)
            .fetch_add(1, std::memory_order_acq_rel);
    }
    handle.op_ = io::OpKind::kRead;
    handle.shadow_ = false;
    handle.pinned_ = pinned;
    handle.plane_ = plane;
    handle.first_index_ = first;
    handle.count_ = count;
    handle.range_ = range;
    handle.range_offset_bytes_ = range_offset;
    handle.range_length_bytes_ = range_length;
    handle.buffer_ = buffer.data();
    const Status s = engine_.submit_read(handle.data_io_, data_file_, at, buffer.first(length));
    if (!s.is_ok()) {
        for (std::uint32_t i = first; i < first + count; ++i) {
            (pinned ? live_[i].pinned_readers : live_[i].readers)
                .fetch_sub(1, std::memory_order_acq_rel);
        }
        return s.with_context(str_cat("swap '", name_, "': swap-in of partition ", a.id));
    }
    in_flight_.fetch_add(1, std::memory_order_relaxed);
    handle.store_ = this;
    return Status::ok();
}

Status SwapStore::verify_blocks(const Partition& p, std::uint32_t plane, std::uint64_t from_bytes,
                                std::uint64_t to_bytes, const std::byte* data) noexcept {
    // `data` holds partition bytes [from_bytes, to_bytes), whole blocks (the last may be short).
    ZINF_ASSERT(is_aligned(from_bytes, kSwapBlockBytes));
    ZINF_ASSERT(to_bytes == p.size_bytes || is_aligned(to_bytes, kSwapBlockBytes));
    const std::uint64_t* sums = sums_of(p, plane);
    const auto first_block = static_cast<std::uint32_t>(from_bytes / kSwapBlockBytes);
    const auto block_count =
        static_cast<std::uint32_t>((to_bytes - from_bytes + kSwapBlockBytes - 1) / kSwapBlockBytes);
    auto hash_block = [&](std::uint64_t k) {
        const std::uint64_t at = k * kSwapBlockBytes;
        const std::uint64_t len = std::min<std::uint64_t>(kSwapBlockBytes, to_bytes - at);
        return XXH3_64bits_withSeed(data + (at - from_bytes), len, block_seed(p.id, k));
    };
    // The first bad block (lowest index) is reported, whichever worker finds one first.
    std::atomic<std::uint32_t> bad{UINT32_MAX};
    for_each_block(block_count, [&](std::uint32_t i) {
        const std::uint32_t k = first_block + i;
        if (hash_block(k) != sums[k]) [[unlikely]] {
            std::uint32_t seen = bad.load(std::memory_order_relaxed);
            while (k < seen && !bad.compare_exchange_weak(seen, k, std::memory_order_relaxed)) {
            }
        }
    });
    if (const std::uint32_t k_bad = bad.load(); k_bad != UINT32_MAX) [[unlikely]] {
        const std::uint64_t k = k_bad;
        const std::uint64_t at = k * kSwapBlockBytes;
        const std::uint64_t len = std::min<std::uint64_t>(kSwapBlockBytes, to_bytes - at);
        const std::uint64_t got = hash_block(k);
        corruptions_.fetch_add(1, std::memory_order_relaxed);
        return Status::corruption(str_cat(
            "swap '", name_, "': checksum mismatch in partition ", p.id, " at offset ", at,
            " (swap block ", k, " of ", p.block_count, ", ", len, " bytes at swap-file offset ",
            file_offset(p, plane) + at, " under ", run_dir_.run_paths().front(),
            "): expected xxh3 ", hex64(sums[k]), ", read ", hex64(got)));
    }
    return Status::ok();
}

Status SwapStore::complete(SwapHandle& handle) {
    ZINF_ASSERT(handle.store_ == this);
    Status status = handle.data_io_.wait();
    const std::uint32_t first = handle.first_index_;
    const std::uint32_t count = handle.count_;
    const Partition& a = partitions_[first];
    const Partition& b = partitions_[first + count - 1];
    if (handle.op_ == io::OpKind::kWrite) {
        // Only now, with every byte acknowledged, is the copy valid. A discarded write leaves
        // each partition as it was on disk, with its checksums; where the engine's discarding
        // changed between hashing and submitting, data and checksums disagree: no valid copy.
        const bool discarded = handle.data_io_.discarded();
        const bool consistent = discarded == handle.unhashed_ || !verify_;
        const State state = status.is_ok() && consistent ? State::kValid : State::kFailed;
        for (std::uint32_t i = first; i < first + count; ++i) {
            std::atomic<State>& target = handle.shadow_ ? live_[i].shadow : live_[i].state;
            ZINF_ASSERT(target.load() == State::kWriting);
            target.store(discarded && consistent ? live_[i].before_write : state,
                         std::memory_order_release);
        }
        if (status.is_ok() && !discarded) {
            bytes_out_.fetch_add(b.offset_bytes + b.size_bytes - a.offset_bytes,
                                 std::memory_order_relaxed);
        }
    } else {
        // A discarded read (io::Engine::set_discard) left the buffer as it was: nothing to verify.
        if (status.is_ok() && verify_ && !handle.data_io_.discarded()) {
            const std::uint64_t t0 = now_ns();
            std::uint64_t hashed = 0;
            if (handle.range_) {
                status = verify_blocks(a, handle.plane_, handle.range_offset_bytes_,
                                       handle.range_offset_bytes_ + handle.range_length_bytes_,
                                       handle.buffer_);
                hashed = handle.range_length_bytes_;
            } else {
                for (std::uint32_t i = first; i < first + count && status.is_ok(); ++i) {
                    const Partition& p = partitions_[i];
                    status = verify_blocks(p, handle.plane_, 0, p.size_bytes,
                                           handle.buffer_ + (p.offset_bytes - a.offset_bytes));
                    hashed += p.size_bytes;
                }
            }
            checksum_ns_.fetch_add(now_ns() - t0, std::memory_order_relaxed);
            checksum_bytes_.fetch_add(hashed, std::memory_order_relaxed);
        }
        if (status.is_ok()) bytes_in_.fetch_add(handle.data_io_.bytes(), std::memory_order_relaxed);
        for (std::uint32_t i = first; i < first + count; ++i) {
            const std::uint32_t before =
                (handle.pinned_ ? live_[i].pinned_readers : live_[i].readers)
                    .fetch_sub(1, std::memory_order_acq_rel);
            ZINF_ASSERT_GT(before, 0u);
        }
    }
    handle.store_ = nullptr;
    in_flight_.fetch_sub(1, std::memory_order_relaxed);
    if (!status.is_ok() && status.code() != StatusCode::kCorruption) {
        return status.with_context(str_cat(
            "swap '", name_, "': ",
            handle.op_ == io::OpKind::kWrite ? (handle.shadow_ ? "shadow swap-out" : "swap-out")
                                             : "swap-in",
            " of partition ", a.id, count > 1 ? str_cat(" and ", count - 1, " following") : ""));
    }
    return status;
}

SwapStoreStats SwapStore::stats() const noexcept {
    SwapStoreStats s;
    s.bytes_swapped_out = bytes_out_.load(std::memory_order_relaxed);
    s.bytes_swapped_in = bytes_in_.load(std::memory_order_relaxed);
    s.checksum_bytes = checksum_bytes_.load(std::memory_order_relaxed);
    s.checksum_ns = checksum_ns_.load(std::memory_order_relaxed);
    s.corruptions = corruptions_.load(std::memory_order_relaxed);
    s.pin_wait_ns = pin_wait_ns_.load(std::memory_order_relaxed);
    return s;
}

void SwapStore::reset_stats() noexcept {
    bytes_out_.store(0);
    bytes_in_.store(0);
    checksum_bytes_.store(0);
    checksum_ns_.store(0);
    corruptions_.store(0);
    pin_wait_ns_.store(0);
}

}  // namespace zinf::swap
