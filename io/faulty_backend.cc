// FaultyBackend: injected faults travel the same paths as real ones (callbacks from reap), so the
// engine's error handling is what gets tested.
#include "io/faulty_backend.h"

#include <algorithm>
#include <thread>

#include "io/detail/backends.h"
#include "src/base/aligned.h"
#include "src/base/log.h"

namespace zinf::io {

// Short transfers stay multiples of this, as a real O_DIRECT short transfer does, so that the
// resubmitted remainder is still aligned.
constexpr std::uint32_t kShortTransferGrainBytes = 4096;

FaultyBackend::FaultyBackend(Backend& inner, const FaultPlan& plan, Shared& shared,
                             std::uint64_t stream)
    : inner_(inner),
      plan_(plan),
      shared_(shared),
      slots_(inner.queue_depth()),
      forward_(inner.queue_depth()),
      rng_(plan.seed * 0xD1B54A32D192ED03ULL + stream) {
    ZINF_ASSERT_LE(plan.latency_us_min, plan.latency_us_max);
    for (Slot& s : slots_) s.owner = this;
}

FaultyBackend::~FaultyBackend() {
    ZINF_ASSERT_EQ(in_use_, 0u);
}

bool FaultyBackend::chance(double probability) noexcept {
    if (probability <= 0) return false;
    return std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < probability;
}

std::chrono::microseconds FaultyBackend::latency() noexcept {
    const std::uint64_t span = plan_.latency_us_max - plan_.latency_us_min;
    return std::chrono::microseconds(plan_.latency_us_min + (span == 0 ? 0 : rng_() % (span + 1)));
}

Result<std::size_t> FaultyBackend::submit(std::span<Request* const> requests) noexcept {
    std::size_t accepted = 0;
    std::size_t forwarded = 0;
    const auto now = std::chrono::steady_clock::now();
    for (Slot& slot : slots_) {
        if (accepted == requests.size()) break;
        if (slot.state != SlotState::kFree) continue;
        Request* r = requests[accepted++];
        detail::check_submitted(*r);
        ++in_use_;
        slot.request = r;
        slot.callback = r->callback;
        slot.user = r->user;
        slot.real_length_bytes = r->length_bytes;
        const std::uint64_t n = shared_.pieces_submitted.fetch_add(1) + 1;
        int inject = 0;
        // The first and last branches inject the same errno; they stay apart because the order
        // of the tests is the random stream's (chance() draws only when the others did not hit).
        if (plan_.fail_nth_op != 0 && n == plan_.fail_nth_op) {  // NOLINT(bugprone-branch-clone)
            inject = plan_.errno_to_inject;
        } else if (r->op == OpKind::kWrite && plan_.enospc_after_bytes != 0 &&
                   shared_.bytes_written.fetch_add(r->length_bytes - r->done_bytes) +
                           (r->length_bytes - r->done_bytes) >
                       plan_.enospc_after_bytes) {
            inject = ENOSPC;
        } else if (chance(r->op == OpKind::kRead ? plan_.read_error_probability
                                                 : plan_.write_error_probability)) {
            inject = plan_.errno_to_inject;
        }
        if (inject != 0) {
            shared_.faults_injected.fetch_add(1, std::memory_order_relaxed);
            r->state = Request::State::kInFlight;
            slot.state = SlotState::kFailed;
            slot.error = inject;
            slot.due = now + latency();
            continue;
        }
        const std::uint32_t left = r->length_bytes - r->done_bytes;
        if (left > kShortTransferGrainBytes && chance(plan_.short_transfer_probability)) {
            const std::uint32_t cut =
                static_cast<std::uint32_t>(align_down(left / 2, kShortTransferGrainBytes));
            if (cut > 0) {
                r->length_bytes = r->done_bytes + cut;
                shared_.faults_injected.fetch_add(1, std::memory_order_relaxed);
            }
        }
        r->callback = &FaultyBackend::on_inner_complete;
        r->user = &slot;
        slot.state = SlotState::kInner;
        forward_[forwarded++] = r;
    }
    if (accepted == 0) return Status::busy("faulty backend queue full");
    forward(forwarded, now);
    return accepted;
}

void FaultyBackend::forward(std::size_t count, std::chrono::steady_clock::time_point now) noexcept {
    if (count == 0) return;
    auto taken = inner_.submit(std::span<Request* const>(forward_.data(), count));
    const std::size_t n = taken.has_value() ? *taken : 0;
    ZINF_ASSERT_LE(n, count);
    // Whatever the inner backend did not take it handed back untouched; it waits in our slots
    // and goes at the next reap.
    for (std::size_t i = n; i < count; ++i) {
        ZINF_ASSERT(forward_[i]->state == Request::State::kIdle);
        static_cast<Slot*>(forward_[i]->user)->state = SlotState::kRetry;
        forward_[i]->state = Request::State::kInFlight;
    }
    if (!taken.has_value() && taken.error().code() != StatusCode::kBusy) {
        // Refused, not busy: the first piece fails with the refusal (as the engine does with a
        // batch refused outright), so that a lasting refusal cannot hold a piece forever.
        Slot& slot = *static_cast<Slot*>(forward_[0]->user);
        slot.state = SlotState::kDelayed;
        slot.status = taken.error();
        slot.due = now;
    }
}

void FaultyBackend::on_inner_complete(Request& request, const Status& status) {
    Slot& slot = *static_cast<Slot*>(request.user);
    FaultyBackend& self = *slot.owner;
    ZINF_ASSERT(slot.state == SlotState::kInner);
    ZINF_ASSERT(slot.request == &request);
    if (status.is_ok() && request.length_bytes < slot.real_length_bytes) {
        // The simulated short transfer: put the real length back and send the rest, as a
        // backend would after a short read or write from the kernel.
        request.length_bytes = slot.real_length_bytes;
        ++request.short_transfers;
        request.state = Request::State::kInFlight;
        slot.state = SlotState::kRetry;
        return;
    }
    request.length_bytes = slot.real_length_bytes;
    if (status.is_ok() && request.op == OpKind::kRead &&
        self.chance(self.plan_.corrupt_probability)) {
        const std::size_t at = self.rng_() % request.length_bytes;
        request.buffer[at] ^= std::byte{0x5a};
        self.shared_.faults_injected.fetch_add(1, std::memory_order_relaxed);
    }
    if (self.plan_.latency_us_max > 0) {
        request.state = Request::State::kInFlight;
        slot.state = SlotState::kDelayed;
        slot.status = status;
        slot.due = std::chrono::steady_clock::now() + self.latency();
        return;
    }
    self.deliver(slot, status);
}

void FaultyBackend::deliver(Slot& slot, const Status& status) noexcept {
    Request& r = *slot.request;
    r.callback = slot.callback;
    r.user = slot.user;
    r.length_bytes = slot.real_length_bytes;
    if (r.state == Request::State::kIdle) r.state = Request::State::kInFlight;
    slot.state = SlotState::kFree;
    slot.request = nullptr;
    --in_use_;
    ++delivered_;
    detail::complete(r, status);
}

std::size_t FaultyBackend::deliver_ready(std::chrono::steady_clock::time_point now) noexcept {
    std::size_t n = 0;
    for (Slot& slot : slots_) {
        if (slot.state == SlotState::kFailed && slot.due <= now) {
            deliver(slot, detail::piece_error(slot.error).mark_injected());
            ++n;
        } else if (slot.state == SlotState::kDelayed && slot.due <= now) {
            Status status = std::move(slot.status);
            slot.status = Status();
            deliver(slot, status);
            ++n;
        }
    }
    return n;
}

void FaultyBackend::flush_retries() noexcept {
    std::size_t n = 0;
    for (Slot& slot : slots_) {
        if (slot.state != SlotState::kRetry) continue;
        slot.request->state = Request::State::kIdle;
        slot.state = SlotState::kInner;
        forward_[n++] = slot.request;
    }
    forward(n, std::chrono::steady_clock::now());
}

Result<std::size_t> FaultyBackend::reap(std::size_t min_count,
                                        std::chrono::microseconds timeout) noexcept {
    delivered_ = 0;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (int pass = 0;; ++pass) {
        ZINF_ASSERT_LT(pass, 1 << 30);
        auto now = std::chrono::steady_clock::now();
        deliver_ready(now);
        flush_retries();
        if (delivered_ >= min_count || in_use_ == 0 || now >= deadline) break;
        auto wake = deadline;
        for (const Slot& slot : slots_) {
            if (slot.state == SlotState::kFailed || slot.state == SlotState::kDelayed) {
                wake = std::min(wake, slot.due);
            }
        }
        if (inner_.in_flight_count() > 0) {
            const auto wait = std::chrono::duration_cast<std::chrono::microseconds>(wake - now);
            auto r = inner_.reap(1, std::max(wait, std::chrono::microseconds(0)));
            if (!r.has_value()) return r.error();
        } else if (wake > now) {
            std::this_thread::sleep_until(wake);
        }
    }
    return delivered_;
}

}  // namespace zinf::io
