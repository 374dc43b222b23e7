// The posix backend: pread/pwrite on a small pool of helper threads. Portable and always
// available, so `auto` ends here; also the reference the other backends are compared with.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "io/detail/backends.h"
#include "io/detail/completion.h"
#include "src/base/log.h"

namespace zinf::io::detail {
namespace {

// A helper finishes with one of these; kEndOfFile is not an errno.
constexpr int kEndOfFile = -1;
constexpr std::size_t kMaxHelperThreads = 8;

class PosixBackend final : public Backend {
public:
    explicit PosixBackend(const BackendOptions& options)
        : queue_depth_(options.queue_depth),
          seams_(options.seams),
          pending_(options.queue_depth),
          done_(options.queue_depth),
          done_errors_(options.queue_depth),
          reaped_(options.queue_depth),
          reaped_errors_(options.queue_depth) {
        ZINF_ASSERT_GT(queue_depth_, 0u);
        const std::size_t helpers = std::min(queue_depth_, kMaxHelperThreads);
        helpers_.reserve(helpers);
        for (std::size_t i = 0; i < helpers; ++i) helpers_.emplace_back([this] { helper_loop(); });
    }

    ~PosixBackend() override {
        ZINF_ASSERT_EQ(in_flight_, 0u);
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        work_cv_.notify_all();
        for (auto& t : helpers_) t.join();
    }

    std::string_view name() const noexcept override { return "posix"; }

    Status register_buffers(std::span<const std::span<std::byte>> regions) override {
        for (const auto& r : regions) {
            if (r.size() > kMaxRegisteredBufferBytes) {
                return Status::invalid_argument("register_buffers: region larger than 1 GiB");
            }
        }
        return Status::ok();
    }

    Result<std::size_t> submit(std::span<Request* const> requests) noexcept override {
        std::size_t accepted = 0;
        {
            std::lock_guard lock(mutex_);
            while (accepted < requests.size() && in_flight_ < queue_depth_) {
                Request* r = requests[accepted];
                check_submitted(*r);
                r->state = Request::State::kInFlight;
                pending_[(pending_head_ + pending_count_) % queue_depth_] = r;
                ++pending_count_;
                ++in_flight_;
                ++accepted;
            }
        }
        if (accepted == 0) return Status::busy("posix backend queue full");
        if (accepted == 1) {
            work_cv_.notify_one();
        } else {
            work_cv_.notify_all();
        }
        return accepted;
    }

    Result<std::size_t> reap(std::size_t min_count,
                             std::chrono::microseconds timeout) noexcept override {
        std::size_t n = 0;
        {
            std::unique_lock lock(mutex_);
            const std::size_t want = std::min(min_count, in_flight_);
            if (done_count_ < want) {
                done_cv_.wait_for(lock, timeout, [&] { return done_count_ >= want || woken_; });
            }
            woken_ = false;
            while (done_count_ > 0) {
                reaped_[n] = done_[done_head_];
                reaped_errors_[n] = done_errors_[done_head_];
                done_head_ = (done_head_ + 1) % queue_depth_;
                --done_count_;
                ++n;
            }
            in_flight_ -= n;
        }
        // Callbacks run without the lock: they may take the engine's locks.
        for (std::size_t i = 0; i < n; ++i) {
            const int err = reaped_errors_[i];
            if (err == 0) {
                complete(*reaped_[i], Status::ok());
            } else if (err == kEndOfFile) {
                complete(*reaped_[i], end_of_file_error());
            } else {
                complete(*reaped_[i], piece_error(err));
            }
        }
        return n;
    }

    std::size_t in_flight_count() const noexcept override {
        std::lock_guard lock(mutex_);
        return in_flight_;
    }
    std::size_t queue_depth() const noexcept override { return queue_depth_; }

    void wake() noexcept override {
        {
            std::lock_guard lock(mutex_);
            woken_ = true;
        }
        done_cv_.notify_all();
    }

private:
    // Transfers the whole request, resubmitting short transfers and retrying EINTR/EAGAIN up to
    // kMaxRetries (io/detail/completion.h decides); returns 0, an errno or kEndOfFile. Runs on a
    // helper thread, which owns the request meanwhile.
    static int transfer(Request& r, const Seams& seams) noexcept {
        // Bounded: each pass moves at least one byte or uses up one of kMaxRetries retries.
        for (std::uint64_t pass = 0;; ++pass) {
            ZINF_ASSERT_LE(pass, std::uint64_t{r.length_bytes} + kMaxRetries);
            const std::size_t left = r.length_bytes - r.done_bytes;
            const auto offset = static_cast<off_t>(r.offset_bytes + r.done_bytes);
            const ssize_t got = r.op == OpKind::kRead
                                    ? ::pread(r.fd, r.buffer + r.done_bytes, left, offset)
                                    : ::pwrite(r.fd, r.buffer + r.done_bytes, left, offset);
            const long raw = got < 0 ? -static_cast<long>(errno) : static_cast<long>(got);
            const Verdict verdict = classify_completion(r, seam_result(seams, r, raw));
            switch (apply_verdict(r, verdict)) {
                case Next::kComplete:
                    return 0;
                case Next::kEndOfFile:
                    return kEndOfFile;
                case Next::kError:
                    return verdict.error;
                case Next::kResubmit:
                case Next::kRetry:
                    break;
            }
        }
    }

    void helper_loop() {
        std::unique_lock lock(mutex_);
        for (;;) {
            work_cv_.wait(lock, [&] { return stopping_ || pending_count_ > 0; });
            if (pending_count_ == 0) return;  // stopping, nothing left
            Request* r = pending_[pending_head_];
            pending_head_ = (pending_head_ + 1) % queue_depth_;
            --pending_count_;
            lock.unlock();
            const int err = transfer(*r, seams_);
            lock.lock();
            const std::size_t slot = (done_head_ + done_count_) % queue_depth_;
            done_[slot] = r;
            done_errors_[slot] = err;
            ++done_count_;
            done_cv_.notify_one();
        }
    }

    const std::size_t queue_depth_;
    const Seams seams_;
    mutable std::mutex mutex_;
    std::condition_variable work_cv_;
    std::condition_variable done_cv_;
    bool stopping_ = false;
    bool woken_ = false;
    std::size_t in_flight_ = 0;  // submitted and not yet reaped
    // Rings of queue_depth entries, sized once (no allocation per I/O).
    std::vector<Request*> pending_;
    std::size_t pending_head_ = 0;
    std::size_t pending_count_ = 0;
    std::vector<Request*> done_;
    std::vector<int> done_errors_;
    std::size_t done_head_ = 0;
    std::size_t done_count_ = 0;
    // Owner-thread scratch for one reap.
    std::vector<Request*> reaped_;
    std::vector<int> reaped_errors_;
    std::vector<std::thread> helpers_;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_posix_backend(const BackendOptions& options) {
    if (options.queue_depth == 0)
        return Status::invalid_argument("posix: queue_depth must be >= 1");
    return std::unique_ptr<Backend>(std::make_unique<PosixBackend>(options));
}

}  // namespace zinf::io::detail
