// SimDevice (in-memory files with a capacity) and SimBackend (seeded latency, out-of-order
// completion).
#include "io/sim_backend.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "io/detail/backends.h"
#include "io/detail/completion.h"
#include "src/base/log.h"

namespace zinf::io {

Result<int> SimDevice::open(const std::string& path, const FileOptions& options) {
    if (path.empty()) return Status::invalid_argument("open: empty path");
    std::lock_guard lock(mutex_);
    auto it = ids_.find(path);
    if (it == ids_.end()) {
        if (!options.create) {
            return Status::not_found(str_cat("open ", path, ": No such file or directory"), ENOENT);
        }
        const int id = static_cast<int>(files_.size());
        files_.emplace_back();
        ids_.emplace(path, id);
        return id;
    }
    if (options.create && options.exclusive) {
        return Status::io_error(str_cat("open ", path, ": File exists"), EEXIST);
    }
    if (options.truncate) {
        auto& f = files_[static_cast<std::size_t>(it->second)];
        used_bytes_ -= f.size();
        f.clear();
        f.shrink_to_fit();
    }
    return it->second;
}

Status SimDevice::reserve(int file, std::uint64_t size_bytes) {
    std::lock_guard lock(mutex_);
    ZINF_ASSERT(file >= 0 && static_cast<std::size_t>(file) < files_.size());
    auto& f = files_[static_cast<std::size_t>(file)];
    if (size_bytes <= f.size()) return Status::ok();
    const std::uint64_t grow = size_bytes - f.size();
    if (used_bytes_ + grow > options_.capacity_bytes) {
        return Status::no_space(str_cat("simulated device full: ", used_bytes_, " of ",
                                        options_.capacity_bytes, " bytes used, ", grow,
                                        " more asked"));
    }
    f.resize(size_bytes);
    used_bytes_ += grow;
    return Status::ok();
}

long SimDevice::read(int file, std::uint64_t offset_bytes, std::byte* buffer,
                     std::uint32_t length_bytes) {
    std::lock_guard lock(mutex_);
    if (file < 0 || static_cast<std::size_t>(file) >= files_.size()) return -EBADF;
    const auto& f = files_[static_cast<std::size_t>(file)];
    if (offset_bytes >= f.size()) return 0;
    const std::uint64_t n = std::min<std::uint64_t>(length_bytes, f.size() - offset_bytes);
    std::memcpy(buffer, f.data() + offset_bytes, n);
    return static_cast<long>(n);
}

long SimDevice::write(int file, std::uint64_t offset_bytes, const std::byte* buffer,
                      std::uint32_t length_bytes) {
    std::lock_guard lock(mutex_);
    if (file < 0 || static_cast<std::size_t>(file) >= files_.size()) return -EBADF;
    auto& f = files_[static_cast<std::size_t>(file)];
    const std::uint64_t end = offset_bytes + length_bytes;
    if (end > f.size()) {
        const std::uint64_t grow = end - f.size();
        if (used_bytes_ + grow > options_.capacity_bytes) return -ENOSPC;
        f.resize(end);
        used_bytes_ += grow;
    }
    std::memcpy(f.data() + offset_bytes, buffer, length_bytes);
    return static_cast<long>(length_bytes);
}

std::uint64_t SimDevice::size_bytes(int file) const {
    std::lock_guard lock(mutex_);
    ZINF_ASSERT(file >= 0 && static_cast<std::size_t>(file) < files_.size());
    return files_[static_cast<std::size_t>(file)].size();
}

std::uint64_t SimDevice::used_bytes() const {
    std::lock_guard lock(mutex_);
    return used_bytes_;
}

SimBackend::SimBackend(SimDevice& device, std::size_t queue_depth, std::uint64_t stream,
                       const Seams& seams)
    : device_(device),
      seams_(seams),
      slots_(queue_depth),
      rng_(device.options().seed * 0x9E3779B97F4A7C15ULL + stream) {
    ZINF_ASSERT_GT(queue_depth, 0u);
    ZINF_ASSERT_LE(device.options().latency_us_min, device.options().latency_us_max);
}

SimBackend::~SimBackend() {
    ZINF_ASSERT_EQ(in_flight_, 0u);
}

Status SimBackend::register_buffers(std::span<const std::span<std::byte>> regions) {
    for (const auto& r : regions) {
        if (r.size() > kMaxRegisteredBufferBytes) {
            return Status::invalid_argument("register_buffers: region larger than 1 GiB");
        }
    }
    return Status::ok();
}

Result<std::size_t> SimBackend::submit(std::span<Request* const> requests) noexcept {
    const auto now = std::chrono::steady_clock::now();
    const SimOptions& o = device_.options();
    std::size_t accepted = 0;
    for (Slot& slot : slots_) {
        if (accepted == requests.size()) break;
        if (slot.request != nullptr) continue;
        Request* r = requests[accepted];
        detail::check_submitted(*r);
        r->state = Request::State::kInFlight;
        const std::uint64_t span = o.latency_us_max - o.latency_us_min;
        const std::uint64_t latency_us = o.latency_us_min + (span == 0 ? 0 : rng_() % (span + 1));
        slot.request = r;
        slot.due = now + std::chrono::microseconds(latency_us);
        slot.sequence = rng_();  // random tie-break: equal latencies still complete out of order
        ++in_flight_;
        ++accepted;
    }
    if (accepted == 0) return Status::busy("sim queue full");
    return accepted;
}

std::size_t SimBackend::deliver_due(std::chrono::steady_clock::time_point now) noexcept {
    std::size_t delivered = 0;
    // Bounded: each pass delivers one request or ends.
    for (std::size_t pass = 0; pass <= slots_.size(); ++pass) {
        Slot* next = nullptr;
        for (Slot& slot : slots_) {
            if (slot.request == nullptr || slot.due > now) continue;
            if (next == nullptr || slot.due < next->due ||
                (slot.due == next->due && slot.sequence < next->sequence)) {
                next = &slot;
            }
        }
        if (next == nullptr) break;
        Request& r = *next->request;
        next->request = nullptr;
        --in_flight_;
        ++delivered;
        const Status status = transfer(r);
        detail::complete(r, status);
    }
    return delivered;
}

Status SimBackend::transfer(Request& r) noexcept {
    // Bounded: each pass moves at least one byte or uses up one of kMaxRetries retries.
    for (std::uint64_t pass = 0;; ++pass) {
        ZINF_ASSERT_LE(pass, std::uint64_t{r.length_bytes} + kMaxRetries);
        const std::uint32_t left = r.length_bytes - r.done_bytes;
        const std::uint64_t offset = r.offset_bytes + r.done_bytes;
        const long got = r.op == OpKind::kRead
                             ? device_.read(r.fd, offset, r.buffer + r.done_bytes, left)
                             : device_.write(r.fd, offset, r.buffer + r.done_bytes, left);
        const detail::Verdict verdict = detail::classify_completion(r, seam_result(seams_, r, got));
        switch (detail::apply_verdict(r, verdict)) {
            case detail::Next::kComplete:
                return Status::ok();
            case detail::Next::kEndOfFile:
                return detail::end_of_file_error();
            case detail::Next::kError:
                return detail::piece_error(verdict.error);
            case detail::Next::kResubmit:
            case detail::Next::kRetry:
                break;
        }
    }
}

Result<std::size_t> SimBackend::reap(std::size_t min_count,
                                     std::chrono::microseconds timeout) noexcept {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::size_t completed = 0;
    for (int pass = 0;; ++pass) {
        ZINF_ASSERT_LT(pass, 1 << 30);
        const auto now = std::chrono::steady_clock::now();
        completed += deliver_due(now);
        if (completed >= min_count || in_flight_ == 0 || now >= deadline) break;
        auto wake = deadline;
        for (const Slot& slot : slots_) {
            if (slot.request != nullptr) wake = std::min(wake, slot.due);
        }
        std::unique_lock lock(wake_mutex_);
        wake_cv_.wait_until(lock, wake, [&] { return woken_; });
        if (woken_) {
            woken_ = false;
            break;
        }
    }
    return completed;
}

void SimBackend::wake() noexcept {
    {
        std::lock_guard lock(wake_mutex_);
        woken_ = true;
    }
    wake_cv_.notify_all();
}

}  // namespace zinf::io
