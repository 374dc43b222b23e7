// The csv_monitor block: DeepSpeed's file layout (names, header, "\r\n" rows, x values in global
// samples), Python's number formatting, and the values against the losses of the same run.
#include "src/engine/csv_monitor.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "src/engine/schedule.h"
#include "tests/engine/engine_test_support.h"
#include "tests/support/test_seed.h"

namespace zinf {
namespace {

using test_support::load_config;
using test_support::small_config;

// The rows of a CSV file as DeepSpeed's writer ends them ("\r\n"); a row without it fails.
std::vector<std::string> csv_rows(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    EXPECT_TRUE(in.good()) << path << " missing";
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    std::vector<std::string> rows;
    std::size_t at = 0;
    while (at < text.size()) {
        const auto end = text.find("\r\n", at);
        EXPECT_NE(end, std::string::npos) << path << ": a row not ended by \\r\\n";
        if (end == std::string::npos) break;
        rows.push_back(text.substr(at, end - at));
        at = end + 2;
    }
    return rows;
}

TEST(CsvMonitor, NamesFilesAndHeadersAsDeepSpeed) {
    EXPECT_EQ(csv_event_file_name(kCsvTrainLoss), "Train_Samples_train_loss.csv");
    EXPECT_EQ(csv_event_file_name(kCsvLr), "Train_Samples_lr.csv");
    EXPECT_EQ(csv_event_file_name(kCsvLossScale), "Train_Samples_loss_scale.csv");
    EXPECT_EQ(csv_event_file_name("a b/c"), "a_b_c.csv");
    EXPECT_EQ(csv_event_header(kCsvTrainLoss), "train_loss");
    EXPECT_EQ(csv_event_header(kCsvEvalLoss), "eval_loss");
    EXPECT_EQ(csv_event_header("plain"), "plain");
}

TEST(CsvMonitor, WritesNumbersAsPythonsRepr) {
    EXPECT_EQ(python_float_repr(2.0), "2.0");
    EXPECT_EQ(python_float_repr(0.1), "0.1");
    EXPECT_EQ(python_float_repr(0.001), "0.001");
    EXPECT_EQ(python_float_repr(0.0001), "0.0001");
    EXPECT_EQ(python_float_repr(1e-5), "1e-05");
    EXPECT_EQ(python_float_repr(1.5e-7), "1.5e-07");
    EXPECT_EQ(python_float_repr(123.456), "123.456");
    EXPECT_EQ(python_float_repr(65536.0), "65536.0");
    EXPECT_EQ(python_float_repr(1e15), "1000000000000000.0");
    EXPECT_EQ(python_float_repr(1e16), "1e+16");
    EXPECT_EQ(python_float_repr(1.2345e100), "1.2345e+100");
    EXPECT_EQ(python_float_repr(-0.5), "-0.5");
    EXPECT_EQ(python_float_repr(0.0), "0.0");
    EXPECT_EQ(python_float_repr(-0.0), "-0.0");
    // A float32 loss read back as a double (torch's .item()).
    EXPECT_EQ(python_float_repr(static_cast<double>(2.3025851f)), "2.3025851249694824");
}

// Trains `steps` steps with the csv_monitor on and returns every micro-step's loss.
std::vector<float> train_with_monitor(const std::string& dir, std::uint64_t steps,
                                      std::vector<std::string> overrides) {
    overrides.push_back("csv_monitor.enabled=true");
    overrides.push_back("csv_monitor.output_path=\"" + dir + "\"");
    overrides.push_back("csv_monitor.job_name=\"job\"");
    test_support::Trainer t(load_config(small_config(), std::move(overrides)));
    TrainerOptions o;
    o.max_steps = steps;
    o.evaluate_each_epoch = false;
    auto trainer = Trainer::create(t.engine(), *t.dataset, nullptr, o);
    EXPECT_TRUE(trainer.has_value()) << trainer.status().to_string();
    std::vector<float> losses;
    if (!trainer.has_value()) return losses;
    test_support::LossCollector collector(losses);
    auto summary = trainer->run(collector);
    EXPECT_TRUE(summary.has_value()) << summary.status().to_string();
    return losses;
}

TEST(CsvMonitor, RowsHoldTheRunsLossesAndRatesAtDeepSpeedsSamples) {
    test::TempDir dir("csv-monitor");
    // WarmupLR, so that the rate changes every step and "the next step's rate" is checked.
    const std::vector<float> losses =
        train_with_monitor(dir.path(), 5,
                           {"scheduler.type=\"WarmupLR\"", "scheduler.params.warmup_num_steps=10",
                            "scheduler.params.warmup_max_lr=0.01"});
    ASSERT_EQ(losses.size(), 5u);
    const std::string job = dir.path() + "/job/";
    const auto loss_rows = csv_rows(job + "Train_Samples_train_loss.csv");
    ASSERT_EQ(loss_rows.size(), 6u);
    EXPECT_EQ(loss_rows[0], "step,train_loss");
    const auto lr_rows = csv_rows(job + "Train_Samples_lr.csv");
    ASSERT_EQ(lr_rows.size(), 6u);
    EXPECT_EQ(lr_rows[0], "step,lr");
    config::SchedulerConfig s;
    s.type = config::SchedulerType::kWarmupLR;
    s.warmup_num_steps = 10;
    s.warmup_max_lr = 0.01;
    for (std::size_t k = 1; k <= 5; ++k) {
        // train_loss is written before the step counts its 16 samples; lr after, with the rate
        // the scheduler set for the next step.
        EXPECT_EQ(loss_rows[k], std::to_string(16 * (k - 1)) + "," +
                                    python_float_repr(static_cast<double>(losses[k - 1])));
        EXPECT_EQ(lr_rows[k], std::to_string(16 * k) + "," +
                                  python_float_repr(engine::learning_rate(s, 0.01, k)));
    }
    // No fp16: no loss_scale file; no evaluation: no eval_loss file.
    EXPECT_FALSE(std::ifstream(job + "Train_Samples_loss_scale.csv").good());
    EXPECT_FALSE(std::ifstream(job + "Train_Samples_eval_loss.csv").good());
}

TEST(CsvMonitor, TrainLossSumsTheWindowsLossesOverAccumulationInFloat32) {
    test::TempDir dir("csv-monitor-gas");
    const std::vector<float> losses =
        train_with_monitor(dir.path(), 3, {"gradient_accumulation_steps=2", "fp16.enabled=true"});
    ASSERT_EQ(losses.size(), 6u);
    const auto rows = csv_rows(dir.path() + "/job/Train_Samples_train_loss.csv");
    ASSERT_EQ(rows.size(), 4u);
    for (std::size_t k = 1; k <= 3; ++k) {
        const float window = losses[2 * k - 2] / 2.0f + losses[2 * k - 1] / 2.0f;
        EXPECT_EQ(rows[k], std::to_string(32 * (k - 1)) + "," +
                               python_float_repr(static_cast<double>(window)));
    }
    // fp16: the scale, a Python int (2^16) while it has not changed.
    const auto scale = csv_rows(dir.path() + "/job/Train_Samples_loss_scale.csv");
    ASSERT_EQ(scale.size(), 4u);
    EXPECT_EQ(scale[0], "step,loss_scale");
    EXPECT_EQ(scale[1].substr(0, 3), "32,");
}

TEST(CsvMonitor, AnUnwritableDirectoryFailsBeforeTraining) {
    test::TempDir dir("csv-monitor-bad");
    { std::ofstream file(dir.path() + "/file"); }
    test_support::Trainer t(load_config(
        small_config(),
        {"csv_monitor.enabled=true", "csv_monitor.output_path=\"" + dir.path() + "/file\""}));
    auto trainer = Trainer::create(t.engine(), *t.dataset, nullptr, TrainerOptions{});
    ASSERT_FALSE(trainer.has_value());
    EXPECT_NE(trainer.error().message().find("csv_monitor.output_path"), std::string::npos)
        << trainer.error().to_string();
}

TEST(CsvMonitorConfig, TakesDeepSpeedsKeysAndDefaultsAndRefusesOthers) {
    const auto defaults = load_config(small_config(R"("csv_monitor": {"enabled": true},)"));
    EXPECT_TRUE(defaults.csv_monitor.enabled);
    EXPECT_EQ(defaults.csv_monitor.output_path, "");
    EXPECT_EQ(defaults.csv_monitor.job_name, "DeepSpeedJobName");
    EXPECT_TRUE(defaults.warnings.empty());  // implemented: no "not implemented" warning
    config::LoadOptions o;
    o.log_warnings = false;
    auto typo = config::load_from_string(small_config(R"("csv_monitor": {"job_nme": "x"},)"), o);
    ASSERT_FALSE(typo.has_value());
    EXPECT_NE(typo.error().message().find("did you mean 'csv_monitor.job_name'"), std::string::npos)
        << typo.error().to_string();
    auto bad = config::load_from_string(small_config(R"("csv_monitor": {"output_path": 3},)"), o);
    ASSERT_FALSE(bad.has_value());
    EXPECT_NE(bad.error().message().find("csv_monitor.output_path: expected string"),
              std::string::npos)
        << bad.error().to_string();
}

}  // namespace
}  // namespace zinf
