// The step-by-step scalars of training: DeepSpeed's learning-rate schedules (WarmupLR,
// WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest), OneCycle's momentum and fp16's dynamic
// loss scaler. Plain arithmetic with DeepSpeed's formulas, so a DeepSpeed config behaves the same
// here.
#pragma once

#include <cstdint>
#include <optional>

#include "src/base/config.h"
#include "src/base/status.h"

namespace zinf::engine {

// The learning rate of optimizer step `step` (0-based: the first step is 0), as DeepSpeed's
// scheduler gives it after `step` calls of scheduler.step() past construction. Without a
// scheduler, the optimizer's lr.
// DeepSpeed's engine steps the scheduler after each applied optimizer step, so every schedule
// evaluates DeepSpeed's formulas at last_batch_iteration == `step` - 1, and step 0 gets what the
// schedule's constructor sets (WarmupLR/WarmupDecayLR warmup_min_lr, WarmupCosineLR 0, OneCycle
// cycle_min_lr, LRRangeTest lr_range_test_min_lr).
// WarmupLR and WarmupDecayLR use warmup_min_lr / warmup_max_lr; WarmupCosineLR scales
// `optimizer_lr` (DeepSpeed's org_lrs) by its ratio; OneCycle and LRRangeTest ignore
// `optimizer_lr` (DeepSpeed overwrites the optimizer's lr with cycle_min_lr /
// lr_range_test_min_lr).
double learning_rate(const config::SchedulerConfig& scheduler, double optimizer_lr,
                     std::uint64_t step) noexcept;

// The momentum OneCycle gives optimizer step `step` (same step convention as learning_rate):
// DeepSpeed's OneCycle with cycle_momentum writes it into param_group['betas'][0], so for Adam,
// AdamW and Lion it is beta1. It falls from cycle_max_mom to cycle_min_mom while the lr rises,
// climbs back while the lr falls, and after the cycle grows by decay_mom_rate (unclamped: a
// large rate takes it past 1, as in DeepSpeed). nullopt for every other schedule and for
// cycle_momentum false: the optimizer keeps its configured beta1.
// DeepSpeed skips the cycling (with a warning) for an optimizer without `betas` (Adagrad); the
// caller applies it only to optimizers that have a beta1.
std::optional<double> momentum(const config::SchedulerConfig& scheduler,
                               std::uint64_t step) noexcept;

// DeepSpeed's OneCycle writes betas = (momentum, 0.99) whenever it sets the momentum: with
// cycle_momentum on, the optimizer's configured beta2 is replaced by this for the whole run.
inline constexpr double kOneCycleBeta2 = 0.99;

// The values DeepSpeed's scheduler constructors reject with a ValueError, named by key path
// ("scheduler.params.<key>: ..."): warmup_num_steps == 0 (WarmupLR, WarmupDecayLR,
// WarmupCosineLR), lr_range_test_step_size == 0, cycle_first_step_size == 0. Values DeepSpeed
// only warns about (total_num_steps < warmup_num_steps) pass.
Status check_scheduler(const config::SchedulerConfig& scheduler);

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
