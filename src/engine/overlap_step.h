// OverlapStep (swap.overlap_step): the optimizer step of an accumulation window runs beside the
// window's last backward. As backward hands over gradients, a sub-group of the NVMe optimizer
// states whose gradients are all final is stepped on a thread of its own (its states read ahead
// in the order the sub-groups became final in a recorded backward) while backward goes on with
// the layers below. The step is speculative: it assumes the clip coefficient 1 and no fp16
// overflow, and writes every sub-group to its copy-on-write shadow, so the states it read stay
// intact. Once the norm is known the engine commits it (the extent table switches), or discards
// it and steps again sequentially from the intact states (clipping), or skips the step
// (overflow): rollback by bytes, never by an arithmetic inverse, so the result is bitwise the
// sequential step's in every case.
//
// The thread starts with the window's last forward (the forward reads only parameters, so the
// disk has room for the first sub-groups' states), and takes the gradient norm's partial of
// each parameter of a sub-group it lets through, so that the norm after backward adds what was
// taken beside it instead of reading every gradient again.
//
// The new parameters are held in a host buffer of the domain (2 or 4 bytes per element) until
// the commit, since backward still reads parameters (tied ones, and stage 3 gathering the layers
// below) and a discarded step must leave them as they were. The commit publishes them staged:
// the next forward copies each from the buffer and writes it to NVMe behind its compute
// (ResidencyManager::stage_overwrite); the engine takes what is left before the next backward.
//
// One rank, stages 2-3 (each gradient is reduced as backward produces it), optimizer states on
// NVMe, gradients in host memory (not streamed), the CPU device: the plan says why not otherwise
// (OffloadPlan::overlap_step_reason).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kernels/optimizer.h"
#include "src/base/aligned.h"
#include "src/base/device.h"
#include "src/base/status.h"
#include "src/engine/offload_plan.h"
#include "src/engine/state_store.h"
#include "swap/optimizer_swapper.h"
#include "zero/parameter_coordinator.h"

namespace zinf::engine {

// Cumulative since create.
struct OverlapCounts {
    std::uint64_t recorded = 0;   // backwards that recorded the order (stepped sequentially)
    std::uint64_t committed = 0;  // speculated steps made current
    std::uint64_t redone = 0;     // discarded for clipping, stepped again sequentially
    std::uint64_t skipped = 0;    // discarded for an fp16 overflow
    std::uint64_t abandoned = 0;  // the backward changed its pattern, or failed
    // Windows stepped after backward because the step before clipped or overflowed.
    std::uint64_t not_speculated = 0;
    // Parameters whose part of the gradient norm the thread took beside backward.
    std::uint64_t norm_partials = 0;
    // Speculated steps that did not stand, over those taken.
    double rollback_rate() const noexcept {
        const std::uint64_t taken = committed + redone + skipped + abandoned;
        return taken == 0
                   ? 0.0
                   : static_cast<double>(redone + skipped + abandoned) / static_cast<double>(taken);
    }
};

// One parameter's part of the gradient norm: the sum of squares of its slice and the count of
// its chunks holding an inf or NaN (Engine::gradient_stats adds them in parameter order).
struct NormPartial {
    double sum_squares = 0.0;
    double nonfinite_chunks = 0.0;
};
// Computes parameter `index`'s partial from its final gradients; the same function whichever
// thread calls it, so the norm has the same bits wherever each partial was taken.
using NormPartialFn = std::function<NormPartial(std::size_t index)>;

class OverlapStep final : private swap::SubGroupGate, private swap::GradientSource {
public:
    // Borrows everything, which outlives this object. Allocates the parameter buffer
    // (plan.domain_numel elements of the parameters' dtype). `partial` (optional) lets the
    // thread take the norm's partials of each sub-group's parameters as it is let through.
    // Errors: kNoSpace.
    static Result<std::unique_ptr<OverlapStep>> create(
        const OffloadPlan& plan, const zero::ParameterCoordinator& coordinator,
        swap::OptimizerSwapper& swapper, OptimizerIo& io, Device& device,
        NormPartialFn partial = {});
    ~OverlapStep() override;
    OverlapStep(const OverlapStep&) = delete;
    OverlapStep& operator=(const OverlapStep&) = delete;

    // The window's last forward begins on `stream` (its backward follows). The first window
    // (and the first after a change of pattern) records which gradients arrive, how often and
    // in which order; later ones start the speculated step with `params` (clip coefficient 1)
    // on the thread, which reads the first sub-groups of the order (swap.optimizer_read_ahead
    // of them beyond the one it waits on) while the forward computes: the forward reads only
    // parameters and leaves the disk room.
    void begin_window(const kernels::OptimizerParams& params, StreamId stream);
    // The window's last forward begins, and its step will follow the backward (counted).
    void skip_window() noexcept { ++counts_.not_speculated; }
    // After each gradient of parameter `index` reached the coordinator in that backward (the
    // engine's thread). A gradient beyond the recorded count abandons the speculation.
    void accumulated(std::size_t index);
    // The backward ended and reduce_gradients ran: every gradient of the window is final.
    void gradients_final();
    // Whether a speculated step is under way or done for this window (begin_window started
    // it and nothing abandoned it yet).
    bool speculating() const noexcept { return thread_.joinable(); }
    // Waits for the speculated step. ok: the swapper holds it, to commit or discard. kBusy: it
    // was abandoned (the pattern changed; nothing kept, the caller steps sequentially); other
    // errors: the step's (I/O, corruption), its shadows discarded.
    Status finish();
    // Stops the speculated step (the norm asks for another coefficient, an overflow skips the
    // step, or the backward failed) and forgets it; the states stay those from before it.
    // `why` counts it.
    enum class Why { kClipping, kOverflow, kFailed };
    void abandon(Why why);
    // After the swapper committed: the new parameters to where the next forward reads them
    // (staged from the buffer: OptimizerIo::store_parameters).
    Status publish(StreamId stream);

    // The gradient norm after backward (the engine's thread): whether the thread's partials of
    // this window may be used (a speculation runs and nothing abandoned it: every partial it
    // took is of final gradients), then, per parameter, the thread's partial (true; waits if
    // the thread is taking it) or false: the thread has not, and now will not, take it, so the
    // caller computes it.
    bool partials_usable();
    bool take_partial(std::size_t index, NormPartial& out);

    const OverlapCounts& counts() const noexcept { return counts_; }
    // The last speculated step's seconds waiting for gradients, and its whole time.
    double last_gate_wait_seconds() const noexcept { return gate_wait_seconds_; }

private:
    enum class Mode { kIdle, kRecording, kRunning };

    OverlapStep(const OffloadPlan& plan, const zero::ParameterCoordinator& coordinator,
                swap::OptimizerSwapper& swapper, OptimizerIo& io, Device& device,
                NormPartialFn partial);
    void stop_thread(bool abandon);
    // The thread, once sub-group `sub_group` was let through: the partials of its parameters
    // that nobody took yet.
    void take_partials(std::size_t sub_group);

    // swap::SubGroupGate
    Status ready(std::size_t sub_group) override;
    // swap::GradientSource: the domain's gradients in place; the new parameters to buffer_.
    Result<kernels::GradView> gradients(std::size_t sub_group, std::uint64_t offset_numel,
                                        std::uint64_t numel) override;
    kernels::ParamCopy param_copy(std::size_t sub_group, std::uint64_t offset_numel,
                                  std::uint64_t numel) override;
    Status updated(std::size_t sub_group, std::uint64_t offset_numel,
                   std::span<const float> params) override;

    const zero::ParameterCoordinator& coordinator_;
    swap::OptimizerSwapper& swapper_;
    OptimizerIo& io_;
    Device& device_;
    DType dtype_;
    std::size_t groups_ = 0;
    AlignedBuffer buffer_;  // the new parameters of the domain, in dtype_

    // Which sub-groups each parameter's domain slice touches, and the reverse.
    std::vector<std::vector<std::uint32_t>> groups_of_param_;
    std::vector<std::vector<std::uint32_t>> params_of_group_;
    // Sub-groups some of whose elements no recorded gradient covers: final only at
    // gradients_final().
    std::vector<bool> needs_final_;

    // The recorded pattern: gradients per parameter in the last backward, the order in which
    // the sub-groups became final.
    bool recorded_ = false;
    std::vector<std::uint32_t> expected_;
    std::vector<std::uint32_t> order_;
    std::vector<std::uint64_t> last_seen_;  // recording: the arrival number of the last gradient
    std::uint64_t arrivals_ = 0;

    Mode mode_ = Mode::kIdle;
    StreamId stream_ = 0;
    kernels::OptimizerParams params_;
    std::vector<std::uint32_t> seen_;  // gradients per parameter in this backward

    // Shared with the thread, under mutex_.
    std::mutex mutex_;
    std::condition_variable changed_;
    std::vector<std::uint32_t> pending_;  // parameters of each sub-group not final yet
    std::vector<EventId> event_;          // per sub-group: recorded when it became final
    std::vector<bool> ready_;
    bool all_final_ = false;
    bool abandoned_ = false;

    // The norm's partials: per parameter kOpen, then kTaking and kTaken by the thread, or
    // kCaller once the engine computes it itself.
    enum PartialState : std::uint8_t { kOpen, kTaking, kTaken, kCaller };
    NormPartialFn partial_fn_;
    std::unique_ptr<std::atomic<std::uint8_t>[]> partial_state_;
    std::vector<NormPartial> partials_;

    std::thread thread_;
    Status thread_status_;
    double gate_wait_seconds_ = 0.0;
    OverlapCounts counts_;
};

}  // namespace zinf::engine
