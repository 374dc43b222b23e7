// Learning-rate schedules and the loss scaler, after DeepSpeed's lr_schedules.py and
// loss_scaler.py.
#include "src/engine/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

namespace zinf::engine {
namespace {

// DeepSpeed's last_batch_iteration during optimizer step `step` (0-based): DeepSpeed's engine
// calls lr_scheduler.step() after each applied optimizer step, so step k runs with the lr set
// after k scheduler steps, at last_batch_iteration k - 1; step 0 runs with what the schedule's
// constructor set (last_batch_iteration -1). One place, so every schedule keeps it.
double last_batch_iteration(std::uint64_t step) noexcept {
    return static_cast<double>(step) - 1.0;
}

// The arithmetic below follows lr_schedules.py operation by operation (same operands, same
// order, doubles where Python has floats), so the results round the same way as DeepSpeed's.

// WarmupCosineLR.get_lr_ratio().
double warmup_cosine_ratio(const config::SchedulerConfig& s, double it) noexcept {
    if (it < 0) return 0.0;  // "before it has started": DeepSpeed's get_lr_ratio returns 0
    // As WarmupLR: at least 2 warm-up steps, else log(1) = 0 would divide.
    const double warmup = static_cast<double>(std::max<std::uint64_t>(2, s.warmup_num_steps));
    if (it < warmup) {
        const double inverse_log_warm_up = 1.0 / std::log(warmup);
        const double ratio =
            s.warmup_linear ? it / warmup : inverse_log_warm_up * std::log(it + 1.0);
        return s.warmup_min_ratio + ratio * (1.0 - s.warmup_min_ratio);
    }
    const double real_last_step = it - warmup + 1.0;
    // Python ints: total_num_steps - warmup may be negative; max(1, ...) keeps a divisor.
    const double real_total_steps = std::max(1.0, static_cast<double>(s.total_num_steps) - warmup);
    // The progress is clamped, so the ratio stays at cos_min_ratio past total_num_steps (and for
    // every post-warm-up step when total_num_steps <= warmup_num_steps).
    const double progress = std::min(1.0, real_last_step / real_total_steps);
    const double ratio = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
    return std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * ratio);
}

// LRRangeTest.get_lr().
double lr_range_test_lr(const config::SchedulerConfig& s, double it) noexcept {
    if (it < 0) return s.lr_range_test_min_lr;  // the constructor's lr
    const double size = static_cast<double>(s.lr_range_test_step_size);
    double interval = (it + 1.0) / size;
    if (s.lr_range_test_staircase) interval = std::floor(interval);
    return s.lr_range_test_min_lr * (1.0 + s.lr_range_test_step_rate * interval);
}

// OneCycle's cycle shape (_initialize_cycle): sizes as floats, the second half and the second
// stair count default to the first's when not given.
struct Cycle {
    double first;
    double second;
    double total;
    double step_ratio;
    std::uint64_t first_stairs;
    std::uint64_t second_stairs;
};

Cycle one_cycle_shape(const config::SchedulerConfig& s) noexcept {
    Cycle c{};
    c.first = static_cast<double>(s.cycle_first_step_size);
    c.second =
        s.cycle_second_step_size_given ? static_cast<double>(s.cycle_second_step_size) : c.first;
    c.total = c.first + c.second;
    c.step_ratio = c.first / c.total;
    c.first_stairs = s.cycle_first_stair_count;
    c.second_stairs =
        s.cycle_second_stair_count_given ? s.cycle_second_stair_count : s.cycle_first_stair_count;
    return c;
}

// OneCycle._get_scale_factor(): 0 at the cycle's start and end, 1 at the peak. A stair count
// holds the scale flat over steps; DeepSpeed quantises from the integer offset in the cycle, not
// from the float scale, so an exact stair is never floored one down by rounding.
double one_cycle_scale(const Cycle& c, double it) noexcept {
    const double batch_iteration = it + 1.0;
    const double cycle = std::floor(1.0 + batch_iteration / c.total);
    const double x = 1.0 + batch_iteration / c.total - cycle;
    double scale = 0.0;
    std::uint64_t stairs = 0;
    if (x <= c.step_ratio) {
        scale = x / c.step_ratio;
        stairs = c.first_stairs;
    } else {
        scale = (x - 1.0) / (c.step_ratio - 1.0);
        stairs = c.second_stairs;
    }
    if (stairs > 0) {
        const double n = static_cast<double>(stairs);
        const double cycle_iteration = std::fmod(batch_iteration, c.total);
        const double position = cycle_iteration <= c.first
                                    ? cycle_iteration * n / c.first
                                    : (c.total - cycle_iteration) * n / c.second;
        scale = std::floor(position) / n;
    }
    return scale;
}

// OneCycle decays lr and momentum after the cycle only with a non-zero decay_step_size and a
// non-zero rate (DeepSpeed's math.isclose(x, 0) is x == 0).
bool one_cycle_decays(const config::SchedulerConfig& s, double rate) noexcept {
    return s.decay_step_size != 0 && rate != 0.0;
}

// OneCycle.get_lr().
double one_cycle_lr(const config::SchedulerConfig& s, double it) noexcept {
    if (it < 0) return s.cycle_min_lr;  // the constructor's lr
    const Cycle c = one_cycle_shape(s);
    if (it < c.total) {
        return s.cycle_min_lr + (s.cycle_max_lr - s.cycle_min_lr) * one_cycle_scale(c, it);
    }
    if (!one_cycle_decays(s, s.decay_lr_rate)) return s.cycle_min_lr;
    const double decay_interval = (it - c.total + 1.0) / static_cast<double>(s.decay_step_size);
    return s.cycle_min_lr / (1.0 + s.decay_lr_rate * decay_interval);
}

// OneCycle.get_mom()[0][0]: inverse to the lr in the cycle, growing after it.
double one_cycle_momentum(const config::SchedulerConfig& s, double it) noexcept {
    if (it < 0) return s.cycle_min_mom;  // the constructor's betas[0]
    const Cycle c = one_cycle_shape(s);
    if (it < c.total) {
        return s.cycle_max_mom - (s.cycle_max_mom - s.cycle_min_mom) * one_cycle_scale(c, it);
    }
    if (!one_cycle_decays(s, s.decay_mom_rate)) return s.cycle_max_mom;
    const double decay_interval = (it - c.total + 1.0) / static_cast<double>(s.decay_step_size);
    return s.cycle_max_mom * (1.0 + s.decay_mom_rate * decay_interval);
}

}  // namespace

double learning_rate(const config::SchedulerConfig& s, double optimizer_lr,
                     std::uint64_t step) noexcept {
    switch (s.type) {
        case config::SchedulerType::kNone:
            return optimizer_lr;
        case config::SchedulerType::kWarmupCosineLR:
            return optimizer_lr * warmup_cosine_ratio(s, last_batch_iteration(step));
        case config::SchedulerType::kOneCycle:
            return one_cycle_lr(s, last_batch_iteration(step));
        case config::SchedulerType::kLRRangeTest:
            return lr_range_test_lr(s, last_batch_iteration(step));
        case config::SchedulerType::kWarmupLR:
        case config::SchedulerType::kWarmupDecayLR:
            break;
    }
    // WarmupLR._get_gamma / WarmupDecayLR._get_gamma, in DeepSpeed's operation order.
    const double it = last_batch_iteration(step);
    if (it < 0) return s.warmup_min_lr;  // the constructor's lr: min_lrs
    // DeepSpeed clamps the warm-up to at least 2 steps (log(1) would divide by zero).
    const double warmup = static_cast<double>(std::max<std::uint64_t>(2, s.warmup_num_steps));
    double gamma = 1.0;
    if (it < warmup) {
        gamma = s.warmup_linear ? it / warmup : (1.0 / std::log(warmup)) * std::log(it + 1.0);
    } else if (s.type == config::SchedulerType::kWarmupDecayLR) {
        const double total = static_cast<double>(s.total_num_steps);
        gamma = std::max(0.0, (total - it) / std::max(1.0, total - warmup));
    }
    return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma;
}

std::optional<double> momentum(const config::SchedulerConfig& s, std::uint64_t step) noexcept {
    if (s.type != config::SchedulerType::kOneCycle || !s.cycle_momentum) return std::nullopt;
    return one_cycle_momentum(s, last_batch_iteration(step));
}

Status check_scheduler(const config::SchedulerConfig& s) {
    const auto positive = [](std::string_view key, std::uint64_t value) -> Status {
        if (value > 0) return Status::ok();
        return Status::invalid_argument("scheduler.params." + std::string(key) +
                                        ": must be a positive integer, got " +
                                        std::to_string(value));
    };
    switch (s.type) {
        case config::SchedulerType::kNone:
            return Status::ok();
        case config::SchedulerType::kWarmupLR:
        case config::SchedulerType::kWarmupDecayLR:
        case config::SchedulerType::kWarmupCosineLR:
            return positive("warmup_num_steps", s.warmup_num_steps);
        case config::SchedulerType::kOneCycle:
            // A zero first half divides by step_ratio == 0; a zero second half is a valid shape.
            return positive("cycle_first_step_size", s.cycle_first_step_size);
        case config::SchedulerType::kLRRangeTest:
            return positive("lr_range_test_step_size", s.lr_range_test_step_size);
    }
    return Status::ok();
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
