// Learning-rate schedules and the loss scaler, after DeepSpeed's lr_schedules.py and
// loss_scaler.py.
#include "src/engine/schedule.h"

#include <algorithm>
#include <cmath>

namespace zinf::engine {

double learning_rate(const config::SchedulerConfig& s, double optimizer_lr,
                     std::uint64_t step) noexcept {
    if (s.type == config::SchedulerType::kNone) return optimizer_lr;
    // DeepSpeed clamps the warm-up to at least 2 steps (log(1) would divide by zero).
    const std::uint64_t warmup = std::max<std::uint64_t>(2, s.warmup_num_steps);
    double gamma = 1.0;
    if (step < warmup) {
        gamma = s.warmup_linear ? static_cast<double>(step) / static_cast<double>(warmup)
                                : std::log(static_cast<double>(step) + 1.0) /
                                      std::log(static_cast<double>(warmup));
    } else if (s.type == config::SchedulerType::kWarmupDecayLR) {
        const double remaining = static_cast<double>(s.total_num_steps) - static_cast<double>(step);
        const double span =
            std::max(1.0, static_cast<double>(s.total_num_steps) - static_cast<double>(warmup));
        gamma = std::max(0.0, remaining / span);
    }
    return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma;
}

LossScaler::LossScaler(const config::Fp16Config& fp16) noexcept {
    if (!fp16.enabled) return;
    if (fp16.loss_scale > 0) {
        state_.scale = fp16.loss_scale;
        return;
    }
    dynamic_ = true;
    min_scale_ = fp16.min_loss_scale;
    window_ = static_cast<std::uint64_t>(fp16.loss_scale_window);
    hysteresis_ = fp16.hysteresis;
    state_.scale = std::ldexp(1.0, fp16.initial_scale_power);
    state_.hysteresis_left = hysteresis_;
}

void LossScaler::update(bool overflow) noexcept {
    if (!dynamic_) return;
    auto& s = state_;
    if (overflow) {
        if (hysteresis_ == 1 || s.hysteresis_left == 1) {
            s.scale = std::max(s.scale / 2.0, min_scale_);
        } else {
            --s.hysteresis_left;
        }
        s.last_overflow_iteration = static_cast<std::int64_t>(s.iteration);
    } else {
        const auto since = static_cast<std::int64_t>(s.iteration) - s.last_overflow_iteration;
        if (since % static_cast<std::int64_t>(window_) == 0) {
            s.hysteresis_left = hysteresis_;
            s.scale *= 2.0;
        }
    }
    ++s.iteration;
}

}  // namespace zinf::engine
