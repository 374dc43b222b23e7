// io::Engine: worker threads, the shared queue of caller operations that they cut into pieces,
// striping, the direct/buffered choice per piece, registered buffers and statistics with a fixed
// log-scale latency histogram. Opening and closing files is in engine_files.cc.
#include "io/engine.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <ctime>
#include <functional>
#include <thread>

#include "io/backend.h"
#include "io/detail/engine_impl.h"
#include "io/faulty_backend.h"
#include "io/storage.h"
#include "src/base/aligned.h"
#include "src/base/log.h"

namespace zinf::io {

using detail::File;
using detail::kHistogramBuckets;
using detail::kSubBuckets;
using detail::Piece;
using detail::Region;
using detail::Stripe;

namespace {

using Clock = std::chrono::steady_clock;

// Futex wait and wake on a handle's state word (private to this process). A wait returns on a
// wake-up, a timeout, a signal or a changed word; callers re-check the word. FUTEX_WAKE uses
// only the address, so it may follow the word's owner being freed (a stray wake-up of a later
// waiter at that address is harmless: every futex waiter re-checks its word).
static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) &&
              std::atomic<std::uint32_t>::is_always_lock_free);
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                const timespec* relative) noexcept {
    (void)::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE,
                    expected, relative, nullptr, 0);
}
void futex_wake_all(const std::atomic<std::uint32_t>* word) noexcept {
    (void)::syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

// How long a worker with I/O in flight waits in reap before it looks at the queue again; new
// work also gets picked up at each completion, so this only bounds the idle case.
constexpr std::chrono::microseconds kReapWait{20'000};

int latency_bucket(std::uint64_t us) noexcept {
    const std::uint64_t v = us + 1;
    const int e = 63 - std::countl_zero(v);
    const int sub =
        e >= 2 ? static_cast<int>((v >> (e - 2)) & 3) : static_cast<int>((v << (2 - e)) & 3);
    return std::min(e * kSubBuckets + sub, kHistogramBuckets - 1);
}
double bucket_value_us(int bucket) noexcept {
    const int e = bucket / kSubBuckets;
    const int sub = bucket % kSubBuckets;
    // The middle of the bucket [2^e (1 + sub/4), 2^e (1 + (sub+1)/4)).
    return std::ldexp(1.0 + (sub + 0.5) / kSubBuckets, e) - 1.0;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// IoHandle

IoHandle::~IoHandle() {
    // Nothing touches the handle once state_ is 0: the completing worker's last access is the
    // exchange that set it (its wake-up call after that uses only the address).
    ZINF_ASSERT_MSG(state_.load(std::memory_order_acquire) == 0,
                    "IoHandle destroyed while its operation is in flight");
}

void IoHandle::sleep_once(const timespec* relative) noexcept {
    std::uint32_t s = state_.load(std::memory_order_acquire);
    // A failed exchange reloads s: stop once the operation is done or another waiter set the bit.
    while (s != 0 && (s & kWaiterBit) == 0 &&
           !state_.compare_exchange_weak(s, s | kWaiterBit, std::memory_order_relaxed)) {
    }
    if (s != 0) futex_wait(state_, s | kWaiterBit, relative);
}

Status IoHandle::wait() {
    while (!done()) sleep_once(nullptr);
    return error_;
}

Status IoHandle::wait_for(std::chrono::microseconds timeout) {
    if (done()) return error_;
    const auto deadline = Clock::now() + timeout;
    while (!done()) {
        const auto left =
            std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - Clock::now());
        if (left.count() <= 0) {
            return Status::timeout(str_cat("I/O operation of ", length_bytes_,
                                           " bytes still in flight after ", timeout.count(),
                                           " us"));
        }
        timespec ts{};
        ts.tv_sec = static_cast<time_t>(left.count() / 1'000'000'000);
        ts.tv_nsec = static_cast<long>(left.count() % 1'000'000'000);
        sleep_once(&ts);
    }
    return error_;
}

// ---------------------------------------------------------------------------------------------
// Completion

void Engine::Impl::finish(IoHandle& h, Status* error) noexcept {
    if (error != nullptr && !error->is_ok()) {
        std::lock_guard lock(h.error_mutex_);
        if (h.error_.is_ok()) h.error_ = std::move(*error);
        h.failed_.store(true, std::memory_order_relaxed);
    }
    // A piece is cut only while the cutting token is held, so the count cannot rise again once
    // it has fallen to 0; acq_rel makes every earlier finisher's error visible to the last.
    if (h.pending_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    const auto us =
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - h.submitted_at_)
            .count();
    latency[static_cast<std::size_t>(
                latency_bucket(static_cast<std::uint64_t>(std::max<long>(us, 0))))]
        .fetch_add(1, std::memory_order_relaxed);
    requests_completed.fetch_add(1, std::memory_order_relaxed);
    static_cast<File*>(h.file_)->ops_in_flight.fetch_sub(1, std::memory_order_acq_rel);
    // From here on the caller may reuse or destroy the handle: only its address is used below.
    std::atomic<std::uint32_t>* const word = &h.state_;
    if ((word->exchange(0, std::memory_order_acq_rel) & IoHandle::kWaiterBit) != 0) {
        futex_wake_all(word);
    }
}

void EngineWorker::on_piece_complete(Request& request, const Status& status) {
    Piece& piece = *static_cast<Piece*>(request.user);
    EngineWorker& self = *piece.worker;
    Engine::Impl& impl = self.impl_;
    ZINF_ASSERT(request.state == Request::State::kIdle);
    impl.pieces_completed.fetch_add(1, std::memory_order_relaxed);
    if (request.short_transfers != 0) {
        impl.short_transfers.fetch_add(request.short_transfers, std::memory_order_relaxed);
    }
    if (request.retries != 0) impl.retries.fetch_add(request.retries, std::memory_order_relaxed);
    if (request.used_fixed_buffer) {
        (request.op == OpKind::kRead ? impl.pieces_fixed_buffer_read
                                     : impl.pieces_fixed_buffer_written)
            .fetch_add(1, std::memory_order_relaxed);
    }
    if (request.used_fixed_file) impl.pieces_fixed_file.fetch_add(1, std::memory_order_relaxed);
    if (!request.used_fixed_buffer && !request.used_fixed_file) {
        impl.pieces_plain.fetch_add(1, std::memory_order_relaxed);
    }
    IoHandle& handle = *piece.handle;
    piece.handle = nullptr;
    self.free_[self.free_count_++] = piece.index;
    ZINF_ASSERT_LE(self.free_count_, self.pieces_.size());
    if (status.is_ok()) {
        ZINF_ASSERT_EQ(request.done_bytes, request.length_bytes);
        (request.op == OpKind::kRead ? impl.bytes_read : impl.bytes_written)
            .fetch_add(request.length_bytes, std::memory_order_relaxed);
        impl.finish(handle, nullptr);
        return;
    }
    // Off the hot path from here: name the file, offset and length (with_context keeps the
    // code, the errno and an injected fault's mark).
    const File& file = *piece.file;
    std::string context =
        str_cat(request.op == OpKind::kRead ? "read " : "write ", file.stripes[piece.stripe].path,
                " offset ", request.offset_bytes, " length ", request.length_bytes);
    if (file.stripes.size() > 1) {
        context += str_cat(" (logical offset ", piece.logical_offset_bytes, ")");
    }
    Status error = status.with_context(context);
    impl.finish(handle, &error);
}

// ---------------------------------------------------------------------------------------------
// Worker

EngineWorker::EngineWorker(Engine::Impl& impl, std::size_t index) : impl_(impl), index_(index) {
    const auto depth = static_cast<std::size_t>(impl.aio.queue_depth);
    pieces_ = std::vector<Piece>(depth);
    free_.resize(depth);
    batch_.resize(depth);
    for (std::size_t i = 0; i < depth; ++i) {
        pieces_[i].worker = this;
        pieces_[i].index = static_cast<std::uint32_t>(i);
        free_[i] = static_cast<std::uint32_t>(depth - 1 - i);
    }
    free_count_ = depth;
}

EngineWorker::~EngineWorker() {
    if (thread_.joinable()) thread_.join();
}

Status EngineWorker::start(const std::string& kind) {
    thread_ = std::thread([this, kind] { run(kind); });
    std::unique_lock lock(impl_.mutex);
    impl_.control_cv.wait(lock, [&] { return init_done_; });
    if (!init_status_.is_ok()) {
        lock.unlock();
        thread_.join();
    }
    return init_status_;
}

Status EngineWorker::init_backend(const std::string& kind) {
    const auto depth = static_cast<std::size_t>(impl_.aio.queue_depth);
    BackendOptions bo;
    bo.kind = kind;
    bo.queue_depth = depth;
    bo.sqpoll = impl_.aio.sqpoll;
    bo.single_submit = impl_.aio.single_submit;
    bo.seams = impl_.options.seams;
    ZINF_ASSIGN_OR_RETURN(base_backend_, impl_.storage->make_backend(bo, index_));
    ZINF_ASSERT(base_backend_ != nullptr);
    backend_ = base_backend_.get();
    if (impl_.options.faults) {
        faulty_ = std::make_unique<FaultyBackend>(*base_backend_, *impl_.options.faults,
                                                  *impl_.fault_shared, index_);
        backend_ = faulty_.get();
    }
    ZINF_ASSERT_EQ(backend_->queue_depth(), depth);
    return Status::ok();
}

void EngineWorker::run(const std::string& kind) {
    Status status = init_backend(kind);
    {
        std::lock_guard lock(impl_.mutex);
        init_status_ = std::move(status);
        init_done_ = true;
    }
    impl_.control_cv.notify_all();
    if (!init_status_.is_ok()) return;
    loop();
    ZINF_ASSERT_EQ(backend_->in_flight_count(), 0u);
    // Teardown order: the wrapper before the backend it wraps, both on their own thread.
    faulty_.reset();
    base_backend_.reset();
}

int EngineWorker::buffer_index(const std::byte* buffer, std::uint32_t length) const noexcept {
    if (regions_.empty()) return -1;
    const auto begin = reinterpret_cast<std::uintptr_t>(buffer);
    // Regions are sorted by address and disjoint: the candidate is the last one starting at or
    // before `begin`.
    auto it = std::upper_bound(regions_.begin(), regions_.end(), begin,
                               [](std::uintptr_t v, const Region& r) { return v < r.begin; });
    if (it == regions_.begin()) return -1;
    --it;
    return begin + length <= it->end ? it->index : -1;
}

void EngineWorker::carve_locked() {
    const std::uint64_t block = impl_.aio.block_size_bytes;
    while (free_count_ > 0 && impl_.head != nullptr) {
        IoHandle& h = *impl_.head;
        const bool failed = h.failed_.load(std::memory_order_relaxed);
        if (!failed) {
            File& f = *static_cast<File*>(h.file_);
            const std::uint64_t logical = h.offset_bytes_ + h.cursor_bytes_;
            std::uint64_t length = std::min(block, h.length_bytes_ - h.cursor_bytes_);
            std::uint32_t stripe = 0;
            std::uint64_t physical = logical;
            const auto stripe_count = static_cast<std::uint64_t>(f.stripes.size());
            if (stripe_count > 1) {
                // Round-robin chunks; a piece never crosses a chunk boundary.
                const std::uint64_t chunk = logical / f.chunk_bytes;
                const std::uint64_t within = logical % f.chunk_bytes;
                stripe = static_cast<std::uint32_t>(chunk % stripe_count);
                physical = (chunk / stripe_count) * f.chunk_bytes + within;
                length = std::min(length, f.chunk_bytes - within);
            }
            std::byte* buffer = h.buffer_ + h.cursor_bytes_;
            const Stripe& s = f.stripes[stripe];
            const std::size_t align = f.alignment_bytes;
            // Buffered and direct pieces of one request never share a page: a buffered write
            // that dirties a page in flight with an O_DIRECT write to another part of it can
            // write the page back over the direct bytes (the kernel then logs "Page cache
            // invalidation failure on direct I/O"), and later buffered reads see stale data.
            // So a request whose buffer and offset agree modulo the alignment goes buffered up
            // to the first page boundary, direct over whole pages, and buffered after the last.
            const std::uint64_t page = std::max<std::uint64_t>(align, kPageBytes);
            bool direct = false;
            if (f.direct && reinterpret_cast<std::uintptr_t>(buffer) % align == physical % align) {
                if (physical % page != 0) {
                    length = std::min<std::uint64_t>(length, page - physical % page);
                } else if (length >= page) {
                    length = align_down(length, page);
                    direct = true;
                }
            }
            Piece& piece = pieces_[free_[--free_count_]];
            ZINF_ASSERT(piece.handle == nullptr);
            Request& r = piece.request;
            ZINF_ASSERT(r.state == Request::State::kIdle);
            r.op = h.op_;
            r.fd = direct ? s.direct_fd_value : s.buffered_fd_value;
            r.fixed_file_index = direct ? s.direct_slot : s.buffered_slot;
            r.offset_bytes = physical;
            r.length_bytes = static_cast<std::uint32_t>(length);
            r.buffer = buffer;
            r.buffer_index = buffer_index(buffer, r.length_bytes);
            r.done_bytes = 0;
            r.retries = 0;
            r.short_transfers = 0;
            r.used_fixed_buffer = false;
            r.used_fixed_file = false;
            r.callback = &EngineWorker::on_piece_complete;
            r.user = &piece;
            piece.handle = &h;
            piece.file = &f;
            piece.stripe = stripe;
            piece.logical_offset_bytes = logical;
            h.pending_.fetch_add(1, std::memory_order_relaxed);
            h.cursor_bytes_ += length;
            batch_[batch_count_++] = &r;
        }
        if (failed || h.cursor_bytes_ == h.length_bytes_) {
            // Fully cut (or abandoned after an error): drop the cutting token.
            impl_.head = h.next_;
            if (impl_.head == nullptr) impl_.tail = nullptr;
            // The head was the last urgent one (urgent ones are a prefix).
            if (impl_.urgent_tail == &h) impl_.urgent_tail = nullptr;
            h.next_ = nullptr;
            impl_.queued_ops.fetch_sub(1, std::memory_order_relaxed);
            impl_.finish(h, nullptr);
        }
    }
}

void EngineWorker::submit_batch() noexcept {
    if (batch_count_ == 0) return;
    auto accepted = backend_->submit(std::span<Request* const>(batch_.data(), batch_count_));
    // The backend took a prefix of the batch (now in flight) and handed the rest back untouched:
    // they stay in the batch, in order, and go at the next pass (after a reap when it was busy).
    std::size_t taken = accepted.has_value() ? *accepted : 0;
    if (accepted.has_value()) ZINF_ASSERT_GT(taken, 0u);
    ZINF_ASSERT_LE(taken, batch_count_);
    for (std::size_t i = taken; i < batch_count_; ++i) {
        ZINF_DASSERT(batch_[i]->state == Request::State::kIdle);
    }
    Request* refused = nullptr;
    if (!accepted.has_value() && accepted.error().code() != StatusCode::kBusy) {
        // The kernel refused the batch and took none of it; the error is the first piece's
        // (io_submit reports the first iocb it refuses; a failed io_uring_enter takes none). That
        // piece fails, once. The others are offered again at the next pass, each then either
        // taken or, if the kernel still refuses, failed in its turn at the head of the batch.
        refused = batch_[0];
        ZINF_ASSERT(refused->state == Request::State::kIdle);
        taken = 1;
    }
    std::copy(batch_.begin() + static_cast<std::ptrdiff_t>(taken),
              batch_.begin() + static_cast<std::ptrdiff_t>(batch_count_), batch_.begin());
    batch_count_ -= taken;
    if (refused != nullptr) on_piece_complete(*refused, accepted.error());
}

void EngineWorker::loop() {
    const bool overlap = impl_.aio.overlap_events;
    std::unique_lock lock(impl_.mutex, std::defer_lock);
    for (;;) {
        lock.lock();
        if (control_fn_ != nullptr && !control_done_) {
            const auto* fn = control_fn_;
            lock.unlock();
            Status status = (*fn)(*this);
            lock.lock();
            control_status_ = std::move(status);
            control_done_ = true;
            impl_.control_cv.notify_all();
        }
        const std::size_t in_flight = backend_->in_flight_count();
        // Without overlap_events, a new batch starts only when the previous one has drained.
        if (overlap || (in_flight == 0 && batch_count_ == 0)) carve_locked();
        if (batch_count_ == 0 && in_flight == 0) {
            if (impl_.stopping && impl_.head == nullptr) return;
            impl_.work_cv.wait(lock);
            lock.unlock();
            continue;
        }
        lock.unlock();
        submit_batch();
        if (backend_->in_flight_count() == 0) continue;
        // With free pieces, a blocking reap asks to be woken by the next submit (Dekker-style:
        // set the flag, then look at the queue; submit enqueues, then looks at the flag).
        const bool wakeable = overlap && free_count_ > 0 && batch_count_ == 0;
        if (wakeable) sleeping_in_reap_.store(true, std::memory_order_seq_cst);
        const bool more_work = wakeable && impl_.queued_ops.load(std::memory_order_seq_cst) > 0;
        std::size_t min_count = 1;
        if (more_work) min_count = 0;
        if (!overlap) min_count = backend_->in_flight_count();
        auto reaped =
            backend_->reap(min_count, more_work ? std::chrono::microseconds(0) : kReapWait);
        if (wakeable) sleeping_in_reap_.store(false, std::memory_order_relaxed);
        if (!reaped.has_value() && reap_errors_logged_ < 10) {
            ++reap_errors_logged_;
            log::error("io worker ", index_, ": reap failed: ", reaped.error().to_string());
        }
    }
}

Status Engine::Impl::run_on_workers(const std::function<Status(EngineWorker&)>& fn) {
    std::unique_lock lock(mutex);
    // One control operation at a time.
    control_cv.wait(lock, [&] {
        return std::all_of(workers.begin(), workers.end(),
                           [](const auto& w) { return w->control_fn_ == nullptr; });
    });
    for (auto& w : workers) {
        w->control_fn_ = &fn;
        w->control_done_ = false;
    }
    work_cv.notify_all();
    control_cv.wait(lock, [&] {
        return std::all_of(workers.begin(), workers.end(),
                           [](const auto& w) { return w->control_done_; });
    });
    Status first;
    for (auto& w : workers) {
        if (first.is_ok() && !w->control_status_.is_ok()) first = std::move(w->control_status_);
        w->control_status_ = Status();
        w->control_fn_ = nullptr;
    }
    control_cv.notify_all();
    return first;
}

// ---------------------------------------------------------------------------------------------
// Engine

Engine::Engine() = default;

Engine::~Engine() {
    if (!impl_) return;
    {
        std::lock_guard lock(impl_->mutex);
        impl_->stopping = true;
    }
    impl_->work_cv.notify_all();
    impl_->workers.clear();  // joins: each worker drains its queue and in-flight pieces first
    impl_->files.clear();
}

namespace {

Status check_engine_options(const EngineOptions& options) {
    const AioOptions& aio = options.aio;
    if (aio.block_size_bytes == 0 || aio.block_size_bytes > (std::uint64_t{1} << 30)) {
        return Status::invalid_argument(
            str_cat("aio.block_size: expected 1 byte to 1 GiB, got ", aio.block_size_bytes));
    }
    if (aio.queue_depth < 1 || aio.queue_depth > 4096) {
        return Status::invalid_argument(
            str_cat("aio.queue_depth: expected 1 to 4096, got ", aio.queue_depth));
    }
    if (aio.intra_op_parallelism < 1 || aio.intra_op_parallelism > 256) {
        return Status::invalid_argument(
            str_cat("aio.intra_op_parallelism: expected 1 to 256, got ", aio.intra_op_parallelism));
    }
    if (options.faults && options.faults->latency_us_min > options.faults->latency_us_max) {
        return Status::invalid_argument("fault plan: latency_us_min > latency_us_max");
    }
    return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::create(const EngineOptions& options) {
    ZINF_TRY(check_engine_options(options));
    ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Storage> owned_storage, make_storage(options));
    std::unique_ptr<Engine> engine(new Engine());  // private constructor
    engine->impl_ = std::make_unique<Impl>(options);
    Impl& impl = *engine->impl_;
    impl.owned_storage = std::move(owned_storage);
    impl.storage = options.storage != nullptr ? options.storage : impl.owned_storage.get();
    ZINF_ASSERT(impl.storage != nullptr);
    if (options.faults) impl.fault_shared = std::make_unique<FaultyBackend::Shared>();

    std::string kind = options.aio.backend;
    for (int i = 0; i < options.aio.intra_op_parallelism; ++i) {
        impl.workers.push_back(std::make_unique<EngineWorker>(impl, static_cast<std::size_t>(i)));
        Status status = impl.workers.back()->start(kind);
        if (!status.is_ok()) {
            impl.workers.pop_back();
            return status;  // the destructor stops the workers already started
        }
        if (i == 0) {
            // The other workers get what the first one settled on.
            impl.backend_name = std::string(impl.workers.back()->backend_name());
            kind = impl.backend_name;
        }
    }
    return engine;
}

std::string_view Engine::backend_name() const noexcept {
    return impl_->backend_name;
}
const AioOptions& Engine::aio() const noexcept {
    return impl_->aio;
}
FileSystem& Engine::file_system() const noexcept {
    return impl_->options.file_system != nullptr ? *impl_->options.file_system
                                                 : posix_file_system();
}

Status Engine::register_buffers(std::span<std::byte> region) {
    Impl& impl = *impl_;
    if (region.empty()) return Status::invalid_argument("register_buffers: empty region");
    if (!impl.aio.register_buffers || !impl.storage->registers_buffers()) return Status::ok();
    std::vector<std::span<std::byte>> all;
    {
        std::lock_guard lock(impl.mutex);
        for (std::size_t at = 0; at < region.size(); at += kMaxRegisteredBufferBytes) {
            impl.regions.push_back(
                region.subspan(at, std::min(kMaxRegisteredBufferBytes, region.size() - at)));
        }
        all = impl.regions;
    }
    std::vector<Region> table;
    for (std::size_t i = 0; i < all.size(); ++i) {
        const auto begin = reinterpret_cast<std::uintptr_t>(all[i].data());
        table.push_back(Region{begin, begin + all[i].size(), static_cast<int>(i)});
    }
    std::sort(table.begin(), table.end(),
              [](const Region& a, const Region& b) { return a.begin < b.begin; });
    for (std::size_t i = 1; i < table.size(); ++i) {
        if (table[i].begin < table[i - 1].end) {
            return Status::invalid_argument(
                "register_buffers: region overlaps one registered before");
        }
    }
    // The table changes on the worker's own thread, between batches: no piece sees it half-done.
    // A worker with pieces in flight finishes them first (io_uring replaces its table whole).
    return impl.run_on_workers([&all, &table](EngineWorker& w) -> Status {
        for (int spin = 0; w.backend().in_flight_count() > 0; ++spin) {
            ZINF_ASSERT_LT(spin, 1 << 24);
            auto r =
                w.backend().reap(w.backend().in_flight_count(), std::chrono::milliseconds(100));
            if (!r.has_value()) return r.error();
        }
        Status st = w.backend().register_buffers(all);
        if (st.is_ok()) {
            w.regions_ = table;
        } else {
            w.regions_.clear();
        }
        return st;
    });
}

Status Engine::submit(std::span<const BatchItem> items) {
    Impl& impl = *impl_;
    if (items.empty()) return Status::ok();
    const auto now = Clock::now();
    std::unique_lock lock(impl.mutex);
    // Check everything first: a batch starts whole or not at all.
    for (std::size_t i = 0; i < items.size(); ++i) {
        const BatchItem& it = items[i];
        if (it.handle == nullptr) return Status::invalid_argument("submit: null handle");
        const File* f = impl.file_locked(it.file);
        if (f == nullptr) {
            return Status::invalid_argument(str_cat("submit: unknown file id ", it.file));
        }
        if (it.buffer.empty()) {
            return Status::invalid_argument(str_cat(it.op == OpKind::kRead ? "read " : "write ",
                                                    f->stripes[0].path, " offset ", it.offset_bytes,
                                                    ": empty buffer (length 0)"));
        }
        if (it.offset_bytes > UINT64_MAX - it.buffer.size()) {
            return Status::invalid_argument(str_cat("submit: offset ", it.offset_bytes,
                                                    " + length ", it.buffer.size(), " overflows"));
        }
        if (it.op == OpKind::kWrite && f->read_only) {
            return Status::invalid_argument(
                str_cat("write ", f->stripes[0].path, ": file opened read-only"));
        }
        if (!it.handle->done()) {
            return Status::invalid_argument("submit: handle still has an operation in flight");
        }
        for (std::size_t j = 0; j < i; ++j) {
            if (items[j].handle == it.handle) {
                return Status::invalid_argument("submit: one handle twice in a batch");
            }
        }
        if (impl.stopping) return Status::invalid_argument("submit: engine is shutting down");
    }
    if (impl.discard.load(std::memory_order_acquire)) {
        for (const BatchItem& it : items) {
            IoHandle& h = *it.handle;
            h.error_ = Status();
            h.length_bytes_ = it.buffer.size();
            h.op_ = it.op;
            h.discarded_ = true;
            h.state_.store(0, std::memory_order_release);
        }
        impl.ops_discarded.fetch_add(items.size(), std::memory_order_relaxed);
        return Status::ok();
    }
    for (const BatchItem& it : items) {
        File* f = impl.file_locked(it.file);
        IoHandle& h = *it.handle;
        h.discarded_ = false;
        // The handle is idle (checked above), so nothing else reads these until the worker
        // takes it from the queue under impl.mutex.
        h.error_ = Status();
        h.failed_.store(false, std::memory_order_relaxed);
        h.length_bytes_ = it.buffer.size();
        h.submitted_at_ = now;
        h.file_ = f;
        h.buffer_ = it.buffer.data();
        h.offset_bytes_ = it.offset_bytes;
        h.cursor_bytes_ = 0;
        h.op_ = it.op;
        h.next_ = nullptr;
        h.pending_.store(1, std::memory_order_relaxed);  // the cutting token
        h.state_.store(IoHandle::kBusy, std::memory_order_release);
        f->ops_in_flight.fetch_add(1, std::memory_order_relaxed);
        if (h.urgent_) {
            // Behind the urgent ones already queued, ahead of the rest (the head may be an
            // operation partly cut into pieces: the rest of it is cut after this one).
            IoHandle** link = impl.urgent_tail == nullptr ? &impl.head : &impl.urgent_tail->next_;
            h.next_ = *link;
            *link = &h;
            if (impl.tail == impl.urgent_tail) impl.tail = &h;
            impl.urgent_tail = &h;
        } else {
            if (impl.tail == nullptr) {
                impl.head = &h;
            } else {
                impl.tail->next_ = &h;
            }
            impl.tail = &h;
        }
        impl.queued_ops.fetch_add(1, std::memory_order_seq_cst);
    }
    lock.unlock();
    impl.work_cv.notify_all();
    for (auto& w : impl.workers) w->wake_if_sleeping();
    return Status::ok();
}

void Engine::set_discard(bool on) noexcept {
    impl_->discard.store(on, std::memory_order_release);
}

bool Engine::discarding() const noexcept {
    return impl_->discard.load(std::memory_order_acquire);
}

Status Engine::submit_read(IoHandle& handle, FileId file, std::uint64_t offset_bytes,
                           std::span<std::byte> buffer) {
    const BatchItem item{&handle, OpKind::kRead, file, offset_bytes, buffer};
    return submit(std::span<const BatchItem>(&item, 1));
}

Status Engine::submit_write(IoHandle& handle, FileId file, std::uint64_t offset_bytes,
                            std::span<const std::byte> buffer) {
    // The engine never writes through a write's buffer; the span is non-const only because
    // BatchItem serves both directions.
    const BatchItem item{
        &handle, OpKind::kWrite, file, offset_bytes,
        std::span<std::byte>(const_cast<std::byte*>(buffer.data()), buffer.size())};
    return submit(std::span<const BatchItem>(&item, 1));
}

Status Engine::read(FileId file, std::uint64_t offset_bytes, std::span<std::byte> buffer) {
    IoHandle handle;
    ZINF_TRY(submit_read(handle, file, offset_bytes, buffer));
    return handle.wait();
}

Status Engine::write(FileId file, std::uint64_t offset_bytes, std::span<const std::byte> buffer) {
    IoHandle handle;
    ZINF_TRY(submit_write(handle, file, offset_bytes, buffer));
    return handle.wait();
}

EngineStats Engine::stats() const {
    const Impl& impl = *impl_;
    EngineStats s;
    s.bytes_read = impl.bytes_read.load(std::memory_order_relaxed);
    s.bytes_written = impl.bytes_written.load(std::memory_order_relaxed);
    s.requests_completed = impl.requests_completed.load(std::memory_order_relaxed);
    s.pieces_completed = impl.pieces_completed.load(std::memory_order_relaxed);
    s.short_transfers_resubmitted = impl.short_transfers.load(std::memory_order_relaxed);
    s.retries = impl.retries.load(std::memory_order_relaxed);
    s.pieces_fixed_buffer_read = impl.pieces_fixed_buffer_read.load(std::memory_order_relaxed);
    s.pieces_fixed_buffer_written =
        impl.pieces_fixed_buffer_written.load(std::memory_order_relaxed);
    s.pieces_fixed_file = impl.pieces_fixed_file.load(std::memory_order_relaxed);
    s.pieces_plain = impl.pieces_plain.load(std::memory_order_relaxed);
    s.ops_discarded = impl.ops_discarded.load(std::memory_order_relaxed);
    if (impl.fault_shared) {
        s.faults_injected = impl.fault_shared->faults_injected.load(std::memory_order_relaxed);
    }
    std::array<std::uint64_t, kHistogramBuckets> counts{};
    std::uint64_t total = 0;
    for (int i = 0; i < kHistogramBuckets; ++i) {
        counts[static_cast<std::size_t>(i)] =
            impl.latency[static_cast<std::size_t>(i)].load(std::memory_order_relaxed);
        total += counts[static_cast<std::size_t>(i)];
    }
    auto percentile = [&](double q) {
        if (total == 0) return 0.0;
        const auto rank = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(total)));
        std::uint64_t seen = 0;
        for (int i = 0; i < kHistogramBuckets; ++i) {
            seen += counts[static_cast<std::size_t>(i)];
            if (seen >= std::max<std::uint64_t>(rank, 1)) return bucket_value_us(i);
        }
        return bucket_value_us(kHistogramBuckets - 1);
    };
    s.latency_us_p50 = percentile(0.50);
    s.latency_us_p99 = percentile(0.99);
    return s;
}

void Engine::reset_stats() {
    Impl& impl = *impl_;
    for (auto* c : {&impl.bytes_read, &impl.bytes_written, &impl.requests_completed,
                    &impl.pieces_completed, &impl.short_transfers, &impl.retries,
                    &impl.pieces_fixed_buffer_read, &impl.pieces_fixed_buffer_written,
                    &impl.pieces_fixed_file, &impl.pieces_plain, &impl.ops_discarded}) {
        c->store(0, std::memory_order_relaxed);
    }
    for (auto& b : impl.latency) b.store(0, std::memory_order_relaxed);
}

}  // namespace zinf::io
