// Trainer: the loop's cadences (prints, checkpoints, epoch evaluations, accumulation windows),
// a resumed run continuing bitwise, prediction, and its errors.
#include "src/engine/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/engine/engine_test_support.h"
#include "tests/support/test_seed.h"

namespace zinf {
namespace {

using test_support::load_config;
using test_support::small_config;

// Records what the trainer reports.
struct Recorder final : TrainerObserver {
    std::vector<std::uint64_t> micro_steps;
    std::vector<float> losses;
    std::vector<std::uint64_t> steps;
    std::vector<std::uint64_t> printed;
    std::vector<std::uint64_t> evaluated_epochs;
    std::vector<std::string> checkpoints;
    Status on_micro_step(std::uint64_t micro_step, float loss) override {
        micro_steps.push_back(micro_step);
        losses.push_back(loss);
        return Status::ok();
    }
    void on_step(std::uint64_t step, std::uint64_t, float, double) override {
        steps.push_back(step);
    }
    void on_print(const PrintFigures& f) override { printed.push_back(f.step); }
    void on_evaluation(std::uint64_t epoch, double, bool) override {
        evaluated_epochs.push_back(epoch);
    }
    void on_checkpoint(const std::string&, const std::string& tag) override {
        checkpoints.push_back(tag);
    }
};

// An engine and its synthetic data (256 samples: 16 micro-batches of 16 per epoch).
struct Rig {
    explicit Rig(std::vector<std::string> overrides)
        : t(load_config(small_config(), std::move(overrides))) {}
    Result<Trainer> trainer(const TrainerOptions& o) {
        return Trainer::create(t.engine(), *t.dataset, nullptr, o);
    }
    test_support::Trainer t;
};

TEST(Trainer, PrintsSavesAndEvaluatesOnItsCadences) {
    test::TempDir dir("trainer");
    Rig rig({"steps_per_print=4", "data.epochs=3", "gradient_accumulation_steps=2"});
    TrainerOptions o;
    o.max_steps = 19;  // 8 steps per epoch: two whole epochs and 3 steps of the third
    o.save_dir = dir.path();
    o.save_every = 6;
    auto trainer = rig.trainer(o);
    ASSERT_TRUE(trainer.has_value()) << trainer.status().to_string();
    EXPECT_EQ(trainer->steps_per_epoch(), 8u);
    EXPECT_EQ(trainer->total_steps(), 19u);
    Recorder r;
    auto summary = trainer->run(r);
    ASSERT_TRUE(summary.has_value()) << summary.status().to_string();
    EXPECT_EQ(summary->steps_run, 19u);
    EXPECT_EQ(r.micro_steps.size(), 38u);  // two micro-steps per step
    EXPECT_EQ(r.micro_steps.back(), 38u);
    EXPECT_EQ(r.steps.size(), 19u);
    EXPECT_EQ(r.printed, (std::vector<std::uint64_t>{4, 8, 12, 16}));
    EXPECT_EQ(r.checkpoints, (std::vector<std::string>{"global_step6", "global_step12",
                                                       "global_step18", "global_step19"}));
    // After epochs 1 and 2, and of the trained model at the end of the partial third.
    EXPECT_EQ(r.evaluated_epochs, (std::vector<std::uint64_t>{0, 1, 2}));
    ASSERT_TRUE(summary->accuracy.has_value());
    EXPECT_FALSE(summary->accuracy_on_test);  // no test set: evaluated on train
    EXPECT_EQ(std::move(engine::read_latest_tag(io::posix_file_system(), dir.path())).value(),
              "global_step19");
}

TEST(Trainer, NoEvaluationWhenAskedNot) {
    Rig rig({"data.epochs=2"});
    TrainerOptions o;
    o.evaluate_each_epoch = false;
    auto trainer = rig.trainer(o);
    Recorder r;
    auto summary = trainer->run(r);
    ASSERT_TRUE(summary.has_value());
    EXPECT_TRUE(r.evaluated_epochs.empty());
    EXPECT_FALSE(summary->accuracy.has_value());
    EXPECT_EQ(summary->steps_run, 32u);
}

TEST(Trainer, AResumedRunContinuesBitwise) {
    test::TempDir dir("trainer");
    std::vector<float> straight;
    {
        Rig rig({"data.epochs=2"});
        TrainerOptions o;
        o.max_steps = 20;
        o.evaluate_each_epoch = false;
        Recorder r;
        ASSERT_TRUE(rig.trainer(o)->run(r).has_value());
        straight = r.losses;
    }
    std::vector<float> resumed;
    {
        Rig rig({"data.epochs=2"});
        TrainerOptions o;
        o.max_steps = 7;
        o.evaluate_each_epoch = false;
        o.save_dir = dir.path();
        Recorder r;
        ASSERT_TRUE(rig.trainer(o)->run(r).has_value());
        resumed = r.losses;
    }
    Rig rig({"data.epochs=2"});
    ASSERT_TRUE(rig.t.engine().load_checkpoint(dir.path(), "global_step7"));
    TrainerOptions o;
    o.max_steps = 20;
    o.evaluate_each_epoch = false;
    Recorder r;
    auto summary = rig.trainer(o)->run(r);
    ASSERT_TRUE(summary.has_value());
    EXPECT_EQ(summary->steps_run, 13u);
    resumed.insert(resumed.end(), r.losses.begin(), r.losses.end());
    EXPECT_EQ(test_support::bits(resumed), test_support::bits(straight));
}

TEST(Trainer, PredictsDistinctSamplesWithTheirLabels) {
    Rig rig({});
    auto trainer = rig.trainer(TrainerOptions{});
    auto predictions = trainer->predict(20, 5);
    ASSERT_TRUE(predictions.has_value()) << predictions.status().to_string();
    ASSERT_EQ(predictions->size(), 20u);
    std::vector<std::uint32_t> seen;
    for (const auto& p : *predictions) {
        std::vector<float> x(24);
        std::vector<std::int32_t> y(1);
        rig.t.dataset->gather(std::span<const std::uint32_t>(&p.index, 1), x, y);
        EXPECT_EQ(p.label, y[0]);
        EXPECT_EQ(p.inputs, x);
        EXPECT_GE(p.predicted, 0);
        EXPECT_LT(p.predicted, 4);
        seen.push_back(p.index);
    }
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end());
    // Prediction agrees with evaluation: the fraction right over the whole set.
    auto all = trainer->predict(256, 1);
    std::size_t right = 0;
    for (const auto& p : *all) right += p.predicted == p.label ? 1 : 0;
    EXPECT_DOUBLE_EQ(static_cast<double>(right) / 256.0, std::move(trainer->evaluate()).value());
}

TEST(Trainer, AnEpochShorterThanOneAccumulationWindowIsRefused) {
    Rig rig({"gradient_accumulation_steps=32"});
    auto trainer = rig.trainer(TrainerOptions{});
    ASSERT_FALSE(trainer.has_value());
    EXPECT_NE(trainer.error().message().find("gradient_accumulation_steps: 32"), std::string::npos)
        << trainer.error().to_string();
}

}  // namespace
}  // namespace zinf
