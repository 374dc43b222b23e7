// The io_uring backend (liburing): one ring per worker. SQEs are prepared in batches and handed
// over with one io_uring_submit; completions are reaped in batches. Registered buffers use
// READ_FIXED/WRITE_FIXED, registered files IOSQE_FIXED_FILE. The ring is set up with
// SINGLE_ISSUER | DEFER_TASKRUN | COOP_TASKRUN | SUBMIT_ALL where the kernel has them.
#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "io/detail/backends.h"
#include "io/detail/completion.h"
#include "src/base/log.h"

namespace zinf::io::detail {
namespace {

const char* errno_name(int err) {
    switch (err) {
        case EPERM:
            return "EPERM";
        case ENOSYS:
            return "ENOSYS";
        case EINVAL:
            return "EINVAL";
        case ENOMEM:
            return "ENOMEM";
        case EFAULT:
            return "EFAULT";
        case EACCES:
            return "EACCES";
        case EMFILE:
            return "EMFILE";
        default:
            return "error";
    }
}

class UringBackend final : public Backend {
public:
    static Result<std::unique_ptr<Backend>> create(const BackendOptions& options) {
        // One entry more than the queue depth: the read that waits on the wake-up eventfd.
        const auto entries = static_cast<unsigned>(options.queue_depth) + 1;
        // From the most to the least capable; a kernel that lacks a flag answers EINVAL.
        // DEFER_TASKRUN needs SINGLE_ISSUER and excludes SQPOLL.
        std::vector<unsigned> attempts;
        if (options.sqpoll) {
            attempts = {IORING_SETUP_SQPOLL | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_SUBMIT_ALL,
                        IORING_SETUP_SQPOLL};
        } else {
            attempts = {
                IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
                    IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL,
                IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL,
                IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL, IORING_SETUP_SUBMIT_ALL, 0u};
        }
        auto backend = std::unique_ptr<UringBackend>(new UringBackend(options));  // private ctor
        int rc = -EINVAL;
        unsigned used_flags = 0;
        for (unsigned flags : attempts) {
            io_uring_params params{};
            params.flags = flags | IORING_SETUP_CQSIZE;
            // Twice the SQ: completions never outrun the CQ (in flight <= queue_depth), and the
            // kernel's overflow list (IORING_FEAT_NODROP) is the second line of defence.
            params.cq_entries = 2 * entries;
            if ((flags & IORING_SETUP_SQPOLL) != 0) params.sq_thread_idle = 100;  // ms
            rc = io_uring_queue_init_params(entries, &backend->ring_, &params);
            if (rc == 0) {
                used_flags = flags;
                backend->features_ = params.features;
                break;
            }
            if (rc != -EINVAL) break;
        }
        if (rc < 0) {
            const int err = -rc;
            std::string why = str_cat("io_uring: io_uring_setup: ", errno_name(err), " (",
                                      std::strerror(err), ")");
            if (err == EPERM) why += ", likely seccomp or kernel.io_uring_disabled";
            if (err == ENOSYS) why += ", kernel too old or built without io_uring";
            if (err == ENOMEM) why += ", RLIMIT_MEMLOCK too low for the rings";
            if (options.sqpoll && (err == EPERM || err == EACCES))
                why += " (SQPOLL needs privileges)";
            return Status::not_supported(std::move(why), err);
        }
        backend->ring_ready_ = true;
        backend->defer_taskrun_ = (used_flags & IORING_SETUP_DEFER_TASKRUN) != 0;
        // Saves an fdget per io_uring_enter; optional.
        (void)io_uring_register_ring_fd(&backend->ring_);
        const int files_rc = io_uring_register_files_sparse(&backend->ring_, kFixedFileSlots);
        backend->files_supported_ = files_rc == 0;
        // Blocking eventfd on purpose: io_uring then waits for it with an internal poll, where a
        // non-blocking one would complete at once with -EAGAIN.
        backend->wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
        if (backend->wake_fd_ < 0) {
            return Status::from_errno(errno, "io_uring: eventfd for wake-ups");
        }
        backend->arm_wake();
        if (const int src = io_uring_submit(&backend->ring_); src < 0) {
            return Status::from_errno(-src, "io_uring: arming the wake-up read");
        }
        log::debug("io_uring: ring of ", entries, " entries, setup flags 0x", std::hex, used_flags,
                   std::dec, backend->files_supported_ ? ", fixed files" : ", no fixed files");
        return std::unique_ptr<Backend>(std::move(backend));
    }

    ~UringBackend() override {
        ZINF_ASSERT_EQ(in_flight_, 0u);
        // queue_exit also drops the registered buffers and files, and cancels the wake-up read.
        if (ring_ready_) io_uring_queue_exit(&ring_);
        if (wake_fd_ >= 0) ::close(wake_fd_);
    }

    void wake() noexcept override {
        const std::uint64_t one = 1;
        // A full counter (never in practice) already means "woken".
        (void)!::write(wake_fd_, &one, sizeof one);
    }

    std::string_view name() const noexcept override { return "io_uring"; }

    Status register_buffers(std::span<const std::span<std::byte>> regions) override {
        ZINF_ASSERT_EQ(in_flight_, 0u);
        if (registered_buffers_ > 0) {
            const int rc = io_uring_unregister_buffers(&ring_);
            registered_buffers_ = 0;
            if (rc < 0) return Status::from_errno(-rc, "io_uring_unregister_buffers");
        }
        if (regions.empty()) return Status::ok();
        std::vector<iovec> iovecs;
        iovecs.reserve(regions.size());
        for (const auto& r : regions) {
            if (r.size() > kMaxRegisteredBufferBytes) {
                return Status::invalid_argument(
                    str_cat("register_buffers: region of ", r.size(), " bytes exceeds 1 GiB"));
            }
            iovecs.push_back(iovec{r.data(), r.size()});
        }
        const int rc =
            io_uring_register_buffers(&ring_, iovecs.data(), static_cast<unsigned>(iovecs.size()));
        if (rc < 0) {
            std::string what = str_cat("io_uring_register_buffers (", regions.size(), " regions)");
            if (rc == -ENOMEM) what += " [RLIMIT_MEMLOCK too low?]";
            return Status::from_errno(-rc, what);
        }
        registered_buffers_ = static_cast<int>(regions.size());
        return Status::ok();
    }

    Status register_file(int slot, int fd) override {
        ZINF_ASSERT_GE(slot, 0);
        ZINF_ASSERT_LT(slot, kFixedFileSlots);
        if (!files_supported_) return Status::ok();
        const int rc = io_uring_register_files_update(&ring_, static_cast<unsigned>(slot), &fd, 1);
        if (rc < 0) {
            file_registered_[static_cast<std::size_t>(slot)] = false;
            return Status::from_errno(-rc, str_cat("io_uring_register_files_update slot ", slot));
        }
        file_registered_[static_cast<std::size_t>(slot)] = fd >= 0;
        return Status::ok();
    }

    Result<std::size_t> submit(std::span<Request* const> requests) noexcept override {
        const std::size_t room = std::min(requests.size(), queue_depth_ - in_flight_);
        if (room == 0) return Status::busy("io_uring queue full");
        std::size_t accepted = 0;
        int error = 0;
        while (accepted < room) {
            // single_submit: one io_uring_enter per request (a tuning knob, not a correctness one).
            const std::size_t want = single_submit_ ? 1 : room - accepted;
            const unsigned first = ring_.sq.sqe_tail;
            std::size_t prepared = 0;
            for (; prepared < want; ++prepared) {
                Request& r = *requests[accepted + prepared];
                check_submitted(r);
                // The SQ holds queue_depth + 1 entries, as many as ours, the wake-up read and the
                // resubmissions of requests in flight together; a full one is handled anyway.
                io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
                if (sqe == nullptr) break;
                prepare(sqe, r);
            }
            if (prepared == 0) break;
            const std::size_t taken = enter(first, prepared, &error);
            for (std::size_t i = 0; i < taken; ++i) {
                Request& r = *requests[accepted + i];
                r.state = Request::State::kInFlight;
                r.used_fixed_buffer = uses_fixed_buffer(r);
                r.used_fixed_file = uses_fixed_file(r);
            }
            in_flight_ += taken;
            accepted += taken;
            if (taken < prepared) break;  // the rest stay the caller's, untouched
        }
        if (accepted > 0) return accepted;  // a persisting error meets the next submit
        if (error == 0 || error == EAGAIN || error == EBUSY) {
            // Room comes back as requests complete; with none in flight, waiting cannot help.
            if (in_flight_ > 0) return Status::busy("io_uring_submit: none taken; reap first");
            if (error == 0) error = EAGAIN;
        }
        return submit_error("io_uring_submit", error);
    }

    Result<std::size_t> reap(std::size_t min_count,
                             std::chrono::microseconds timeout) noexcept override {
        std::size_t completed = 0;
        const std::size_t want = std::min(min_count, in_flight_);
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        bool entered = false;
        woken_ = false;
        for (int pass = 0;; ++pass) {
            ZINF_ASSERT_LT(pass, 1 << 30);  // each pass completes something or meets the deadline
            if (retry_count_ > 0) prepare_retries();
            if (!entered && want == 0 && in_flight_ > 0) {
                // Completions become visible only when the task enters the kernel
                // (COOP/DEFER_TASKRUN); one non-blocking enter also flushes prepared SQEs.
                const int rc = io_uring_sq_ready(&ring_) > 0
                                   ? io_uring_submit_and_get_events(&ring_)
                                   : io_uring_get_events(&ring_);
                if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
                    return Status::from_errno(-rc, "io_uring_enter");
                }
                entered = true;
            }
            completed += drain();
            if (retry_count_ > 0) continue;  // resubmit before deciding whether to wait
            if (completed >= want || in_flight_ == 0 || woken_) break;
            const auto left = deadline - std::chrono::steady_clock::now();
            if (left <= std::chrono::nanoseconds(0)) break;
            const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
            __kernel_timespec ts{};
            ts.tv_sec = ns / 1000000000;
            ts.tv_nsec = ns % 1000000000;
            io_uring_cqe* cqe = nullptr;
            const int rc = io_uring_submit_and_wait_timeout(
                &ring_, &cqe, static_cast<unsigned>(want - completed), &ts, nullptr);
            if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
                return Status::from_errno(-rc, "io_uring_submit_and_wait_timeout");
            }
            entered = true;
        }
        if (io_uring_sq_ready(&ring_) > 0) (void)submit_ring();
        return completed;
    }

    std::size_t in_flight_count() const noexcept override { return in_flight_; }
    std::size_t queue_depth() const noexcept override { return queue_depth_; }

private:
    explicit UringBackend(const BackendOptions& options)
        : queue_depth_(options.queue_depth),
          single_submit_(options.single_submit),
          seams_(options.seams),
          cqes_(2 * (options.queue_depth + 1)),
          retries_(options.queue_depth),
          file_registered_(kFixedFileSlots, false) {}

    // A request names a registered buffer or file slot; it is used only if this ring has it.
    bool uses_fixed_buffer(const Request& r) const noexcept {
        return r.buffer_index >= 0 && r.buffer_index < registered_buffers_;
    }
    bool uses_fixed_file(const Request& r) const noexcept {
        return r.fixed_file_index >= 0 &&
               file_registered_[static_cast<std::size_t>(r.fixed_file_index)];
    }

    // Fills `sqe` for the rest of `r`; changes nothing in `r` (it may yet be handed back).
    void prepare(io_uring_sqe* sqe, Request& r) noexcept {
        const unsigned left = r.length_bytes - r.done_bytes;
        const std::uint64_t offset = r.offset_bytes + r.done_bytes;
        std::byte* buffer = r.buffer + r.done_bytes;
        const bool fixed_file = uses_fixed_file(r);
        const int fd = fixed_file ? r.fixed_file_index : r.fd;
        const bool fixed_buffer = uses_fixed_buffer(r);
        if (r.op == OpKind::kRead) {
            if (fixed_buffer) {
                io_uring_prep_read_fixed(sqe, fd, buffer, left, offset, r.buffer_index);
            } else {
                io_uring_prep_read(sqe, fd, buffer, left, offset);
            }
        } else {
            if (fixed_buffer) {
                io_uring_prep_write_fixed(sqe, fd, buffer, left, offset, r.buffer_index);
            } else {
                io_uring_prep_write(sqe, fd, buffer, left, offset);
            }
        }
        if (fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
        io_uring_sqe_set_data(sqe, &r);
    }

    // Hands the `count` SQEs prepared at ring positions [first, first + count), and whatever was
    // queued before them, to the kernel. Returns how many of the `count` the kernel took; the rest
    // are taken back out of the ring so that no later enter submits them behind the caller's back,
    // and *error is the call's errno (0 when it merely took fewer).
    std::size_t enter(unsigned first, std::size_t count, int* error) noexcept {
        SubmitCall call{count, 0};
        if (seams_.submit != nullptr) {
            call = seams_.submit(seams_.context, count);
            call.limit = std::min(call.limit, count);
        }
        int rc = 0;
        if (call.limit == count) {
            rc = submit_with_retries();
        } else {
            // The seam: the kernel gets the first `limit`; the rest then sit in the ring as they
            // would after a failed io_uring_enter (published, not consumed).
            withdraw_sqes(first + static_cast<unsigned>(call.limit));
            if (call.limit > 0) rc = submit_with_retries();
            if (!sqpoll()) publish_sqes(first + static_cast<unsigned>(count));
        }
        if (call.error != 0) rc = -call.error;
        *error = rc < 0 ? -rc : 0;
        if (sqpoll()) {
            // The SQ thread consumes what is published whenever it runs, so what was published is
            // its; it cannot be taken back. What the seam held back never was.
            return call.limit;
        }
        // Without SQPOLL the kernel reads the SQ ring only inside io_uring_enter, on this thread:
        // its head says exactly what it consumed, whatever the call returned.
        const auto consumed = static_cast<int>(io_uring_smp_load_acquire(ring_.sq.khead) - first);
        const std::size_t taken =
            consumed <= 0 ? 0 : std::min(static_cast<std::size_t>(consumed), count);
        if (taken < count) withdraw_sqes(first + static_cast<unsigned>(taken));
        return taken;
    }

    bool sqpoll() const noexcept { return (ring_.flags & IORING_SETUP_SQPOLL) != 0; }

    int submit_with_retries() noexcept {
        int rc = io_uring_submit(&ring_);
        for (int i = 0; rc == -EINTR && i < kMaxRetries; ++i) rc = io_uring_submit(&ring_);
        return rc;
    }

    // liburing has no call that takes SQEs back out of the ring, so these two move the SQ
    // positions that its own inline functions use (io_uring_get_sqe, the flush in
    // io_uring_submit): sqe_tail is the next SQE to hand out, sqe_head what has been published
    // to the kernel in *ktail; the kernel owns *khead. Positions count freely and wrap.
    //
    // Takes back every SQE from `position` on, published or not. Without SQPOLL only: the kernel
    // must not be reading the ring meanwhile.
    void withdraw_sqes(unsigned position) noexcept {
        io_uring_sq& sq = ring_.sq;
        const unsigned head = io_uring_smp_load_acquire(sq.khead);
        ZINF_ASSERT_LE(position - head, sq.sqe_tail - head);  // never before what was consumed
        sq.sqe_tail = position;
        if (static_cast<int>(sq.sqe_head - position) > 0) {
            ZINF_ASSERT(!sqpoll());
            sq.sqe_head = position;
            IO_URING_WRITE_ONCE(*sq.ktail, position);
        }
    }
    // Publishes the SQEs up to `position` (prepared earlier and still intact in the ring).
    void publish_sqes(unsigned position) noexcept {
        io_uring_sq& sq = ring_.sq;
        sq.sqe_tail = position;
        sq.sqe_head = position;
        io_uring_smp_store_release(sq.ktail, position);
    }

    // Returns the kernel's answer; prepared SQEs it did not take stay in the SQ ring and go with
    // the next enter, so -EAGAIN/-EBUSY/-EINTR are not errors here. For the backend's own SQEs
    // (resubmissions of requests in flight, the wake-up read), which it never takes back.
    int submit_ring() noexcept {
        const int rc = io_uring_submit(&ring_);
        if (rc == -EAGAIN || rc == -EBUSY || rc == -EINTR) return 0;
        return rc;
    }

    void prepare_retries() noexcept {
        std::size_t i = 0;
        for (; i < retry_count_; ++i) {
            io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
            if (sqe == nullptr) {
                (void)submit_ring();
                sqe = io_uring_get_sqe(&ring_);
                if (sqe == nullptr) break;
            }
            prepare(sqe, *retries_[i]);
        }
        std::copy(retries_.begin() + static_cast<std::ptrdiff_t>(i),
                  retries_.begin() + static_cast<std::ptrdiff_t>(retry_count_), retries_.begin());
        retry_count_ -= i;
        (void)submit_ring();
    }

    std::size_t finish(Request& r, const Status& status) noexcept {
        --in_flight_;
        complete(r, status);
        return 1;
    }

    // Reaps what the CQ holds, in batches; returns how many requests finished.
    std::size_t drain() noexcept {
        std::size_t finished = 0;
        for (;;) {
            const unsigned n =
                io_uring_peek_batch_cqe(&ring_, cqes_.data(), static_cast<unsigned>(cqes_.size()));
            if (n == 0) break;
            for (unsigned i = 0; i < n; ++i) finished += on_cqe(*cqes_[i]);
            io_uring_cq_advance(&ring_, n);
        }
        if (!wake_armed_) arm_wake();
        return finished;
    }

    void arm_wake() noexcept {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (sqe == nullptr) {
            (void)submit_ring();
            sqe = io_uring_get_sqe(&ring_);
        }
        if (sqe == nullptr) return;  // tried again at the next drain
        io_uring_prep_read(sqe, wake_fd_, &wake_value_, sizeof wake_value_, 0);
        io_uring_sqe_set_data(sqe, &wake_value_);
        wake_armed_ = true;
    }

    std::size_t on_cqe(const io_uring_cqe& cqe) noexcept {
        if (io_uring_cqe_get_data(&cqe) == &wake_value_) {
            wake_armed_ = false;
            woken_ = true;
            return 0;
        }
        auto* r = static_cast<Request*>(io_uring_cqe_get_data(&cqe));
        ZINF_ASSERT(r != nullptr);
        ZINF_ASSERT(r->state == Request::State::kInFlight);
        const Verdict verdict = classify_completion(*r, seam_result(seams_, *r, cqe.res));
        switch (apply_verdict(*r, verdict)) {
            case Next::kComplete:
                return finish(*r, Status::ok());
            case Next::kEndOfFile:
                return finish(*r, end_of_file_error());
            case Next::kError:
                return finish(*r, piece_error(verdict.error));
            case Next::kResubmit:
            case Next::kRetry:
                break;
        }
        ZINF_ASSERT_LT(retry_count_, retries_.size());
        retries_[retry_count_++] = r;
        return 0;
    }

    io_uring ring_{};
    bool ring_ready_ = false;
    bool defer_taskrun_ = false;
    unsigned features_ = 0;
    const std::size_t queue_depth_;
    const bool single_submit_;
    const Seams seams_;
    bool files_supported_ = false;
    int registered_buffers_ = 0;
    std::size_t in_flight_ = 0;
    std::vector<io_uring_cqe*> cqes_;
    std::vector<Request*> retries_;  // to be resubmitted (short transfer, EAGAIN)
    std::size_t retry_count_ = 0;
    std::vector<bool> file_registered_;
    int wake_fd_ = -1;
    std::uint64_t wake_value_ = 0;  // the wake-up read's target
    bool wake_armed_ = false;
    bool woken_ = false;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_uring_backend(const BackendOptions& options) {
    if (options.queue_depth == 0)
        return Status::invalid_argument("io_uring: queue_depth must be >= 1");
    return UringBackend::create(options);
}

}  // namespace zinf::io::detail
