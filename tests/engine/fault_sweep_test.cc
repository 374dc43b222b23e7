// Faults end cleanly everywhere: a fail-Nth sweep through whole training steps with parameters
// and optimizer states on NVMe, checkpoint saves and a load included. For every n the scenario
// reaches — the n-th I/O piece (io::FaultPlan) or the n-th file call (io::FaultyFileSystem:
// open, mkdir, fallocate, fsync, rename, write, read) — the injected fault surfaces as exactly
// one clean error naming the file (and, for a piece, the offset); nothing hangs; the run leaves
// no swap file and no locked memory behind; and the last complete checkpoint resumes bitwise.
// Both with checkpoints written in the foreground and with the optimizer states copied in the
// background (swap.background_checkpoint).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "src/engine/checkpoint_files.h"
#include "tests/engine/engine_test_support.h"
#include "tests/support/test_seed.h"

namespace zinf {
namespace {

using test_support::kNvmeZero;
using test_support::load_config;
using test_support::small_config;
using test_support::with_nvme;

// Locked memory of this process (VmLck, KiB): a leaked pinned pool would keep it up.
long locked_kib() {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
        if (line.rfind("VmLck:", 0) == 0) return std::stol(line.substr(6));
    }
    return -1;
}

struct Outcome {
    Status error;                          // the first error, or OK when the scenario completed
    std::vector<float> losses;             // every micro-step before it
    std::uint64_t io_faults_injected = 0;  // by the engine's FaultyBackend
};

// The scenario: 2 steps, save "a", 1 step, save "b", load "a", 1 step. Stops at the first error.
Outcome run_scenario(const config::EngineConfig& config, const EngineOptions& options,
                     const std::string& ckpt) {
    Outcome o;
    auto stack = TrainingStack::create(config, options);
    if (!stack.has_value()) {
        o.error = stack.error();
        o.io_faults_injected = options.io_faults.has_value() ? 1 : 0;  // it failed creating
        return o;
    }
    test_support::Trainer t(config, std::move(stack));
    auto steps = [&](std::uint64_t n) -> Status {
        for (std::uint64_t s = 0; s < n; ++s) {
            auto r = t.try_step();
            if (!r.has_value()) return r.error();
            o.losses.push_back(*r);
        }
        return Status::ok();
    };
    Status s = steps(2);
    if (s.is_ok()) s = t.engine().save_checkpoint(ckpt, "a");
    if (s.is_ok()) s = steps(1);
    if (s.is_ok()) s = t.engine().save_checkpoint(ckpt, "b");
    if (s.is_ok()) s = t.engine().load_checkpoint(ckpt, "a");
    if (s.is_ok()) s = steps(1);
    o.error = s;
    o.io_faults_injected = t.engine().io_figures().faults_injected;
    return o;
}

// The loss of one step after loading checkpoint `tag` of `dir` into a fault-free engine.
float loss_after_loading(const config::EngineConfig& config, const std::string& dir,
                         const std::string& tag) {
    test_support::Trainer t(config);
    const Status s = t.engine().load_checkpoint(dir, tag);
    ZINF_ASSERT_MSG(s.is_ok(), s.to_string());
    return t.run(1).front();
}

std::vector<std::string> entries(const std::string& dir) {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
        out.push_back(e.path().filename());
    }
    return out;
}

// The parameter: swap.background_checkpoint (the optimizer states' copy runs on a thread of its
// own, beside the next step, and commits when done; its faults surface at the next save or load).
class FaultSweep : public ::testing::TestWithParam<bool> {
protected:
    void SetUp() override {
        const std::string background =
            GetParam() ? R"( "swap": {"background_checkpoint": true},)" : "";
        config_ =
            load_config(with_nvme(small_config(std::string(kNvmeZero) + background), swap_.path()));
        // The references: the scenario without faults, and a step after loading each tag.
        const Outcome clean = run_scenario(config_, {}, ref_.path());
        ASSERT_TRUE(clean.error.is_ok()) << clean.error.to_string();
        after_["a"] = loss_after_loading(config_, ref_.path(), "a");
        after_["b"] = loss_after_loading(config_, ref_.path(), "b");
        locked_baseline_ = locked_kib();
    }

    // After a faulty run: nothing left in the swap directory but its lock, no locked memory
    // held, and `latest` (if any) a complete checkpoint that resumes bitwise.
    void expect_clean_aftermath(const std::string& what) {
        EXPECT_EQ(entries(swap_.path()), std::vector<std::string>{"zinfinity-swap.lock"}) << what;
        EXPECT_EQ(locked_kib(), locked_baseline_) << what;
        auto latest = engine::read_latest_tag(io::posix_file_system(), ckpt_.path());
        if (!latest.has_value()) {
            EXPECT_EQ(latest.error().code(), StatusCode::kNotFound) << what;
            return;
        }
        ASSERT_TRUE(after_.count(*latest)) << what << ": latest " << *latest;
        EXPECT_EQ(test_support::bits(
                      std::vector<float>{loss_after_loading(config_, ckpt_.path(), *latest)}),
                  test_support::bits(std::vector<float>{after_[*latest]}))
            << what << ": resuming " << *latest;
    }

    test::TempDir swap_{"sweep-swap"};
    test::TempDir ckpt_{"sweep-ckpt"};
    test::TempDir ref_{"sweep-ref"};
    config::EngineConfig config_;
    std::map<std::string, float> after_;
    long locked_baseline_ = 0;
};

TEST_P(FaultSweep, EveryIoPieceFailedEndsInOneCleanErrorAndTheLastCheckpointResumes) {
    std::uint64_t reached = 0;
    for (std::uint64_t n = 1; n < 100000; ++n) {
        std::filesystem::remove_all(ckpt_.path());
        std::filesystem::create_directories(ckpt_.path());
        io::FaultPlan plan;
        plan.fail_nth_op = n;
        EngineOptions options;
        options.io_faults = plan;
        const Outcome o = run_scenario(config_, options, ckpt_.path());
        if (o.io_faults_injected == 0) {  // past the scenario's last piece
            EXPECT_TRUE(o.error.is_ok()) << o.error.to_string();
            break;
        }
        reached = n;
        ASSERT_EQ(o.io_faults_injected, 1u) << "piece " << n;
        ASSERT_FALSE(o.error.is_ok()) << "piece " << n << ": the injected fault was lost";
        const std::string what = str_cat("piece ", n, ": ", o.error.to_string());
        EXPECT_EQ(o.error.errno_value(), EIO) << what;
        EXPECT_TRUE(o.error.is_injected()) << what;
        EXPECT_NE(o.error.message().find(swap_.path()), std::string::npos) << what;
        EXPECT_NE(o.error.message().find(" offset "), std::string::npos) << what;
        expect_clean_aftermath(what);
        if (HasFailure()) return;
    }
    std::printf("[ sweep    ] %llu I/O pieces failed in turn\n",
                static_cast<unsigned long long>(reached));
    EXPECT_GT(reached, 50u);
}

TEST_P(FaultSweep, EveryFileCallFailedEndsInOneCleanErrorAndTheLastCheckpointResumes) {
    std::uint64_t reached = 0;
    for (std::uint64_t n = 1; n < 10000; ++n) {
        std::filesystem::remove_all(ckpt_.path());
        std::filesystem::create_directories(ckpt_.path());
        io::FileFaultPlan plan;
        plan.fail_nth_op = n;
        // Removals are cleanup after an error or of a previous run: what fails there is logged.
        plan.ops = io::kAllFileOps & ~static_cast<std::uint32_t>(io::FileOp::kRemove);
        plan.errno_to_inject = n % 2 == 0 ? ENOSPC : EIO;
        io::FaultyFileSystem faulty(io::posix_file_system(), plan);
        EngineOptions options;
        options.file_system = &faulty;
        const Outcome o = run_scenario(config_, options, ckpt_.path());
        if (faulty.faults_injected() == 0) {
            EXPECT_TRUE(o.error.is_ok()) << o.error.to_string();
            break;
        }
        reached = n;
        const std::string what = str_cat("file call ", n, ": ", o.error.to_string());
        ASSERT_FALSE(o.error.is_ok()) << "file call " << n << ": the injected fault was lost";
        EXPECT_EQ(o.error.errno_value(), plan.errno_to_inject) << what;
        EXPECT_TRUE(o.error.is_injected()) << what;
        const bool names_a_file = o.error.message().find(swap_.path()) != std::string::npos ||
                                  o.error.message().find(ckpt_.path()) != std::string::npos;
        EXPECT_TRUE(names_a_file) << what;
        expect_clean_aftermath(what);
        if (HasFailure()) return;
    }
    std::printf("[ sweep    ] %llu file calls failed in turn\n",
                static_cast<unsigned long long>(reached));
    EXPECT_GT(reached, 20u);
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, FaultSweep, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& param) {
                             return param.param ? "InTheBackground" : "InTheForeground";
                         });

}  // namespace
}  // namespace zinf
