// OverlapStep: the speculated optimizer step beside the window's last backward.
#include "src/engine/overlap_step.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "src/base/log.h"

namespace zinf::engine {
namespace {

constexpr EventId kNoEvent = std::numeric_limits<EventId>::max();
constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();

}  // namespace

OverlapStep::OverlapStep(const OffloadPlan& plan, const zero::ParameterCoordinator& coordinator,
                         swap::OptimizerSwapper& swapper, OptimizerIo& io, Device& device,
                         NormPartialFn partial)
    : coordinator_(coordinator),
      swapper_(swapper),
      io_(io),
      device_(device),
      dtype_(plan.dtype),
      groups_(swapper.sub_group_count()),
      partial_fn_(std::move(partial)) {}

Result<std::unique_ptr<OverlapStep>> OverlapStep::create(
    const OffloadPlan& plan, const zero::ParameterCoordinator& coordinator,
    swap::OptimizerSwapper& swapper, OptimizerIo& io, Device& device, NormPartialFn partial) {
    std::unique_ptr<OverlapStep> o(
        new OverlapStep(plan, coordinator, swapper, io, device, std::move(partial)));
    const std::size_t eb = dtype_size_bytes(plan.dtype);
    auto b = AlignedBuffer::allocate(std::max<std::size_t>(plan.domain_numel * eb, 64));
    if (!b.has_value()) {
        return b.error().with_context("swap.overlap_step: host buffer of the new parameters");
    }
    o->buffer_ = std::move(*b);
    const std::size_t params = coordinator.partitioning().parameter_count();
    const std::uint64_t sub = swapper.options().sub_group_numel;
    o->groups_of_param_.resize(params);
    o->params_of_group_.resize(o->groups_);
    for (std::size_t p = 0; p < params; ++p) {
        const std::uint64_t at = coordinator.domain_offset_numel(p);
        const std::uint64_t n = coordinator.partitioning().slot(p).slice_numel;
        if (n == 0) continue;
        for (std::uint64_t g = at / sub; g <= (at + n - 1) / sub && g < o->groups_; ++g) {
            o->groups_of_param_[p].push_back(static_cast<std::uint32_t>(g));
            o->params_of_group_[g].push_back(static_cast<std::uint32_t>(p));
        }
    }
    o->partial_state_ = std::make_unique<std::atomic<std::uint8_t>[]>(params);
    for (std::size_t p = 0; p < params; ++p) o->partial_state_[p].store(kCaller);
    o->partials_.assign(params, NormPartial{});
    o->needs_final_.assign(o->groups_, false);
    o->expected_.assign(params, 0);
    o->seen_.assign(params, 0);
    o->last_seen_.assign(params, 0);
    o->pending_.assign(o->groups_, 0);
    o->event_.assign(o->groups_, kNoEvent);
    o->ready_.assign(o->groups_, false);
    o->order_.resize(o->groups_);
    std::iota(o->order_.begin(), o->order_.end(), 0u);
    return o;
}

OverlapStep::~OverlapStep() {
    if (thread_.joinable()) abandon(Why::kFailed);
}

void OverlapStep::begin_window(const kernels::OptimizerParams& params, StreamId stream) {
    // A step that never came (its window failed after the backward) leaves nothing behind.
    if (thread_.joinable()) abandon(Why::kFailed);
    std::fill(seen_.begin(), seen_.end(), 0u);
    stream_ = stream;
    if (!recorded_) {
        mode_ = Mode::kRecording;
        arrivals_ = 0;
        std::fill(last_seen_.begin(), last_seen_.end(), 0u);
        return;
    }
    mode_ = Mode::kRunning;
    params_ = params;
    std::fill(pending_.begin(), pending_.end(), 0u);
    for (std::size_t p = 0; p < expected_.size(); ++p) {
        if (expected_[p] == 0) continue;
        for (const std::uint32_t g : groups_of_param_[p]) ++pending_[g];
    }
    {
        const std::lock_guard lock(mutex_);
        std::fill(ready_.begin(), ready_.end(), false);
        std::fill(event_.begin(), event_.end(), kNoEvent);
        all_final_ = false;
        abandoned_ = false;
    }
    gate_wait_seconds_ = 0.0;
    // The thread may take the norm's partials from here (the engine's thread reads them only
    // after the backward, through partials_usable).
    const std::uint8_t open = partial_fn_ ? kOpen : kCaller;
    for (std::size_t p = 0; p < expected_.size(); ++p) partial_state_[p].store(open);
    thread_status_ = Status::ok();
    thread_ =
        std::thread([this] { thread_status_ = swapper_.speculate(params_, *this, order_, *this); });
}

void OverlapStep::accumulated(std::size_t index) {
    if (mode_ == Mode::kIdle) return;
    const std::uint32_t n = ++seen_[index];
    if (mode_ == Mode::kRecording) {
        last_seen_[index] = ++arrivals_;
        return;
    }
    if (n > expected_[index]) {
        // More gradients than the recorded backward gave: a sub-group stepped already may
        // have used a gradient that was not final. Forget the speculation; record again.
        const std::lock_guard lock(mutex_);
        if (!abandoned_) {
            log::info("swap.overlap_step: parameter ", index, " got gradient ", n,
                      " of a backward that gave it ", expected_[index],
                      "; the step runs sequentially and the order is recorded again");
        }
        abandoned_ = true;
        recorded_ = false;
        changed_.notify_all();
        return;
    }
    if (n < expected_[index]) return;
    for (const std::uint32_t g : groups_of_param_[index]) {
        if (--pending_[g] != 0 || needs_final_[g]) continue;
        // Every gradient of g is queued on the stream: the thread waits for this event before
        // reading them.
        auto ev = device_.record_event(stream_);
        EventId id = kNoEvent;
        if (ev.has_value()) {
            id = *ev;
        } else if (!device_.synchronize(stream_).is_ok()) {
            continue;  // left for gradients_final, after the engine's own synchronize
        }
        const std::lock_guard lock(mutex_);
        event_[g] = id;
        ready_[g] = true;
        changed_.notify_all();
    }
}

void OverlapStep::gradients_final() {
    if (mode_ == Mode::kRecording) {
        expected_ = seen_;
        // The order in which the sub-groups became final: by the arrival of their last
        // gradient; those that wait for gradients_final last, in index order.
        std::vector<std::uint64_t> final_at(groups_, 0);
        std::fill(needs_final_.begin(), needs_final_.end(), false);
        std::vector<bool> covered(groups_, false);
        for (std::size_t p = 0; p < expected_.size(); ++p) {
            for (const std::uint32_t g : groups_of_param_[p]) {
                covered[g] = true;
                if (expected_[p] == 0) {
                    needs_final_[g] = true;
                } else {
                    final_at[g] = std::max(final_at[g], last_seen_[p]);
                }
            }
        }
        for (std::size_t g = 0; g < groups_; ++g) {
            // Elements no parameter covers (the domain's tail) are zeroed at the step.
            if (!covered[g]) needs_final_[g] = true;
            if (needs_final_[g]) final_at[g] = kNever;
        }
        std::iota(order_.begin(), order_.end(), 0u);
        std::stable_sort(order_.begin(), order_.end(), [&](std::uint32_t a, std::uint32_t b) {
            return final_at[a] < final_at[b];
        });
        recorded_ = true;
        ++counts_.recorded;
        mode_ = Mode::kIdle;
        return;
    }
    if (mode_ != Mode::kRunning) return;
    const std::lock_guard lock(mutex_);
    all_final_ = true;
    std::fill(ready_.begin(), ready_.end(), true);
    changed_.notify_all();
}

Status OverlapStep::ready(std::size_t sub_group) {
    const auto t0 = std::chrono::steady_clock::now();
    EventId ev = kNoEvent;
    {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return abandoned_ || ready_[sub_group]; });
        if (abandoned_) return Status::busy("swap.overlap_step: the speculated step was abandoned");
        ev = std::exchange(event_[sub_group], kNoEvent);
    }
    Status s;
    if (ev != kNoEvent) {
        s = device_.synchronize_event(ev);
        device_.release_event(ev);
    }
    gate_wait_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s.is_ok()) take_partials(sub_group);
    return s;
}

void OverlapStep::take_partials(std::size_t sub_group) {
    if (!partial_fn_) return;
    // Every parameter of a sub-group let through has its final gradients: the ones with
    // gradients counted it pending until their last one, and one without any kept it waiting
    // for gradients_final.
    for (const std::uint32_t p : params_of_group_[sub_group]) {
        std::uint8_t open = kOpen;
        if (!partial_state_[p].compare_exchange_strong(open, kTaking)) continue;
        partials_[p] = partial_fn_(p);
        partial_state_[p].store(kTaken, std::memory_order_release);
    }
}

bool OverlapStep::partials_usable() {
    if (!partial_fn_ || mode_ != Mode::kRunning) return false;
    // A parameter that got a gradient beyond the recorded count abandoned the speculation: a
    // partial the thread took may be of a gradient that was not final.
    const std::lock_guard lock(mutex_);
    return !abandoned_;
}

bool OverlapStep::take_partial(std::size_t index, NormPartial& out) {
    std::uint8_t state = kOpen;
    if (partial_state_[index].compare_exchange_strong(state, kCaller)) return false;
    if (state == kCaller) return false;
    // Taken, or being taken by the thread: one parameter's sum, so a short wait.
    while ((state = partial_state_[index].load(std::memory_order_acquire)) == kTaking) {
        std::this_thread::yield();
    }
    out = partials_[index];
    ++counts_.norm_partials;
    return true;
}

Status OverlapStep::finish() {
    ZINF_ASSERT(thread_.joinable());
    thread_.join();
    mode_ = Mode::kIdle;
    bool abandoned = false;
    {
        const std::lock_guard lock(mutex_);
        abandoned = abandoned_;
        for (EventId& ev : event_) {
            if (ev != kNoEvent) device_.release_event(std::exchange(ev, kNoEvent));
        }
    }
    if (abandoned) {
        if (swapper_.speculating()) swapper_.discard_speculation();
        ++counts_.abandoned;
        return Status::busy("swap.overlap_step: the backward changed its pattern");
    }
    return thread_status_;
}

void OverlapStep::stop_thread(bool abandon) {
    {
        const std::lock_guard lock(mutex_);
        if (abandon) abandoned_ = true;
        changed_.notify_all();
    }
    thread_.join();
    mode_ = Mode::kIdle;
    const std::lock_guard lock(mutex_);
    for (EventId& ev : event_) {
        if (ev != kNoEvent) device_.release_event(std::exchange(ev, kNoEvent));
    }
}

void OverlapStep::abandon(Why why) {
    if (!thread_.joinable()) {
        // A backward that failed while recording records again next time.
        if (mode_ == Mode::kRecording) recorded_ = false;
        mode_ = Mode::kIdle;
        return;
    }
    stop_thread(true);
    if (swapper_.speculating()) swapper_.discard_speculation();
    switch (why) {
        case Why::kClipping:
            ++counts_.redone;
            break;
        case Why::kOverflow:
            ++counts_.skipped;
            break;
        case Why::kFailed:
            ++counts_.abandoned;
            break;
    }
}

Status OverlapStep::publish(StreamId stream) {
    // The whole domain at once: each parameter's slice is replaced whole, so parameters on NVMe
    // are replaced without reading their old bytes (a sub-group's cut would read them). They
    // are staged: the next forward copies each from the buffer as it reaches it and writes it
    // to NVMe beside its compute (the forward reads no parameter from the disk, and the writes
    // fill the disk time it leaves). The engine takes what is left before the backward, after
    // which the thread may write the buffer again.
    const std::size_t eb = dtype_size_bytes(dtype_);
    ZINF_TRY(io_.store_parameters(
        0, std::span<const std::byte>(buffer_.data(), coordinator_.domain().numel * eb), stream,
        /*staged=*/true));
    ++counts_.committed;
    return Status::ok();
}

Result<kernels::GradView> OverlapStep::gradients(std::size_t, std::uint64_t offset_numel,
                                                 std::uint64_t numel) {
    const auto* grads = static_cast<const std::byte*>(coordinator_.domain().gradients);
    ZINF_ASSERT(grads != nullptr);
    return kernels::GradView{grads + offset_numel * dtype_size_bytes(dtype_),
                             static_cast<std::size_t>(numel), dtype_};
}

kernels::ParamCopy OverlapStep::param_copy(std::size_t, std::uint64_t offset_numel,
                                           std::uint64_t numel) {
    if (dtype_ == DType::kFloat32) return kernels::ParamCopy::none();
    return kernels::ParamCopy{buffer_.as<std::uint16_t>() + offset_numel,
                              static_cast<std::size_t>(numel), dtype_};
}

Status OverlapStep::updated(std::size_t, std::uint64_t offset_numel,
                            std::span<const float> params) {
    if (dtype_ == DType::kFloat32) {
        std::memcpy(buffer_.data() + offset_numel * sizeof(float), params.data(),
                    params.size_bytes());
    }
    return Status::ok();
}

}  // namespace zinf::engine
