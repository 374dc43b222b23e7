// The libaio backend: io_submit / io_getevents on one kernel AIO context per worker. True
// asynchrony needs O_DIRECT; buffered pieces (an odd tail) complete inside io_submit.
#include <libaio.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <vector>

#include "io/detail/backends.h"
#include "io/detail/completion.h"
#include "src/base/log.h"

namespace zinf::io::detail {
namespace {

class AioBackend final : public Backend {
public:
    static Result<std::unique_ptr<Backend>> create(const BackendOptions& options) {
        io_context_t context{};
        // One event more than the queue depth: the poll that waits on the wake-up eventfd.
        const int rc = io_setup(static_cast<int>(options.queue_depth) + 1, &context);
        if (rc < 0) {
            const int err = -rc;
            std::string why =
                str_cat("libaio: io_setup(", options.queue_depth, "): ", std::strerror(err));
            if (err == EAGAIN) why += " (fs.aio-max-nr exhausted)";
            if (err == ENOSYS) why += " (kernel without AIO)";
            if (err == EPERM) why += " (likely seccomp)";
            return Status::not_supported(std::move(why), err);
        }
        auto backend =
            std::unique_ptr<AioBackend>(new AioBackend(context, options));  // private ctor
        backend->wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        // Kernel AIO poll (4.18+) lets wake() end an io_getevents early; without it reap simply
        // waits for its timeout.
        if (backend->wake_fd_ >= 0 && !backend->arm_wake()) {
            ::close(backend->wake_fd_);
            backend->wake_fd_ = -1;
        }
        return std::unique_ptr<Backend>(std::move(backend));
    }

    ~AioBackend() override {
        ZINF_ASSERT_EQ(in_flight_, 0u);
        io_destroy(context_);  // cancels the wake-up poll
        if (wake_fd_ >= 0) ::close(wake_fd_);
    }

    void wake() noexcept override {
        if (wake_fd_ < 0) return;
        const std::uint64_t one = 1;
        (void)!::write(wake_fd_, &one, sizeof one);
    }

    std::string_view name() const noexcept override { return "libaio"; }

    Status register_buffers(std::span<const std::span<std::byte>> regions) override {
        for (const auto& r : regions) {
            if (r.size() > kMaxRegisteredBufferBytes) {
                return Status::invalid_argument("register_buffers: region larger than 1 GiB");
            }
        }
        return Status::ok();
    }

    Result<std::size_t> submit(std::span<Request* const> requests) noexcept override {
        const std::size_t room = std::min(requests.size(), free_count_);
        if (room == 0) return Status::busy("libaio queue full");
        std::size_t accepted = 0;
        int error = 0;
        while (accepted < room) {
            // single_submit: one io_submit per request (a tuning knob, not a correctness one).
            const std::size_t want = single_submit_ ? 1 : room - accepted;
            // The next `want` free slots, from the top of the stack; popped only once taken.
            for (std::size_t i = 0; i < want; ++i) {
                Request& r = *requests[accepted + i];
                check_submitted(r);
                Slot& slot = slots_[free_[free_count_ - 1 - i]];
                ZINF_ASSERT(slot.request == nullptr);
                slot.request = &r;
                prepare(slot);
                offered_[i] = &slot.cb;
            }
            const std::size_t taken = hand_over(want, &error);
            for (std::size_t i = 0; i < want; ++i) {
                Slot& slot = *static_cast<Slot*>(offered_[i]->data);
                if (i < taken) {
                    slot.request->state = Request::State::kInFlight;
                } else {
                    slot.request = nullptr;  // the request stays the caller's, untouched
                }
            }
            free_count_ -= taken;
            in_flight_ += taken;
            accepted += taken;
            if (taken < want) break;
        }
        if (accepted > 0) return accepted;  // a persisting error meets the next submit
        if (error == 0 || error == EAGAIN) {
            // Room comes back as requests complete; with none in flight, waiting cannot help.
            if (in_flight_ > 0) return Status::busy("io_submit: none taken; reap first");
            if (error == 0) error = EAGAIN;
        }
        return submit_error("io_submit", error);
    }

    Result<std::size_t> reap(std::size_t min_count,
                             std::chrono::microseconds timeout) noexcept override {
        std::size_t completed = 0;
        woken_ = false;
        completed += deliver_failed();
        flush_staged();
        const std::size_t want = std::min(min_count, in_flight_);
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        // Bounded: each pass either completes something or ends at the deadline.
        for (int pass = 0;; ++pass) {
            ZINF_ASSERT_LT(pass, 1 << 30);
            const std::size_t in_kernel = in_flight_ - failed_count_ - staged_count_;
            if (in_kernel == 0) {
                // Everything left was refused with EAGAIN: back off briefly, then resubmit.
                if (staged_count_ == 0 || completed >= want) break;
                if (std::chrono::steady_clock::now() >= deadline) break;
                ::usleep(100);
                flush_staged();
                continue;
            }
            const long min_events =
                completed >= want ? 0 : static_cast<long>(std::min(want - completed, in_kernel));
            timespec ts{};
            const auto left = deadline - std::chrono::steady_clock::now();
            if (min_events > 0 && left > std::chrono::nanoseconds(0)) {
                const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
                ts.tv_sec = static_cast<time_t>(ns / 1000000000);
                ts.tv_nsec = static_cast<long>(ns % 1000000000);
            }
            const int got = io_getevents(context_, min_events, static_cast<long>(events_.size()),
                                         events_.data(), &ts);
            if (got < 0) {
                if (got == -EINTR) continue;
                return Status::from_errno(-got, "io_getevents");
            }
            for (int i = 0; i < got; ++i) completed += on_event(events_[i]);
            completed += deliver_failed();
            flush_staged();
            if (completed >= want || woken_) break;
            if (std::chrono::steady_clock::now() >= deadline) break;
        }
        return completed;
    }

    std::size_t in_flight_count() const noexcept override { return in_flight_; }
    std::size_t queue_depth() const noexcept override { return queue_depth_; }

private:
    struct Slot {
        iocb cb{};
        Request* request = nullptr;
        int error = 0;  // a submission error, delivered at the next reap
    };

    AioBackend(io_context_t context, const BackendOptions& options)
        : context_(context),
          queue_depth_(options.queue_depth),
          single_submit_(options.single_submit),
          slots_(options.queue_depth),
          free_(options.queue_depth),
          free_count_(options.queue_depth),
          seams_(options.seams),
          offered_(options.queue_depth),
          staged_(options.queue_depth),
          failed_(options.queue_depth),
          events_(options.queue_depth + 1) {
        for (std::size_t i = 0; i < queue_depth_; ++i) free_[i] = static_cast<std::uint32_t>(i);
    }

    void prepare(Slot& slot) noexcept {
        Request& r = *slot.request;
        const std::size_t left = r.length_bytes - r.done_bytes;
        const auto offset =
            static_cast<long long>(r.offset_bytes) + static_cast<long long>(r.done_bytes);
        if (r.op == OpKind::kRead) {
            io_prep_pread(&slot.cb, r.fd, r.buffer + r.done_bytes, left, offset);
        } else {
            io_prep_pwrite(&slot.cb, r.fd, r.buffer + r.done_bytes, left, offset);
        }
        slot.cb.data = &slot;
    }

    // Offers offered_[0, count) to the kernel in one io_submit; returns how many it took (a
    // prefix). io_submit takes iocbs in order and stops at the first it refuses: it returns the
    // count before it, or, when that is the first, the error. So *error is the errno when none
    // was taken, and 0 when some were (the refused one meets its error again when offered next).
    std::size_t hand_over(std::size_t count, int* error) noexcept {
        SubmitCall call{count, 0};
        if (seams_.submit != nullptr) {
            call = seams_.submit(seams_.context, count);
            call.limit = std::min(call.limit, count);
        }
        int rc = 0;
        if (call.limit > 0) {
            rc = io_submit(context_, static_cast<long>(call.limit), offered_.data());
            for (int i = 0; rc == -EINTR && i < kMaxRetries; ++i) {
                rc = io_submit(context_, static_cast<long>(call.limit), offered_.data());
            }
        }
        const std::size_t taken = rc > 0 ? static_cast<std::size_t>(rc) : 0;
        ZINF_ASSERT_LE(taken, call.limit);
        *error = call.error != 0 ? call.error : (rc < 0 ? -rc : 0);
        return taken;
    }

    // Submits the staged iocbs (resubmissions of requests in flight); on EAGAIN they stay staged
    // for the next call; on any other error the first iocb fails (its error is delivered at
    // reap) and the rest go on.
    void flush_staged() noexcept {
        std::size_t done = 0;
        for (int guard = 0; done < staged_count_; ++guard) {
            ZINF_ASSERT_LT(guard, 1 << 20);
            const long n = single_submit_ ? 1 : static_cast<long>(staged_count_ - done);
            const int rc = io_submit(context_, n, staged_.data() + done);
            if (rc > 0) {
                done += static_cast<std::size_t>(rc);
                continue;
            }
            if (rc == -EAGAIN || rc == -EINTR || rc == 0) break;  // retry at the next reap
            Slot& slot = *static_cast<Slot*>(staged_[done]->data);
            slot.error = -rc;
            failed_[failed_count_++] = &slot;
            ++done;
        }
        std::copy(staged_.begin() + static_cast<std::ptrdiff_t>(done),
                  staged_.begin() + static_cast<std::ptrdiff_t>(staged_count_), staged_.begin());
        staged_count_ -= done;
    }

    std::size_t finish(Slot& slot, const Status& status) noexcept {
        Request& r = *slot.request;
        slot.request = nullptr;
        slot.error = 0;
        free_[free_count_++] = static_cast<std::uint32_t>(&slot - slots_.data());
        --in_flight_;
        complete(r, status);
        return 1;
    }

    std::size_t deliver_failed() noexcept {
        std::size_t n = 0;
        while (failed_count_ > 0) {
            Slot& slot = *failed_[--failed_count_];
            const int err = slot.error;
            n += finish(slot, piece_error(err));
        }
        return n;
    }

    bool arm_wake() noexcept {
        io_prep_poll(&wake_cb_, wake_fd_, POLLIN);
        wake_cb_.data = &wake_cb_;
        iocb* p = &wake_cb_;
        for (int i = 0; i < kMaxRetries; ++i) {
            const int rc = io_submit(context_, 1, &p);
            if (rc == 1) return true;
            if (rc != -EAGAIN && rc != -EINTR) return false;
        }
        return false;
    }

    // Returns 1 when the event finished its request, 0 when the rest was resubmitted.
    std::size_t on_event(const io_event& event) noexcept {
        if (event.data == &wake_cb_) {
            std::uint64_t value = 0;
            (void)!::read(wake_fd_, &value, sizeof value);  // non-blocking: clears the counter
            woken_ = true;
            if (!arm_wake()) {
                ::close(wake_fd_);
                wake_fd_ = -1;
            }
            return 0;
        }
        Slot& slot = *static_cast<Slot*>(event.data);
        Request& r = *slot.request;
        ZINF_ASSERT(r.state == Request::State::kInFlight);
        const Verdict verdict =
            classify_completion(r, seam_result(seams_, r, static_cast<long>(event.res)));
        switch (apply_verdict(r, verdict)) {
            case Next::kComplete:
                return finish(slot, Status::ok());
            case Next::kEndOfFile:
                return finish(slot, end_of_file_error());
            case Next::kError:
                return finish(slot, piece_error(verdict.error));
            case Next::kResubmit:
            case Next::kRetry:
                break;
        }
        prepare(slot);
        ZINF_ASSERT_LT(staged_count_, staged_.size());
        staged_[staged_count_++] = &slot.cb;
        return 0;
    }

    io_context_t context_;
    const std::size_t queue_depth_;
    const bool single_submit_;
    std::vector<Slot> slots_;
    std::vector<std::uint32_t> free_;
    std::size_t free_count_;
    const Seams seams_;
    std::vector<iocb*> offered_;  // scratch of submit: the iocbs of one io_submit
    std::vector<iocb*> staged_;   // resubmissions, prepared, not yet accepted by io_submit
    std::size_t staged_count_ = 0;
    std::vector<Slot*> failed_;  // refused by io_submit
    std::size_t failed_count_ = 0;
    std::vector<io_event> events_;
    std::size_t in_flight_ = 0;
    iocb wake_cb_{};
    int wake_fd_ = -1;
    bool woken_ = false;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_aio_backend(const BackendOptions& options) {
    if (options.queue_depth == 0)
        return Status::invalid_argument("libaio: queue_depth must be >= 1");
    return AioBackend::create(options);
}

}  // namespace zinf::io::detail
