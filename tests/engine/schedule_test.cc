// DeepSpeed's WarmupCosineLR, OneCycle and LRRangeTest schedules (and OneCycle's momentum) against
// DeepSpeed's formulas (deepspeed/runtime/lr_schedules.py), each re-derived here in plain double
// arithmetic and written another way where it can be (integer cycle positions, division instead
// of a precomputed inverse), so an implementation that copied a wrong operation would not agree
// with itself. Values are compared at 1e-12 relative: the two derivations differ only by a few
// roundings of quantities that stay far from cancellation.
//
// Step convention (learning_rate's contract): DeepSpeed's engine calls lr_scheduler.step() after
// each applied optimizer step, so optimizer step k (0-based) runs with the value DeepSpeed's
// formula gives at last_batch_iteration == k - 1, and step 0 with what the schedule's constructor
// set (WarmupLR/WarmupDecayLR warmup_min_lr, WarmupCosineLR 0, OneCycle cycle_min_lr and beta1
// cycle_min_mom, LRRangeTest lr_range_test_min_lr). The references below take DeepSpeed's
// last_batch_iteration `it`; the tests map step k to it = k - 1 (iteration_of) and check step 0
// against the constructor's value.
#include "src/engine/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
#include <vector>

namespace zinf::engine {
namespace {

using config::SchedulerConfig;
using config::SchedulerType;

void expect_rel(double actual, double expected, std::uint64_t step) {
    EXPECT_NEAR(actual, expected, 1e-12 * std::abs(expected)) << "step " << step;
}

// DeepSpeed's last_batch_iteration during optimizer step `step` >= 1 (step 0 runs with the
// constructor's value, before any scheduler.step()).
std::int64_t iteration_of(std::uint64_t step) {
    return std::int64_t(step) - 1;
}

// ---------------------------------------------------------------------------------------------
// WarmupCosineLR. DeepSpeed (get_lr_ratio, W = max(2, warmup_num_steps)):
//   if last_batch_iteration < W:
//       ratio = inverse_log_warm_up * log(last_batch_iteration + 1)     (log)
//       ratio = last_batch_iteration / W                               (linear)
//       ratio = warmup_min_ratio + ratio * (1 - warmup_min_ratio)
//   else:
//       real_last_step = last_batch_iteration - W + 1
//       real_total_steps = max(1, total_num_steps - W)
//       cosine_progress = min(1.0, real_last_step / real_total_steps)
//       ratio = (1 + cos(pi * cosine_progress)) / 2
//       ratio = max(0.0, cos_min_ratio + (1 - cos_min_ratio) * ratio)
//   lr = org_lr * ratio
struct CosineParams {
    double lr;
    std::int64_t total;
    std::int64_t warmup;
    double warmup_min_ratio;
    double cos_min_ratio;
    bool linear;
};

double reference_cosine_lr(const CosineParams& p, std::int64_t it) {
    const std::int64_t w = std::max<std::int64_t>(2, p.warmup);
    double ratio = 0;
    if (it < w) {
        const double up =
            p.linear ? double(it) / double(w) : std::log(double(it) + 1) / std::log(double(w));
        ratio = p.warmup_min_ratio + (1 - p.warmup_min_ratio) * up;
    } else {
        const double progress =
            std::min(1.0, double(it - w + 1) / double(std::max<std::int64_t>(1, p.total - w)));
        ratio =
            std::max(0.0, p.cos_min_ratio + (1 - p.cos_min_ratio) *
                                                (1 + std::cos(std::numbers::pi * progress)) / 2);
    }
    return p.lr * ratio;
}

SchedulerConfig cosine_config(const CosineParams& p) {
    SchedulerConfig s;
    s.type = SchedulerType::kWarmupCosineLR;
    s.total_num_steps = std::uint64_t(p.total);
    s.warmup_num_steps = std::uint64_t(p.warmup);
    s.warmup_min_ratio = p.warmup_min_ratio;
    s.cos_min_ratio = p.cos_min_ratio;
    s.warmup_linear = p.linear;
    return s;
}

TEST(WarmupCosineScheduleTest, FollowsDeepSpeedsFormulaAtEveryStep) {
    const std::vector<CosineParams> sets = {
        // DeepSpeed's TestWarmupCosineLR table, log warm-up (its default).
        {0.0015, 100, 10, 0.2, 0.1, false},
        {0.0015, 200, 20, 0.2, 0.1, false},
        {0.0015, 500, 30, 0.2, 0.0, false},
        {0.0015, 600, 300, 0.0, 0.1, false},
        {0.0015, 600, 550, 0.0, 0.0, false},
        // Linear warm-up.
        {3e-4, 100, 10, 0.0, 0.0001, true},
        {1.0, 1000, 37, 0.05, 0.3, true},
        // warmup_num_steps 1 is clamped to 2 (log(1) would divide by zero).
        {0.01, 50, 1, 0.1, 0.01, false},
        {0.01, 50, 1, 0.1, 0.01, true},
        // total_num_steps below and equal to the warm-up: no decay window, floor at once.
        {0.02, 5, 10, 0.1, 0.25, false},
        {0.02, 10, 10, 0.1, 0.25, true},
        // DeepSpeed's defaults (warmup 1000, cos_min_ratio 1e-4).
        {1e-3, 3000, 1000, 0.0, 0.0001, false},
    };
    for (const auto& p : sets) {
        const SchedulerConfig s = cosine_config(p);
        // Step 0: the constructor's lr, 0 (get_lr_ratio is 0 before it has started), whatever
        // warmup_min_ratio says.
        EXPECT_EQ(learning_rate(s, p.lr, 0), 0.0);
        const std::uint64_t last = std::uint64_t(std::max(p.total, p.warmup) + 51);
        for (std::uint64_t k = 1; k <= last; ++k) {
            expect_rel(learning_rate(s, p.lr, k), reference_cosine_lr(p, iteration_of(k)), k);
        }
        EXPECT_FALSE(momentum(s, 0).has_value());
    }
}

TEST(WarmupCosineScheduleTest, HandComputedPoints) {
    // Step k runs at last_batch_iteration k - 1.
    CosineParams p{2.0, 8, 4, 0.5, 0.0, true};
    const SchedulerConfig s = cosine_config(p);
    EXPECT_EQ(learning_rate(s, 2.0, 0), 0.0);  // the constructor's lr: ratio 0, not min_ratio
    EXPECT_EQ(learning_rate(s, 2.0, 1), 1.0);  // it 0: 2 * (0.5 + 0 * 0.5)
    EXPECT_EQ(learning_rate(s, 2.0, 3), 1.5);  // it 2: 2 * (0.5 + 2/4 * 0.5)
    EXPECT_DOUBLE_EQ(learning_rate(s, 2.0, 5), 2.0 * (1 + std::sqrt(0.5)) / 2);  // progress 1/4
    EXPECT_DOUBLE_EQ(learning_rate(s, 2.0, 7), 2.0 * (1 - std::sqrt(0.5)) / 2);  // progress 3/4
    EXPECT_EQ(learning_rate(s, 2.0, 8), 0.0);     // progress 1: cos(pi) = -1
    EXPECT_EQ(learning_rate(s, 2.0, 1001), 0.0);  // clamped, does not climb back
    // Log warm-up with the clamp to 2 steps: 0 at step 0, log(1)/log(2) = 0 at step 1, the top
    // at step 2, then the cosine from step 3.
    CosineParams q{1.0, 10, 1, 0.25, 0.5, false};
    EXPECT_EQ(learning_rate(cosine_config(q), 1.0, 0), 0.0);
    EXPECT_EQ(learning_rate(cosine_config(q), 1.0, 1), 0.25);
    EXPECT_DOUBLE_EQ(learning_rate(cosine_config(q), 1.0, 2), 1.0);
    EXPECT_LT(learning_rate(cosine_config(q), 1.0, 3), 1.0);
}

// DeepSpeed's own assertions (tests/unit/runtime/test_lr_schedulers.py, TestWarmupCosineLR):
// step_lrs[j] is read after j + 1 engine steps (last_batch_iteration j), so it is the lr of our
// step j + 1: step 1 is lr * warmup_min_ratio, the peak is step warmup, the end lr * cos_min_ratio
// is step total, strictly rising over steps 1..warmup and strictly falling over
// warmup + 1..total. Step 0 runs with the constructor's 0.
TEST(WarmupCosineScheduleTest, MeetsDeepSpeedsUnitTestShape) {
    const double lr = 0.0015;
    for (const CosineParams& p :
         {CosineParams{lr, 100, 10, 0.2, 0.1, false}, CosineParams{lr, 200, 20, 0.2, 0.1, false},
          CosineParams{lr, 500, 30, 0.2, 0.0, false}, CosineParams{lr, 600, 300, 0.0, 0.1, false},
          CosineParams{lr, 600, 550, 0.0, 0.0, false}}) {
        const SchedulerConfig s = cosine_config(p);
        const auto at = [&](std::int64_t k) { return learning_rate(s, lr, std::uint64_t(k)); };
        EXPECT_EQ(at(0), 0.0);
        EXPECT_NEAR(at(1), lr * p.warmup_min_ratio, 1e-7);
        EXPECT_NEAR(at(p.warmup), lr, 1e-7);
        EXPECT_NEAR(at(p.total), lr * p.cos_min_ratio, 1e-7);
        for (std::int64_t k = 1; k < p.warmup; ++k) EXPECT_LT(at(k), at(k + 1)) << k;
        for (std::int64_t k = p.warmup + 1; k < p.total; ++k) EXPECT_GT(at(k), at(k + 1)) << k;
    }
}

// DeepSpeed's test_warmup_cosine_lr_total_num_steps_equals_warmup_num_steps and
// test_warmup_cosine_lr_linear_warmup_type_produces_linear_ratios. scheduler.step(i) sets
// last_batch_iteration i, the value of our step i + 1.
TEST(WarmupCosineScheduleTest, StaysAtFloorWhenTotalStepsEqualWarmupAndWarmsLinearly) {
    const SchedulerConfig s = cosine_config({0.01, 10, 10, 0.0, 0.1, false});
    for (std::uint64_t i = 10; i < 15; ++i) {
        EXPECT_NEAR(learning_rate(s, 0.01, i + 1), 0.001, 1e-15) << i;
    }
    const SchedulerConfig lin = cosine_config({0.001, 100, 10, 0.0, 0.0001, true});
    for (std::uint64_t i = 0; i < 10; ++i) {
        EXPECT_NEAR(learning_rate(lin, 0.001, i + 1), 0.001 * double(i) / 10, 1e-18) << i;
    }
    // test_warmup_cosine_lr_initializes_all_param_groups: 0 after construction, ratio
    // log 2 / log 10 after step(1).
    const SchedulerConfig log = cosine_config({0.003, 100, 10, 0.0, 0.0001, false});
    EXPECT_EQ(learning_rate(log, 0.003, 0), 0.0);
    EXPECT_NEAR(learning_rate(log, 0.003, 2), 0.003 * std::log(2.0) / std::log(10.0), 1e-15);
}

// Both warm-ups use the same step convention: with warmup_min_ratio 0, WarmupCosineLR's warm-up
// is WarmupLR's from 0 to the optimizer's lr, step for step, from the constructors' 0 at step 0
// to the last warm-up iteration (it 19) at step 20.
TEST(WarmupCosineScheduleTest, WarmupMatchesWarmupLRStepForStep) {
    for (bool linear : {false, true}) {
        const SchedulerConfig cos = cosine_config({0.5, 100, 20, 0.0, 0.0, linear});
        SchedulerConfig warm;
        warm.type = SchedulerType::kWarmupLR;
        warm.warmup_min_lr = 0.0;
        warm.warmup_max_lr = 0.5;
        warm.warmup_num_steps = 20;
        warm.warmup_linear = linear;
        for (std::uint64_t k = 0; k <= 20; ++k) {
            expect_rel(learning_rate(cos, 0.5, k), learning_rate(warm, 123.0, k), k);
        }
        EXPECT_EQ(learning_rate(cos, 0.5, 0), 0.0);
    }
}

// ---------------------------------------------------------------------------------------------
// OneCycle. DeepSpeed (_get_scale_factor, _get_cycle_lr/_mom, _get_decay_lr/_mom):
//   total_size = first + second (second = first when None); step_ratio = first / total_size
//   batch_iteration = last_batch_iteration + 1
//   cycle phase, while last_batch_iteration < total_size:
//       x = 1 + batch_iteration / total_size - floor(1 + batch_iteration / total_size)
//       scale = x / step_ratio                       if x <= step_ratio (rising half)
//       scale = (x - 1) / (step_ratio - 1)           otherwise (falling half)
//       with stair_count > 0 for that half (second defaults to first's), from
//       cycle_iteration = batch_iteration % total_size:
//           scale = floor(cycle_iteration * stair_count / first) / stair_count      (rising)
//           scale = floor((total_size - cycle_iteration) * stair_count / second) / stair_count
//       lr = cycle_min_lr + (cycle_max_lr - cycle_min_lr) * scale
//       mom = cycle_max_mom - (cycle_max_mom - cycle_min_mom) * scale
//   decay phase (skipped, holding cycle_min_lr / cycle_max_mom, when decay_step_size or the
//   rate is 0):
//       decay_interval = (last_batch_iteration - total_size + 1) / decay_step_size
//       lr = cycle_min_lr / (1 + decay_lr_rate * decay_interval)
//       mom = cycle_max_mom * (1 + decay_mom_rate * decay_interval)
// The reference works in integer cycle positions: position in the cycle c = batch_iteration mod
// total, rising while c <= first.
struct OneCycleParams {
    double min_lr, max_lr, decay_lr_rate;
    std::int64_t first;
    std::optional<std::int64_t> second;
    std::int64_t first_stairs;
    std::optional<std::int64_t> second_stairs;
    std::int64_t decay_step_size;
    double min_mom, max_mom, decay_mom_rate;
};

struct Expected {
    double lr;
    double mom;
};

Expected reference_one_cycle(const OneCycleParams& p, std::int64_t it) {
    const std::int64_t first = p.first;
    const std::int64_t second = p.second.value_or(first);
    const std::int64_t total = first + second;
    if (it < total) {
        const std::int64_t c = (it + 1) % total;
        double scale = 0;
        if (c <= first) {
            const std::int64_t n = p.first_stairs;
            scale = n > 0 ? double(c * n / first) / double(n) : double(c) / double(first);
        } else {
            const std::int64_t n = p.second_stairs.value_or(p.first_stairs);
            scale = n > 0 ? double((total - c) * n / second) / double(n)
                          : double(total - c) / double(second);
        }
        return {p.min_lr + (p.max_lr - p.min_lr) * scale,
                p.max_mom - (p.max_mom - p.min_mom) * scale};
    }
    const double interval =
        p.decay_step_size > 0 ? double(it - total + 1) / double(p.decay_step_size) : 0;
    const bool lr_decays = p.decay_step_size > 0 && p.decay_lr_rate != 0;
    const bool mom_decays = p.decay_step_size > 0 && p.decay_mom_rate != 0;
    return {lr_decays ? p.min_lr / (1 + p.decay_lr_rate * interval) : p.min_lr,
            mom_decays ? p.max_mom * (1 + p.decay_mom_rate * interval) : p.max_mom};
}

SchedulerConfig one_cycle_config(const OneCycleParams& p, bool cycle_momentum = true) {
    SchedulerConfig s;
    s.type = SchedulerType::kOneCycle;
    s.cycle_min_lr = p.min_lr;
    s.cycle_max_lr = p.max_lr;
    s.decay_lr_rate = p.decay_lr_rate;
    s.cycle_first_step_size = std::uint64_t(p.first);
    s.cycle_second_step_size_given = p.second.has_value();
    s.cycle_second_step_size = std::uint64_t(p.second.value_or(0));
    s.cycle_first_stair_count = std::uint64_t(p.first_stairs);
    s.cycle_second_stair_count_given = p.second_stairs.has_value();
    s.cycle_second_stair_count = std::uint64_t(p.second_stairs.value_or(0));
    s.decay_step_size = std::uint64_t(p.decay_step_size);
    s.cycle_momentum = cycle_momentum;
    s.cycle_min_mom = p.min_mom;
    s.cycle_max_mom = p.max_mom;
    s.decay_mom_rate = p.decay_mom_rate;
    return s;
}

const std::vector<OneCycleParams>& one_cycle_sets() {
    static const std::vector<OneCycleParams> sets = {
        // DeepSpeed's TestOneCycle tables: symmetric, continuous, with and without decay.
        {1e-5, 1e-2, 1e-3, 10, {}, 0, {}, 10, 0.8, 0.9, 0.0},
        {1e-3, 1e-1, 0.0, 21, {}, 0, {}, 21, 0.08, 0.09, 1e-3},
        {1e-3, 1e-1, 1e-1, 21, {}, 0, {}, 21, 0.8, 0.9, 1e-3},
        {1e-5, 1e-1, 0.0, 10, {}, 0, {}, 0, 0.8, 0.9, 0.0},
        // cycle_min_lr 0 (the lr is scale * max exactly) and decay_step_size 0 with non-zero
        // rates: no decay at all.
        {0.0, 0.1, 0.5, 10, {}, 0, {}, 0, 0.85, 0.95, 0.5},
        // Asymmetric halves, second given; continuous, stairs in one half or both.
        {1e-3, 1e-2, 1e-2, 10, 21, 0, 0, 5, 0.8, 0.9, 1e-2},
        {1e-3, 1e-2, 1e-2, 10, 21, 10, 21, 5, 0.8, 0.9, 1e-2},
        {1e-3, 1e-2, 0.0, 10, 21, 2, 0, 5, 0.8, 0.9, 0.0},
        {1e-3, 1e-2, 0.0, 10, 21, 0, 3, 5, 0.8, 0.9, 0.0},
        {2e-4, 7e-3, 3e-2, 7, 5, 3, 4, 3, 0.7, 0.95, 2e-2},
        // Stairs with the second half and its stair count defaulting to the first's.
        {1e-3, 1e-2, 1e-3, 8, {}, 2, {}, 4, 0.8, 0.9, 1e-3},
        {1e-3, 1e-2, 1e-3, 9, {}, 4, {}, 4, 0.8, 0.9, 1e-3},
        // Second half given as 0: the cycle is only the rising half.
        {1e-3, 1e-1, 1e-2, 100, 0, 0, {}, 10, 0.8, 0.9, 1e-2},
        {1e-3, 1e-1, 1e-2, 12, 0, 5, {}, 10, 0.8, 0.9, 1e-2},
        // DeepSpeed's default shape (2000 steps a half), decay every 1000 steps.
        {1e-4, 1e-3, 0.1, 2000, {}, 0, {}, 1000, 0.8, 0.9, 0.01},
    };
    return sets;
}

TEST(OneCycleScheduleTest, LrFollowsDeepSpeedsFormulaAtEveryStep) {
    for (const auto& p : one_cycle_sets()) {
        const SchedulerConfig s = one_cycle_config(p);
        const std::int64_t total = p.first + p.second.value_or(p.first);
        const std::uint64_t last =
            std::uint64_t(2 * total + 3 * std::max<std::int64_t>(1, p.decay_step_size) + 11);
        // OneCycle replaces the optimizer's lr: 99.0 must not show through. Step 0: the
        // constructor's cycle_min_lr.
        EXPECT_EQ(learning_rate(s, 99.0, 0), p.min_lr);
        for (std::uint64_t k = 1; k <= last; ++k) {
            expect_rel(learning_rate(s, 99.0, k), reference_one_cycle(p, iteration_of(k)).lr, k);
        }
    }
}

TEST(OneCycleScheduleTest, MomentumFollowsDeepSpeedsFormulaAtEveryStep) {
    for (const auto& p : one_cycle_sets()) {
        const SchedulerConfig s = one_cycle_config(p);
        const std::int64_t total = p.first + p.second.value_or(p.first);
        const std::uint64_t last =
            std::uint64_t(2 * total + 3 * std::max<std::int64_t>(1, p.decay_step_size) + 11);
        // Step 0: the constructor's betas[0], cycle_min_mom (not the formula's cycle_max_mom
        // at batch_iteration 0).
        ASSERT_TRUE(momentum(s, 0).has_value());
        EXPECT_EQ(*momentum(s, 0), p.min_mom);
        for (std::uint64_t k = 1; k <= last; ++k) {
            const auto m = momentum(s, k);
            ASSERT_TRUE(m.has_value());
            expect_rel(*m, reference_one_cycle(p, iteration_of(k)).mom, k);
        }
    }
}

TEST(OneCycleScheduleTest, MomentumIsAbsentWithoutCycleMomentumOrOneCycle) {
    const auto& p = one_cycle_sets()[0];
    const SchedulerConfig off = one_cycle_config(p, /*cycle_momentum=*/false);
    for (std::uint64_t j : {0u, 5u, 50u}) {
        EXPECT_FALSE(momentum(off, j).has_value());
        // The lr does not depend on it.
        EXPECT_EQ(learning_rate(off, 1.0, j), learning_rate(one_cycle_config(p), 1.0, j));
    }
    SchedulerConfig other = one_cycle_config(p);
    for (SchedulerType t :
         {SchedulerType::kNone, SchedulerType::kWarmupLR, SchedulerType::kWarmupDecayLR,
          SchedulerType::kWarmupCosineLR, SchedulerType::kLRRangeTest}) {
        other.type = t;
        EXPECT_FALSE(momentum(other, 3).has_value());
    }
}

TEST(OneCycleScheduleTest, HandComputedPoints) {
    // Halves of 4: total 8, step_ratio 1/2. Step k is last_batch_iteration k - 1, so
    // batch_iteration k.
    OneCycleParams p{0.5, 1.5, 1.0, 4, {}, 0, {}, 2, 0.8, 0.9, 0.5};
    const SchedulerConfig s = one_cycle_config(p);
    EXPECT_EQ(learning_rate(s, 0, 0), 0.5);        // the constructor's cycle_min_lr
    EXPECT_EQ(*momentum(s, 0), 0.8);               // the constructor's betas[0]: cycle_min_mom
    EXPECT_EQ(learning_rate(s, 0, 1), 0.75);       // x = 1/8, scale 1/4
    EXPECT_EQ(learning_rate(s, 0, 2), 1.0);        // x = 1/4, scale 1/2
    EXPECT_EQ(learning_rate(s, 0, 4), 1.5);        // x = 1/2: the peak
    EXPECT_EQ(learning_rate(s, 0, 6), 1.0);        // x = 3/4, scale (3/4 - 1) / (1/2 - 1) = 1/2
    EXPECT_EQ(learning_rate(s, 0, 8), 0.5);        // batch_iteration 8: x = 0, back at the bottom
    EXPECT_EQ(learning_rate(s, 0, 9), 0.5 / 1.5);  // decay interval 1/2
    EXPECT_EQ(learning_rate(s, 0, 10), 0.25);      // decay interval 1
    EXPECT_DOUBLE_EQ(*momentum(s, 1), 0.9 - 0.1 / 4);  // back near the top after step 0
    EXPECT_EQ(*momentum(s, 4), 0.8);
    EXPECT_EQ(*momentum(s, 8), 0.9);
    EXPECT_EQ(*momentum(s, 10), 0.9 * 1.5);  // decay raises beta1, unclamped: past 1 here
    // Two stairs a half: each stair exactly two steps long from step 0, the peak only at the
    // peak.
    p.first_stairs = 2;
    const SchedulerConfig st = one_cycle_config(p);
    const double stairs[] = {0.5, 0.5, 1.0, 1.0, 1.5, 1.0, 1.0, 0.5, 0.5};
    for (std::uint64_t k = 0; k < 9; ++k) EXPECT_EQ(learning_rate(st, 0, k), stairs[k]) << k;
}

// DeepSpeed's own assertions (test_lr_schedulers.py): TestOneCycle.test_lr / test_mom (lr read
// before each engine step, so step_lrs[k] is our step k: cycle_min_lr at step 0, the peak at
// step c, rising before, falling to step 2c, decaying after), the per-group test (step(4) is the
// peak, step(9) the bottom of a 5 + 5 cycle: our steps 5 and 10), the tensor-lr contract
// (step(1) of a 10 + 10 cycle is 0.01 + 0.09 * 2/10: our step 2) and the stair tests.
// test_mom reads get_mom(), whose formula gives cycle_max_mom before the first step, but the
// optimizer then holds the constructor's betas[0], cycle_min_mom: our step 0 follows the
// optimizer, and the momentum falls from step 1 to the trough at step c.
TEST(OneCycleScheduleTest, MeetsDeepSpeedsUnitTestAssertions) {
    for (const auto& p : one_cycle_sets()) {
        if (p.second.has_value() || p.first_stairs != 0 || p.first > 100) continue;
        const SchedulerConfig s = one_cycle_config(p);
        const auto lr = [&](std::int64_t k) { return learning_rate(s, 0, std::uint64_t(k)); };
        const auto mom = [&](std::int64_t k) { return *momentum(s, std::uint64_t(k)); };
        const std::int64_t c = p.first;
        EXPECT_EQ(lr(0), p.min_lr);
        EXPECT_EQ(mom(0), p.min_mom);
        EXPECT_EQ(lr(c), p.max_lr);
        EXPECT_EQ(mom(c), p.min_mom);
        for (std::int64_t k = 0; k < c; ++k) EXPECT_LT(lr(k), lr(k + 1)) << k;
        for (std::int64_t k = 1; k < c; ++k) EXPECT_GT(mom(k), mom(k + 1)) << k;
        for (std::int64_t k = c; k < 2 * c; ++k) {
            EXPECT_GT(lr(k), lr(k + 1)) << k;
            EXPECT_LT(mom(k), mom(k + 1)) << k;
        }
        if (p.decay_lr_rate > 0 && p.decay_step_size > 0) {
            for (std::int64_t k = 2 * c; k <= 3 * c; ++k) EXPECT_GT(lr(k), lr(k + 1)) << k;
        }
    }
    const OneCycleParams g{0.001, 0.01, 0, 5, 5, 0, {}, 0, 0.8, 0.9, 0};
    EXPECT_EQ(learning_rate(one_cycle_config(g), 0, 0), 0.001);
    EXPECT_EQ(*momentum(one_cycle_config(g), 0), 0.8);
    EXPECT_NEAR(learning_rate(one_cycle_config(g), 0, 5), 0.01, 1e-15);
    EXPECT_NEAR(*momentum(one_cycle_config(g), 5), 0.8, 1e-15);
    EXPECT_NEAR(learning_rate(one_cycle_config(g), 0, 10), 0.001, 1e-15);
    EXPECT_NEAR(*momentum(one_cycle_config(g), 10), 0.9, 1e-15);
    const OneCycleParams t{0.01, 0.1, 0, 10, 10, 0, {}, 0, 0.8, 0.9, 0};
    EXPECT_EQ(learning_rate(one_cycle_config(t), 0, 0), 0.01);
    EXPECT_NEAR(learning_rate(one_cycle_config(t), 0, 2), 0.01 + (0.1 - 0.01) * 2 / 10, 1e-15);
}

// test_one_cycle_stair_count_handles_asymmetric_cycle: lrs[i] is read after i + 1
// scheduler.step() calls, so it is our step i + 1.
TEST(OneCycleScheduleTest, StairCountOfHalfLengthIsContinuousAndEachCountKeepsToItsHalf) {
    const auto lrs = [](std::int64_t first_stairs, std::optional<std::int64_t> second_stairs) {
        const OneCycleParams p{0.001, 0.01, 0, 10, 21, first_stairs, second_stairs, 0, 0.8, 0.9, 0};
        std::vector<double> out;
        for (std::uint64_t k = 1; k <= 31; ++k)
            out.push_back(learning_rate(one_cycle_config(p), 0, k));
        return out;
    };
    const auto continuous = lrs(0, 0);
    const auto aligned = lrs(10, 21);
    for (std::size_t j = 0; j < 31; ++j) expect_rel(aligned[j], continuous[j], j);
    EXPECT_NEAR(aligned[9], 0.01, 1e-15);  // the peak (step 10) is not floored a stair down
    const auto first_only = lrs(2, 0);
    const auto second_only = lrs(0, 3);
    EXPECT_FALSE(std::equal(first_only.begin(), first_only.begin() + 10, continuous.begin()));
    EXPECT_TRUE(std::equal(first_only.begin() + 10, first_only.end(), continuous.begin() + 10));
    EXPECT_TRUE(std::equal(second_only.begin(), second_only.begin() + 10, continuous.begin()));
    EXPECT_FALSE(
        std::equal(second_only.begin() + 10, second_only.begin() + 30, continuous.begin() + 10));
}

TEST(OneCycleScheduleTest, ZeroSecondHalfNeverReachesThePeak) {
    // DeepSpeed allows cycle_second_step_size 0: the lr climbs for `first` batches and, at
    // batch_iteration == first (our step 100), the cycle wraps (x = 0) back to cycle_min_lr,
    // then decays. test_one_cycle_allows_zero_second_step_size: cycle_min_lr after construction,
    // above it after three scheduler steps.
    const OneCycleParams p{0.001, 0.1, 0, 100, 0, 0, {}, 0, 0.8, 0.9, 0};
    const SchedulerConfig s = one_cycle_config(p);
    EXPECT_EQ(learning_rate(s, 0, 0), 0.001);
    EXPECT_GT(learning_rate(s, 0, 3), 0.001);
    EXPECT_NEAR(learning_rate(s, 0, 99), 0.001 + 0.099 * 99 / 100, 1e-15);
    EXPECT_EQ(learning_rate(s, 0, 100), 0.001);
    EXPECT_EQ(learning_rate(s, 0, 501), 0.001);
}

// ---------------------------------------------------------------------------------------------
// LRRangeTest. DeepSpeed:
//   interval = float(last_batch_iteration + 1) / step_size            (continuous)
//   interval = floor(float(last_batch_iteration + 1) / step_size)     (staircase)
//   lr = lr_range_test_min_lr * (1 + step_rate * interval)
struct RangeParams {
    double min_lr;
    double rate;
    std::int64_t size;
    bool staircase;
};

double reference_range_lr(const RangeParams& p, std::int64_t it) {
    const double interval =
        p.staircase ? double((it + 1) / p.size) : double(it + 1) / double(p.size);
    return p.min_lr * (1 + p.rate * interval);
}

SchedulerConfig range_config(const RangeParams& p) {
    SchedulerConfig s;
    s.type = SchedulerType::kLRRangeTest;
    s.lr_range_test_min_lr = p.min_lr;
    s.lr_range_test_step_rate = p.rate;
    s.lr_range_test_step_size = std::uint64_t(p.size);
    s.lr_range_test_staircase = p.staircase;
    return s;
}

TEST(LRRangeTestScheduleTest, FollowsDeepSpeedsFormulaAtEveryStep) {
    // DeepSpeed's TestLrRange table, then its defaults and a fast, large-rate sweep.
    const std::vector<RangeParams> sets = {
        {1e-4, 1e-5, 1, true},    {1e-5, 1e-5, 1, false},  {1e-4, 1e-3, 10, true},
        {1e-3, 1e-3, 10, false},  {1e-2, 1e-2, 19, true},  {1e-2, 1e-2, 19, false},
        {1e-3, 1.0, 2000, false}, {1e-3, 1.0, 2000, true}, {1e-6, 5.0, 3, true},
        {1e-6, 5.0, 3, false},
    };
    for (const auto& p : sets) {
        const SchedulerConfig s = range_config(p);
        // Step 0: the constructor's lr_range_test_min_lr (the optimizer's 99.0 never shows).
        EXPECT_EQ(learning_rate(s, 99.0, 0), p.min_lr);
        for (std::uint64_t k = 1; k <= std::uint64_t(5 * p.size + 51); ++k) {
            expect_rel(learning_rate(s, 99.0, k), reference_range_lr(p, iteration_of(k)), k);
        }
        EXPECT_FALSE(momentum(s, 0).has_value());
        // TestLrRange's assertions: step_lrs[k] is read before engine step k, so it is our step
        // k. It starts at lr_range_test_min_lr; with staircase every stair is exactly step_size
        // steps long (steps [n * size, (n + 1) * size) share one lr), without it the lr rises
        // every step.
        const auto lr = [&](std::uint64_t k) { return learning_rate(s, 0, k); };
        const auto size = std::uint64_t(p.size);
        for (std::uint64_t k = 0; k < 5 * size + 5; ++k) {
            if (!p.staircase || (k + 1) % size == 0) {
                EXPECT_LT(lr(k), lr(k + 1)) << k;
            } else {
                EXPECT_EQ(lr(k), lr(k + 1)) << k;  // within a stair
            }
            if (p.staircase) {
                EXPECT_EQ(lr(k), lr(k - k % size)) << k;  // stairs start at n * size
            }
        }
    }
}

TEST(LRRangeTestScheduleTest, HandComputedPoints) {
    // Step k is last_batch_iteration k - 1: interval k / step_size.
    const SchedulerConfig stairs = range_config({0.5, 2.0, 4, true});
    EXPECT_EQ(learning_rate(stairs, 0, 0), 0.5);  // the constructor's lr_range_test_min_lr
    EXPECT_EQ(learning_rate(stairs, 0, 1), 0.5);  // floor(1/4) = 0
    EXPECT_EQ(learning_rate(stairs, 0, 3), 0.5);  // floor(3/4) = 0
    EXPECT_EQ(learning_rate(stairs, 0, 4), 1.5);  // floor(4/4) = 1
    EXPECT_EQ(learning_rate(stairs, 0, 8), 2.5);  // floor(8/4) = 2
    const SchedulerConfig cont = range_config({0.5, 2.0, 4, false});
    EXPECT_EQ(learning_rate(cont, 0, 0), 0.5);   // the constructor's lr_range_test_min_lr
    EXPECT_EQ(learning_rate(cont, 0, 1), 0.75);  // 1/4
    EXPECT_EQ(learning_rate(cont, 0, 2), 1.0);   // 2/4
    // DeepSpeed's tensor-lr contract: defaults, min_lr after construction, step(1) (our step 2)
    // gives 1e-3 * (1 + 2/2000).
    EXPECT_EQ(learning_rate(range_config({1e-3, 1.0, 2000, false}), 0, 0), 1e-3);
    EXPECT_NEAR(learning_rate(range_config({1e-3, 1.0, 2000, false}), 0, 2),
                1e-3 * (1 + 2.0 / 2000), 1e-18);
}

// ---------------------------------------------------------------------------------------------
// Step 0 runs before DeepSpeed's engine has called scheduler.step() at all: each schedule gives
// what its constructor wrote into the optimizer, whatever the optimizer's own lr (and for
// OneCycle, betas[0] = cycle_min_mom, not the cycle formula's cycle_max_mom).
TEST(ScheduleStepZeroTest, StepZeroGetsEachConstructorsValue) {
    for (bool linear : {false, true}) {
        for (SchedulerType t : {SchedulerType::kWarmupLR, SchedulerType::kWarmupDecayLR}) {
            SchedulerConfig w;
            w.type = t;
            w.warmup_min_lr = 0.125;
            w.warmup_max_lr = 0.5;
            w.warmup_num_steps = 10;
            w.total_num_steps = 100;
            w.warmup_linear = linear;
            EXPECT_EQ(learning_rate(w, 7.0, 0), 0.125);  // warmup_min_lr
            EXPECT_FALSE(momentum(w, 0).has_value());
        }
        // WarmupCosineLR: get_lr_ratio is 0 before it has started, so the lr is 0 even with a
        // non-zero warmup_min_ratio (which only applies from step 1).
        const SchedulerConfig cos = cosine_config({0.003, 100, 10, 0.25, 0.1, linear});
        EXPECT_EQ(learning_rate(cos, 0.003, 0), 0.0);
        EXPECT_EQ(learning_rate(cos, 0.003, 1), 0.003 * 0.25);
        EXPECT_FALSE(momentum(cos, 0).has_value());
    }
    // OneCycle: cycle_min_lr and betas (cycle_min_mom, 0.99), for every cycle shape.
    for (const auto& p : one_cycle_sets()) {
        EXPECT_EQ(learning_rate(one_cycle_config(p), 7.0, 0), p.min_lr);
        ASSERT_TRUE(momentum(one_cycle_config(p), 0).has_value());
        EXPECT_EQ(*momentum(one_cycle_config(p), 0), p.min_mom);
        EXPECT_NE(*momentum(one_cycle_config(p), 0), p.max_mom);
        // Without cycle_momentum the constructor leaves betas alone.
        EXPECT_EQ(learning_rate(one_cycle_config(p, /*cycle_momentum=*/false), 7.0, 0), p.min_lr);
        EXPECT_FALSE(momentum(one_cycle_config(p, /*cycle_momentum=*/false), 0).has_value());
    }
    // LRRangeTest: lr_range_test_min_lr, staircase or not.
    for (bool staircase : {false, true}) {
        const SchedulerConfig r = range_config({2.5e-4, 3.0, 7, staircase});
        EXPECT_EQ(learning_rate(r, 7.0, 0), 2.5e-4);
        EXPECT_FALSE(momentum(r, 0).has_value());
    }
    // No scheduler: the optimizer's lr.
    EXPECT_EQ(learning_rate(SchedulerConfig{}, 7.0, 0), 7.0);
}

// ---------------------------------------------------------------------------------------------
// check_scheduler: only what DeepSpeed's constructors raise ValueError for.
TEST(CheckSchedulerTest, RejectsWhatDeepSpeedRejectsNamingTheKey) {
    SchedulerConfig s;
    EXPECT_TRUE(check_scheduler(s).is_ok());  // no scheduler

    s.type = SchedulerType::kLRRangeTest;
    s.lr_range_test_step_size = 0;
    Status st = check_scheduler(s);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message(),
              "scheduler.params.lr_range_test_step_size: must be a positive integer, got 0");
    s.lr_range_test_step_size = 1;
    EXPECT_TRUE(check_scheduler(s).is_ok());

    for (SchedulerType t : {SchedulerType::kWarmupLR, SchedulerType::kWarmupDecayLR,
                            SchedulerType::kWarmupCosineLR}) {
        SchedulerConfig w;
        w.type = t;
        w.warmup_num_steps = 0;
        st = check_scheduler(w);
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
        EXPECT_EQ(st.message(),
                  "scheduler.params.warmup_num_steps: must be a positive integer, got 0");
        // DeepSpeed only warns when the total is below the warm-up; 1 is clamped to 2, not refused.
        w.warmup_num_steps = 1;
        w.total_num_steps = 0;
        EXPECT_TRUE(check_scheduler(w).is_ok());
    }

    SchedulerConfig c;
    c.type = SchedulerType::kOneCycle;
    c.cycle_first_step_size = 0;
    st = check_scheduler(c);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message(),
              "scheduler.params.cycle_first_step_size: must be a positive integer, got 0");
    // A zero second half is a working shape in DeepSpeed
    // (test_one_cycle_allows_zero_second_step_size).
    c.cycle_first_step_size = 100;
    c.cycle_second_step_size = 0;
    c.cycle_second_step_size_given = true;
    EXPECT_TRUE(check_scheduler(c).is_ok());
}

}  // namespace
}  // namespace zinf::engine
