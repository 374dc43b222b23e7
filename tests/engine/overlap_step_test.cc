// swap.overlap_step: the optimizer step taken beside the window's last backward, speculatively
// on copy-on-write NVMe states, gives bitwise the losses and parameters of the sequential step
// — with clipping that triggers on some steps (redone from the intact states), fp16 overflow
// steps (discarded), accumulation, fp32 / bf16 / fp16 parameters, and parameters on the device,
// in host memory and on NVMe. Each run also proves the speculation happened: steps committed
// from it, and redone or skipped where the norm said so.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "src/engine/engine.h"
#include "tests/engine/engine_test_support.h"
#include "tests/support/test_seed.h"

namespace zinf {
namespace {

using test_support::bits;
using test_support::load_config;
using test_support::small_config;
using test_support::Trainer;
using test_support::with_nvme;

struct Case {
    const char* name;
    const char* zero;   // the zero_optimization block ("@NVME@": the swap directory)
    const char* extra;  // dtype and the like
    int accumulation = 1;
};

const Case kCases[] = {
    {"stage3 fp32, parameters on the device",
     R"("zero_optimization": {"stage": 3, "sub_group_size": 96,)"
     R"( "stage3_param_persistence_threshold": 0, "offload_optimizer": {"device": "nvme",)"
     R"( "nvme_path": "@NVME@", "stream_gradients": false}},)",
     ""},
    {"stage3 bf16, parameters on NVMe, accumulation 2",
     R"("zero_optimization": {"stage": 3, "sub_group_size": 96,)"
     R"( "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 64,)"
     R"( "stage3_max_live_parameters": 1024,)"
     R"( "offload_param": {"device": "nvme", "nvme_path": "@NVME@", "buffer_count": 3,)"
     R"( "buffer_size": 1024, "max_in_cpu": 2048},)"
     R"( "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@",)"
     R"( "stream_gradients": false}},)",
     R"("bf16": {"enabled": true},)", 2},
    {"stage3 bf16, parameters in host memory",
     R"("zero_optimization": {"stage": 3, "sub_group_size": 128,)"
     R"( "stage3_param_persistence_threshold": 20, "offload_param": {"device": "cpu"},)"
     R"( "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@",)"
     R"( "stream_gradients": false}},)",
     R"("bf16": {"enabled": true},)"},
    {"stage2 fp16 with overflows",
     R"("zero_optimization": {"stage": 2, "sub_group_size": 200,)"
     R"( "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@",)"
     R"( "stream_gradients": false}},)",
     R"("fp16": {"enabled": true, "initial_scale_power": 24, "hysteresis": 1,)"
     R"( "loss_scale_window": 3},)"},
};

constexpr std::uint64_t kSteps = 14;

struct TrainedRun {
    std::vector<std::uint32_t> losses;
    std::vector<std::uint32_t> master;
    std::vector<double> norms;  // per optimizer step
    engine::OverlapCounts counts;
    bool overlap_counts = false;
};

TrainedRun train(const Case& c, bool overlap, double clipping, bool every_window = true) {
    test::TempDir nvme("overlap");
    const std::string text = with_nvme(small_config(std::string(c.zero) + c.extra), nvme.path());
    const config::EngineConfig config =
        load_config(text, {str_cat("swap.overlap_step=", overlap ? "true" : "false"),
                           str_cat("gradient_clipping=", clipping),
                           str_cat("gradient_accumulation_steps=", c.accumulation)});
    // A backward far slower than the states' I/O: a step that did not wait for each sub-group's
    // gradients would read them before they are final.
    EngineOptions options;
    options.speculate_every_window = every_window;
    options.after_gradient = [](std::size_t) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    };
    Trainer t(config, TrainingStack::create(config, options));
    EXPECT_EQ(t.engine().plan().overlap_step, overlap) << t.engine().plan().overlap_step_reason;
    TrainedRun r;
    std::vector<float> losses;
    for (std::uint64_t s = 0; s < kSteps; ++s) {
        const std::vector<float> l = t.run(1);
        losses.insert(losses.end(), l.begin(), l.end());
        r.norms.push_back(t.engine().last_step().grad_norm);
    }
    r.losses = bits(losses);
    auto master = t.engine().master_parameters();
    EXPECT_TRUE(master.has_value());
    if (master.has_value()) r.master = bits(*master);
    if (const auto* counts = t.engine().overlap_counts(); counts != nullptr) {
        r.counts = *counts;
        r.overlap_counts = true;
    }
    return r;
}

TEST(OverlapStep, StepsBesideBackwardAreBitwiseTheSequentialOnes) {
    for (const Case& c : kCases) {
        SCOPED_TRACE(c.name);
        // A clipping threshold that the norms cross: the median of an unclipped run's.
        std::vector<double> norms = train(c, false, 0.0).norms;
        std::erase_if(norms, [](double n) { return !std::isfinite(n); });
        ASSERT_GE(norms.size(), 4u);
        std::sort(norms.begin(), norms.end());
        const double clipping = norms[norms.size() / 2];
        const TrainedRun sequential = train(c, false, clipping);
        const TrainedRun overlapped = train(c, true, clipping);
        EXPECT_FALSE(sequential.overlap_counts);
        ASSERT_TRUE(overlapped.overlap_counts);
        EXPECT_EQ(overlapped.losses, sequential.losses);
        EXPECT_EQ(overlapped.master, sequential.master);
        EXPECT_EQ(overlapped.norms, sequential.norms);  // bitwise (inf on overflow steps)
        const engine::OverlapCounts& n = overlapped.counts;
        // The thread took parts of the norm beside backward (the bitwise norms above show they
        // are the engine's own).
        EXPECT_GT(n.norm_partials, 0u) << "every partial of the norm was taken after backward";
        // The first window records the order; every later one speculates.
        EXPECT_EQ(n.recorded, 1u);
        EXPECT_EQ(n.committed + n.redone + n.skipped + n.abandoned, kSteps - 1);
        EXPECT_EQ(n.abandoned, 0u);
        EXPECT_GT(n.committed, 0u) << "no speculated step stood";
        EXPECT_GT(n.redone, 0u) << "clipping never redid a step";
        const bool fp16 = std::string(c.extra).find("fp16") != std::string::npos;
        if (fp16) {
            EXPECT_GT(n.skipped, 0u) << "no overflow discarded a step";
        } else {
            EXPECT_EQ(n.skipped, 0u);
        }
    }
}

// The default policy: after a step that clipped, the next window steps after backward (no
// speculated I/O wasted on a run of clipped steps); with no clipping every window after the
// recorded one commits its speculation.
TEST(OverlapStep, AfterAClippedStepTheNextStepsAfterBackward) {
    const Case& c = kCases[0];
    const TrainedRun clipped = train(c, true, 1e-6, false);
    EXPECT_EQ(clipped.losses, train(c, false, 1e-6).losses);
    EXPECT_EQ(clipped.counts.recorded, 1u);
    EXPECT_EQ(clipped.counts.not_speculated, kSteps - 1);
    EXPECT_EQ(clipped.counts.committed + clipped.counts.redone, 0u);
    const TrainedRun free = train(c, true, 0.0, false);
    EXPECT_EQ(free.losses, train(c, false, 0.0).losses);
    EXPECT_EQ(free.counts.committed, kSteps - 1);
    EXPECT_EQ(free.counts.not_speculated, 0u);
}

// Reading the master parameters between the last backward and the step (a speculation under
// way) forgets the speculation first: the read sees the states before the step, the step is
// then taken after backward, and the run stays bitwise the sequential one.
TEST(OverlapStep, ReadingTheStatesMidWindowForgetsTheSpeculation) {
    const Case& c = kCases[0];
    auto run = [&](bool overlap, engine::OverlapCounts* counts) {
        test::TempDir nvme("overlap");
        const config::EngineConfig config = load_config(
            with_nvme(small_config(std::string(c.zero) + c.extra), nvme.path()),
            {str_cat("swap.overlap_step=", overlap ? "true" : "false"), "gradient_clipping=0"});
        EngineOptions options;
        options.speculate_every_window = true;
        Trainer t(config, TrainingStack::create(config, options));
        std::vector<std::uint32_t> read;
        t.before_step = [&](std::uint64_t micro) {
            if (micro != 4) return;
            auto master = t.engine().master_parameters();
            ASSERT_TRUE(master.has_value()) << master.error().to_string();
            read = bits(*master);
        };
        std::vector<std::uint32_t> losses = bits(t.run(8));
        if (counts != nullptr) *counts = *t.engine().overlap_counts();
        EXPECT_FALSE(read.empty());
        losses.insert(losses.end(), read.begin(), read.end());
        auto master = t.engine().master_parameters();
        EXPECT_TRUE(master.has_value());
        if (master.has_value()) {
            const std::vector<std::uint32_t> last = bits(*master);
            losses.insert(losses.end(), last.begin(), last.end());
        }
        return losses;
    };
    engine::OverlapCounts counts;
    EXPECT_EQ(run(true, &counts), run(false, nullptr));
    EXPECT_EQ(counts.abandoned, 1u);
    EXPECT_EQ(counts.committed, 6u);
}

// Publishing a committed step replaces each offloaded parameter's slice whole: nothing is read
// from NVMe for it (before, each slice in neither tier was read, then overwritten). The device
// and host tiers here hold 16 KiB each of the 20.5 KiB of parameters (three 64 x 64 weights of
// 8 KiB), so such reads would show.
TEST(OverlapStep, PublishingReplacesParametersOnNvmeWithoutReadingThem) {
    test::TempDir nvme("overlap");
    std::string text =
        small_config(R"("zero_optimization": {"stage": 3, "sub_group_size": 96,)"
                     R"( "stage3_param_persistence_threshold": 0,)"
                     R"( "stage3_prefetch_bucket_size": 64, "stage3_max_live_parameters": 8192,)"
                     R"( "offload_param": {"device": "nvme", "nvme_path": "@NVME@",)"
                     R"( "buffer_count": 3, "buffer_size": 4096, "max_in_cpu": 8192},)"
                     R"( "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@",)"
                     R"( "stream_gradients": false}}, "bf16": {"enabled": true},)");
    const std::string layers = "[24, 32, 16, 4]";
    ASSERT_NE(text.find(layers), std::string::npos);
    text.replace(text.find(layers), layers.size(), "[24, 64, 64, 64, 4]");
    const config::EngineConfig config = load_config(
        with_nvme(text, nvme.path()), {"swap.overlap_step=true", "gradient_clipping=0"});
    EngineOptions options;
    options.speculate_every_window = true;
    Trainer t(config, TrainingStack::create(config, options));
    ASSERT_TRUE(t.engine().plan().overlap_step) << t.engine().plan().overlap_step_reason;
    // The parameter tiers' bytes read from NVMe (the optimizer states' reads, which a step may
    // still be finishing, are not in it).
    auto parameter_bytes_read = [&]() -> std::uint64_t {
        const std::string summary = t.engine().residency_summary();
        const auto at = summary.find("swapped in ");
        EXPECT_NE(at, std::string::npos) << summary;
        return at == std::string::npos ? 0 : std::stoull(summary.substr(at + 11));
    };
    // The summary's "taken N": staged parameters copied from the published buffer.
    auto staged_taken = [&]() -> std::uint64_t {
        const std::string summary = t.engine().residency_summary();
        const auto at = summary.find("(taken ");
        EXPECT_NE(at, std::string::npos) << summary;
        return at == std::string::npos ? 0 : std::stoull(summary.substr(at + 7));
    };
    std::uint64_t read_before_step = 0;
    std::uint64_t read_before_forward = 0;
    std::uint64_t read_by_forward = 0;
    t.before_step = [&](std::uint64_t) { read_before_step = parameter_bytes_read(); };
    t.after_forward = [&](std::uint64_t) {
        read_by_forward = parameter_bytes_read() - read_before_forward;
    };
    std::uint64_t published = 0;
    bool forward_after_publish_checked = false;
    for (int s = 0; s < 6; ++s) {
        const std::uint64_t committed = t.engine().overlap_counts()->committed;
        const std::uint64_t taken = staged_taken();
        read_before_forward = parameter_bytes_read();
        t.run(1);
        if (published > 0) {
            // The forward after a published step copies each parameter from the buffer the step
            // published (all 8 taken) and writes it to NVMe behind its compute, instead of
            // reading them (20.5 KiB less what the tiers held). Under this 8 KiB host tier a
            // taken weight may still be written and evicted before its access and read back:
            // one weight and a bias at most.
            EXPECT_LE(read_by_forward, 8192u + 128u) << "step " << s;
            EXPECT_GE(staged_taken() - taken, 8u) << "step " << s;
            forward_after_publish_checked = true;
        }
        if (t.engine().overlap_counts()->committed == committed) continue;  // recorded the order
        ++published;
        // Publishing reads nothing: only the next forward's first access (the 24 x 64 weight,
        // 3072 bytes), whose prefetch the end of backward started before the publish replaced
        // it, may land in the step, and a bias as above. Reading the slices to overwrite them
        // read about 9 KiB per step here.
        EXPECT_LE(parameter_bytes_read() - read_before_step, 3072u + 128u) << "step " << s;
    }
    EXPECT_EQ(published, 5u);
    EXPECT_TRUE(forward_after_publish_checked);
    EXPECT_GT(read_before_step, 0u);  // the backwards did read them
}

// Off (the default) and where the plan cannot have it, nothing speculates.
TEST(OverlapStep, UnusablePlacementsStepAfterBackward) {
    test::TempDir nvme("overlap");
    const std::string streamed =
        with_nvme(small_config(R"("zero_optimization": {"stage": 2, "sub_group_size": 200,)"
                               R"( "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@",)"
                               R"( "stream_gradients": true}},)"),
                  nvme.path());
    Trainer t(load_config(streamed, {"swap.overlap_step=true"}));
    EXPECT_FALSE(t.engine().plan().overlap_step);
    EXPECT_EQ(t.engine().overlap_counts(), nullptr);
    EXPECT_EQ(t.run(3).size(), 3u);
}

}  // namespace
}  // namespace zinf
