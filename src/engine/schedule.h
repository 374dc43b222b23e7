// The step-by-step scalars of training: DeepSpeed's learning-rate schedules (WarmupLR,
// WarmupDecayLR) and fp16's dynamic loss scaler. Plain arithmetic with DeepSpeed's formulas, so a
// DeepSpeed config behaves the same here.
#pragma once

#include <cstdint>

#include "src/base/config.h"

namespace zinf::engine {

// The learning rate of optimizer step `step` (0-based: the first step is 0), as DeepSpeed's
// scheduler gives it after `step` calls of scheduler.step() past construction. Without a
// scheduler, the optimizer's lr.
double learning_rate(const config::SchedulerConfig& scheduler, double optimizer_lr,
                     std::uint64_t step) noexcept;

// DeepSpeed's DynamicLossScaler (consecutive_hysteresis off), or a static scale when
// fp16.loss_scale > 0; 1 and never changing when fp16 is off.
class LossScaler {
public:
    struct State {
        double scale = 1.0;
        std::uint64_t iteration = 0;
        std::int64_t last_overflow_iteration = -1;
        int hysteresis_left = 1;
    };

    explicit LossScaler(const config::Fp16Config& fp16) noexcept;
    double scale() const noexcept { return state_.scale; }
    bool dynamic() const noexcept { return dynamic_; }
    // Records one step's outcome: an overflow lowers the scale (after `hysteresis` overflows),
    // `loss_scale_window` clean steps since the last overflow double it.
    void update(bool overflow) noexcept;
    const State& state() const noexcept { return state_; }
    void restore(const State& state) noexcept { state_ = state; }

private:
    bool dynamic_ = false;
    double min_scale_ = 1.0;
    std::uint64_t window_ = 1000;
    int hysteresis_ = 2;
    State state_;
};

}  // namespace zinf::engine
