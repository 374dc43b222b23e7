// zinf::Engine: training lowers the loss; every ZeRO stage and optimizer placement gives bitwise
// the same losses and parameters; fp16 overflow skips steps and lowers the scale; resuming from
// a checkpoint is exact; corrupted checkpoints are refused; bad configs fail before allocation.
#include "src/engine/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "src/device/cpu_compute.h"
#include "src/device/cpu_device.h"
#include "src/engine/schedule.h"
#include "tests/engine/engine_test_support.h"
#include "tests/support/test_seed.h"

namespace zinf {
namespace {

using test_support::bits;
using test_support::kNvmeZero;
using test_support::load_config;
using test_support::small_config;
using test_support::Trainer;
using test_support::with_nvme;

TEST(EngineTest, LossFalls) {
    Trainer t(load_config(small_config()));
    const auto losses = t.run(40);
    ASSERT_EQ(losses.size(), 40u);
    double first = 0, last = 0;
    for (int i = 0; i < 5; ++i) first += losses[i];
    for (int i = 35; i < 40; ++i) last += losses[i];
    EXPECT_LT(last, 0.6 * first) << "first " << first / 5 << " last " << last / 5;
    EXPECT_EQ(t.engine().global_steps(), 40u);
    EXPECT_EQ(t.engine().global_samples(), 640u);
    EXPECT_FALSE(t.engine().summary().empty());
}

struct Placement {
    const char* name;
    const char* zero;
};

const Placement kPlacements[] = {
    {"stage0", R"("zero_optimization": {"stage": 0},)"},
    {"stage1", R"("zero_optimization": {"stage": 1},)"},
    {"stage2", R"("zero_optimization": {"stage": 2, "sub_group_size": 100},)"},
    {"stage3", R"("zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 20},)"},
    {"stage2-cpu", R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},)"},
    {"stage3-cpu", R"("zero_optimization": {"stage": 3, "sub_group_size": 64,)"
                   R"( "offload_optimizer": {"device": "cpu"}},)"},
    {"stage3-param-cpu",
     R"("zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 20,)"
     R"( "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}},)"},
    {"stage2-optimizer-nvme", R"("zero_optimization": {"stage": 2, "sub_group_size": 200,)"
                              R"( "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@",)"
                              R"( "stream_gradients": true}},)"},
    {"stage3-nvme", kNvmeZero},
    // stream_gradients "auto" (the default) without a host budget: the gradient partition stays
    // in host memory.
    {"stage3-nvme-auto-host-gradients",
     R"("zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 20,)"
     R"( "sub_group_size": 300, "offload_param": {"device": "nvme", "nvme_path": "@NVME@"},)"
     R"( "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@"}},)"},
    // The gradient partition in host memory instead of streamed to the swap files.
    {"stage3-nvme-host-gradients",
     R"("zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 20,)"
     R"( "sub_group_size": 300, "offload_param": {"device": "nvme", "nvme_path": "@NVME@"},)"
     R"( "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@",)"
     R"( "stream_gradients": false}},)"},
};

void expect_identical_across_placements(const std::string& dtype_block) {
    std::vector<std::uint32_t> ref_losses, ref_params;
    test::TempDir nvme("nvme");
    for (const auto& p : kPlacements) {
        Trainer t(load_config(with_nvme(
            small_config(std::string(p.zero) + dtype_block + R"("gradient_clipping": 0.5,)"),
            nvme.path())));
        const auto losses = bits(t.run(12));
        const auto params = bits(t.engine().master_parameters().value());
        const bool streamed = std::string(p.name).find("nvme") != std::string::npos &&
                              std::string(p.name).find("host-gradients") == std::string::npos;
        ASSERT_EQ(t.engine().gradient_swap() != nullptr, streamed) << p.name;
        if (streamed) {
            // Every step wrote each parameter's slice once and read it back for the optimizer.
            EXPECT_GE(t.engine().gradient_swap()->bytes_written(), 12u * 1396u * 2u) << p.name;
            EXPECT_GE(t.engine().gradient_swap()->bytes_read(), 12u * 1396u * 2u) << p.name;
        }
        if (std::string(p.name) == "stage3-nvme") {
            // The slices really moved: evicted and read back (and checksummed) every step.
            const IoFigures io = t.engine().io_figures();
            EXPECT_GT(io.bytes_read, 12u * 1396u * 2u) << t.engine().residency_summary();
            EXPECT_GT(io.bytes_written, 12u * 1396u * 12u);
        }
        if (ref_losses.empty()) {
            ref_losses = losses;
            ref_params = params;
            continue;
        }
        EXPECT_EQ(losses, ref_losses) << p.name;
        EXPECT_EQ(params, ref_params) << p.name;
    }
}

TEST(EngineTest, Fp32BitwiseIdenticalAcrossStagesAndOffload) {
    expect_identical_across_placements("");
}

TEST(EngineTest, Bf16BitwiseIdenticalAcrossStagesAndOffload) {
    expect_identical_across_placements(R"("bf16": {"enabled": true},)");
}

// Compressed optimizer states: the same bits run to run, for 1 and 2 optimizer threads, and in
// every placement (NVMe with streamed gradients and host memory against the device); and not the
// bits of fp32 states.
TEST(EngineTest, CompressedStatesAreBitwiseAcrossThreadsRunsAndPlacements) {
    test::TempDir nvme("nvme");
    const std::string clip = R"("gradient_clipping": 0.5,)";
    Trainer exact(load_config(small_config(std::string(kPlacements[0].zero) + clip)));
    const auto exact_losses = bits(exact.run(12));
    for (const char* dtype : {"bf16", "int8"}) {
        std::vector<std::uint32_t> ref_losses, ref_params;
        // Stage 3 on NVMe with tiers sized for the 2048-element partitions compressed states pad
        // each parameter to.
        std::string nvme3 = kNvmeZero;
        nvme3.replace(nvme3.find(R"("buffer_size": 1024, "max_in_cpu": 2048)"), 38,
                      R"("buffer_size": 2048, "max_in_cpu": 4096)");
        nvme3.replace(nvme3.find(R"("stage3_max_live_parameters": 1024)"), 34,
                      R"("stage3_max_live_parameters": 4096)");
        for (const std::string& zero :
             {std::string(R"("zero_optimization": {"stage": 1},)"),
              std::string(
                  R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},)"),
              nvme3}) {
            for (const char* threads : {"1", "2", "2"}) {
                SCOPED_TRACE(testing::Message() << dtype << " " << zero << " threads " << threads);
                Trainer t(
                    load_config(with_nvme(small_config(zero + clip), nvme.path()),
                                {str_cat("zero_optimization.offload_optimizer.state_dtype=", dtype),
                                 str_cat("cpu_optimizer.threads=", threads)}));
                ASSERT_EQ(state_dtype_name(t.engine().plan().state_dtype), dtype);
                const auto losses = bits(t.run(12));
                const auto params = bits(t.engine().master_parameters().value());
                if (ref_losses.empty()) {
                    ref_losses = losses;
                    ref_params = params;
                    EXPECT_NE(losses, exact_losses);
                    continue;
                }
                EXPECT_EQ(losses, ref_losses);
                EXPECT_EQ(params, ref_params);
            }
        }
    }
}

// An int8 checkpoint names its code (manifest "int8_code 2"); one without it holds the earlier
// logarithmic code, whose bytes would load as wrong values: refused, naming the checkpoint.
TEST(EngineTest, Int8CheckpointsOfAnotherCodeAreRefused) {
    test::TempDir dir("int8-code");
    const std::vector<std::string> int8 = {"zero_optimization.offload_optimizer.state_dtype=int8"};
    Trainer t(load_config(small_config(R"("zero_optimization": {"stage": 1},)"), int8));
    t.run(2);
    ASSERT_TRUE(t.engine().save_checkpoint(dir.path(), "s2").is_ok());
    const std::string manifest = dir.path() + "/s2/manifest.txt";
    std::string text = test::read_text(manifest);
    ASSERT_NE(text.find("int8_code 2\n"), std::string::npos) << text;
    Trainer same(load_config(small_config(R"("zero_optimization": {"stage": 1},)"), int8));
    EXPECT_TRUE(same.engine().load_checkpoint(dir.path(), "s2").is_ok());
    text.erase(text.find("int8_code 2\n"), 12);
    std::ofstream(manifest, std::ios::trunc) << text;
    Trainer older(load_config(small_config(R"("zero_optimization": {"stage": 1},)"), int8));
    const Status refused = older.engine().load_checkpoint(dir.path(), "s2");
    EXPECT_EQ(refused.code(), StatusCode::kNotSupported) << refused.to_string();
    EXPECT_NE(refused.message().find("int8 optimizer states"), std::string::npos)
        << refused.to_string();
    EXPECT_NE(refused.message().find(dir.path()), std::string::npos) << refused.to_string();
}

// On a device whose copies run late (a slow copy engine), every placement must still wait for
// the copies it depends on before it reuses their host buffers — the NVMe optimizer's sub-group
// buffers, for one, are read into again three sub-groups later.
TEST(EngineTest, SlowDeviceCopiesStillGiveBitwiseTheSameTraining) {
    test::TempDir nvme("nvme");
    auto train = [&](const char* zero, const std::string& dtype_block, bool slow) {
        const auto c = load_config(with_nvme(
            small_config(std::string(zero) + dtype_block + R"("gradient_clipping": 0.5,)"),
            nvme.path()));
        device::CpuDeviceOptions o;
        o.budget_bytes = c.device.memory_budget_bytes;
        if (slow) o.op_delay = std::chrono::microseconds(1500);
        auto device = std::move(device::CpuDevice::create(o)).value();
        auto compute =
            std::move(device::CpuCompute::create(
                          device.get(), device::CpuComputeOptions{c.cpu_optimizer.threads}))
                .value();
        Trainer t(c, assemble_training_stack(c, std::move(device), std::move(compute)));
        const auto losses = bits(t.run(6));
        return std::make_pair(losses, bits(t.engine().master_parameters().value()));
    };
    for (const std::string dtype : {"", R"("bf16": {"enabled": true},)"}) {
        const auto ref = train(kPlacements[4].zero, dtype, false);  // stage2-cpu
        for (const auto& p : kPlacements) {
            const auto got = train(p.zero, dtype, true);
            EXPECT_EQ(got.first, ref.first) << p.name << " " << dtype;
            EXPECT_EQ(got.second, ref.second) << p.name << " " << dtype;
        }
    }
}

TEST(EngineTest, Fp16OverflowSkipsStepAndLowersScale) {
    Trainer t(load_config(
        small_config(R"("fp16": {"enabled": true, "initial_scale_power": 32, "hysteresis": 1,)"
                     R"( "loss_scale_window": 4},
           "zero_optimization": {"stage": 2},)")));
    const double initial = t.engine().loss_scale();
    EXPECT_EQ(initial, std::ldexp(1.0, 32));
    const auto losses = t.run(30);
    EXPECT_GT(t.engine().skipped_steps(), 0u);
    EXPECT_LT(t.engine().loss_scale(), initial);
    for (float l : losses) EXPECT_TRUE(std::isfinite(l));
    double first = 0, last = 0;
    for (int i = 0; i < 5; ++i) first += losses[i];
    for (int i = 25; i < 30; ++i) last += losses[i];
    EXPECT_LT(last, first);
}

// With accumulation, one residency iteration is one window (persistent parameters are gathered
// in its first micro-step only): the recorded trace holds, prefetch is never paused.
TEST(EngineTest, NvmeTraceIsStableUnderAccumulation) {
    test::TempDir nvme("nvme");
    Trainer t(load_config(
        with_nvme(small_config(std::string(kNvmeZero) + R"("bf16": {"enabled": true},)"),
                  nvme.path()),
        {"gradient_accumulation_steps=3",
         "zero_optimization.stage3_param_persistence_threshold=40"}));
    t.run(5);
    const std::string s = t.engine().residency_summary();
    EXPECT_NE(s.find("traces 1, order changes 0"), std::string::npos) << s;
    ASSERT_TRUE(t.engine().io_only_step());
    EXPECT_NE(t.engine().residency_summary().find("order changes 0"), std::string::npos)
        << t.engine().residency_summary();
}

// The I/O-only step of --measure-overlap moves the streamed gradients' bytes too, as many per
// window as training does (3 micro-steps: 3 writes, 2 read-backs and the optimizer's read of
// every slice), and changes nothing: the training after it is bitwise the training without it.
TEST(EngineTest, IoOnlyStepMovesTheStreamedGradientsAndChangesNothing) {
    struct Run {
        std::vector<std::uint32_t> losses;
        std::uint64_t io_only_read = 0;
        std::uint64_t io_only_written = 0;
        std::uint64_t window_gradient_bytes = 0;  // written per micro-step
        std::uint64_t io_only_gradient_read = 0;  // by the gradients' own pass
        std::uint64_t io_only_gradient_written = 0;
    };
    auto run = [](bool stream, bool io_only) {
        test::TempDir nvme("nvme");
        Trainer t(load_config(
            with_nvme(small_config(std::string(kNvmeZero) + R"("bf16": {"enabled": true},)"),
                      nvme.path()),
            {"gradient_accumulation_steps=3",
             std::string("zero_optimization.offload_optimizer.stream_gradients=") +
                 (stream ? "true" : "false")}));
        Run r;
        r.losses = bits(t.run(2));
        if (io_only) {
            if (stream) r.window_gradient_bytes = t.engine().gradient_swap()->bytes_written() / 6;
            const IoFigures before = t.engine().io_figures();
            EXPECT_TRUE(t.engine().io_only_step());
            const IoFigures after = t.engine().io_figures();
            r.io_only_read = after.bytes_read - before.bytes_read;
            r.io_only_written = after.bytes_written - before.bytes_written;
            if (stream) {
                r.io_only_gradient_read = t.engine().gradient_swap()->io_only_bytes_read();
                r.io_only_gradient_written = t.engine().gradient_swap()->io_only_bytes_written();
            }
        }
        const auto more = bits(t.run(2));
        r.losses.insert(r.losses.end(), more.begin(), more.end());
        return r;
    };
    const Run plain = run(false, true);
    const Run streamed = run(true, true);
    const Run reference = run(true, false);
    ASSERT_GT(streamed.window_gradient_bytes, 0u);
    // Writes exactly, in the engine's figures and in the gradients' own. The engine's reads also
    // hold the parameters' replay, whose hits depend on when the prefetches land (under load
    // it varied beyond a quarter of the gradients' bytes), so the reads are counted exactly by
    // the gradients' pass itself, and the engine's only bounded from below.
    EXPECT_EQ(streamed.io_only_written - plain.io_only_written, 3 * streamed.window_gradient_bytes);
    EXPECT_EQ(streamed.io_only_gradient_written, 3 * streamed.window_gradient_bytes);
    EXPECT_EQ(streamed.io_only_gradient_read, 3 * streamed.window_gradient_bytes);
    EXPECT_GE(streamed.io_only_read, streamed.io_only_gradient_read);
    EXPECT_EQ(streamed.losses, reference.losses);
}

// With its I/O discarded (the compute-only pass of --measure-overlap) the engine moves no byte,
// refuses to save while discarding, and refuses to go on afterwards until a checkpoint loads;
// after the load it trains bitwise as the engine that saved it.
TEST(EngineTest, DiscardedIoMovesNothingAndTheEngineRefusesUntilALoad) {
    test::TempDir nvme("nvme");
    test::TempDir nvme2("nvme");
    test::TempDir ckpt("ckpt");
    const std::string json = small_config(std::string(kNvmeZero) + R"("bf16": {"enabled": true},)");
    Trainer t(load_config(with_nvme(json, nvme.path())));
    t.run(2);
    ASSERT_TRUE(t.engine().save_checkpoint(ckpt.path(), "two").is_ok());
    const auto expected = bits(t.run(2));

    Trainer d(load_config(with_nvme(json, nvme2.path())));
    d.run(2);
    ASSERT_TRUE(d.engine().set_io_discard(true).is_ok());
    const IoFigures before = d.engine().io_figures();
    d.run(2);
    const IoFigures after = d.engine().io_figures();
    EXPECT_EQ(after.bytes_read, before.bytes_read);
    EXPECT_EQ(after.bytes_written, before.bytes_written);
    EXPECT_GT(d.engine().io_ops_discarded(), 0u);
    const Status save = d.engine().save_checkpoint(ckpt.path(), "discarded");
    EXPECT_EQ(save.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(save.message().find("set_io_discard"), std::string::npos) << save.to_string();
    ASSERT_TRUE(d.engine().set_io_discard(false).is_ok());
    const Status refused = d.engine().save_checkpoint(ckpt.path(), "after");
    EXPECT_NE(refused.message().find("I/O discarded"), std::string::npos) << refused.to_string();
    EXPECT_FALSE(std::filesystem::exists(ckpt.file("after")));
    const Status loaded = d.engine().load_checkpoint(ckpt.path(), "two");
    ASSERT_TRUE(loaded.is_ok()) << loaded.to_string();
    EXPECT_EQ(bits(d.run(2)), expected);
}

// Streamed gradients under accumulation: the second and third micro-steps read each slice back
// and add, rounding as the coordinator does in memory; the losses and parameters are bitwise
// those of the gradients in host memory, with and without bf16.
TEST(EngineTest, StreamedGradientsAccumulateBitwiseAsInMemory) {
    for (const char* dtype : {"", R"("bf16": {"enabled": true},)"}) {
        std::vector<std::uint32_t> ref_losses, ref_params;
        for (const char* stream : {"true", "false"}) {
            test::TempDir nvme("nvme");
            Trainer t(load_config(
                with_nvme(
                    small_config(std::string(kNvmeZero) + dtype + R"("gradient_clipping": 0.5,)"),
                    nvme.path()),
                {"gradient_accumulation_steps=3",
                 std::string("zero_optimization.offload_optimizer.stream_gradients=") + stream}));
            const auto losses = bits(t.run(4));
            const auto params = bits(t.engine().master_parameters().value());
            ASSERT_EQ(t.engine().gradient_swap() != nullptr, std::string(stream) == "true");
            if (ref_losses.empty()) {
                // Reads for the accumulation (2 of 3 micro-steps) and for the optimizer.
                const engine::GradientSwap& g = *t.engine().gradient_swap();
                EXPECT_GE(g.bytes_read(), g.bytes_written()) << dtype;
                // Every accumulation's sum was read ahead but the first of each window (4).
                EXPECT_GT(g.accumulations(), 8u) << dtype;
                EXPECT_EQ(g.read_ahead_hits() + 4, g.accumulations()) << dtype;
                ref_losses = losses;
                ref_params = params;
                continue;
            }
            EXPECT_EQ(losses, ref_losses) << dtype;
            EXPECT_EQ(params, ref_params) << dtype;
        }
    }
}

TEST(EngineTest, GradientAccumulationCountsMicroSteps) {
    Trainer t(load_config(small_config(), {"gradient_accumulation_steps=3"}));
    EXPECT_EQ(t.engine().train_batch_size(), 48u);
    t.run(4);
    EXPECT_EQ(t.engine().micro_steps(), 12u);
    EXPECT_EQ(t.engine().global_steps(), 4u);
    EXPECT_EQ(t.engine().global_samples(), 192u);
}

struct ResumeCase {
    std::string extra;
    std::vector<std::string> overrides;
};

class ResumeTest : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(ResumeTest, ResumeIsBitwiseExact) {
    // Each engine alive at the same time has its own nvme_path (a second run on one is refused).
    test::TempDir nvme_a("nvme"), nvme_b("nvme");
    const auto config_a =
        load_config(with_nvme(small_config(GetParam().extra), nvme_a.path()), GetParam().overrides);
    const auto config =
        load_config(with_nvme(small_config(GetParam().extra), nvme_b.path()), GetParam().overrides);
    const std::uint64_t n = 10, k = 4;
    Trainer full(config_a);
    const auto full_losses = bits(full.run(n));
    const auto full_params = bits(full.engine().master_parameters().value());

    test::TempDir dir("ckpt");
    std::vector<std::uint32_t> resumed;
    {
        Trainer first(config);
        resumed = bits(first.run(k));
        ASSERT_TRUE(first.engine().save_checkpoint(dir.path(), "step4"));
    }
    Trainer second(config);
    const Status s = second.engine().load_checkpoint(dir.path(), "step4");
    ASSERT_TRUE(s) << s.to_string();
    EXPECT_EQ(second.engine().global_steps(), k);
    const auto rest = bits(second.run(n - k));
    resumed.insert(resumed.end(), rest.begin(), rest.end());
    EXPECT_EQ(resumed, full_losses);
    EXPECT_EQ(bits(second.engine().master_parameters().value()), full_params);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, ResumeTest,
    ::testing::Values(
        ResumeCase{R"("zero_optimization": {"stage": 0},)", {}},
        ResumeCase{R"("zero_optimization": {"stage": 3}, "bf16": {"enabled": true},)"
                   R"( "scheduler": {"type": "WarmupDecayLR",)"
                   R"( "params": {"warmup_num_steps": 3, "total_num_steps": 20}},)",
                   {}},
        ResumeCase{R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},)"
                   R"( "fp16": {"enabled": true, "initial_scale_power": 30, "hysteresis": 1},)",
                   {}},
        ResumeCase{std::string(kNvmeZero) + R"( "bf16": {"enabled": true},)", {}},
        ResumeCase{
            R"("zero_optimization": {"stage": 1},)",
            {"optimizer.type=Lion", "optimizer.params.lr=0.001", "model.layers=[24,32,4]",
             "model.dropout=0.2", "model.layernorm=true", "gradient_accumulation_steps=2"}}));

// The posix file system, except that writes to files whose path contains `gated` wait until
// open() is called: it holds a background checkpoint's copy at its first state file.
class GatedFileSystem final : public io::FileSystem {
public:
    explicit GatedFileSystem(std::string gated) : gated_(std::move(gated)) {}
    void open() {
        {
            const std::lock_guard lock(mutex_);
            open_ = true;
        }
        opened_.notify_all();
    }
    bool waited() const { return waited_.load(); }

    Result<io::Directory> open_directory(const std::string& path, bool follow_last) override {
        return inner_.open_directory(path, follow_last);
    }
    Result<io::Directory> open_directory_at(const io::Directory& parent,
                                            std::string_view name) override {
        return inner_.open_directory_at(parent, name);
    }
    Result<FileDescriptor> open_at(const io::Directory& dir, std::string_view name, int flags,
                                   unsigned mode) override {
        return inner_.open_at(dir, name, flags, mode);
    }
    Status make_directory_at(const io::Directory& parent, std::string_view name,
                             unsigned mode) override {
        return inner_.make_directory_at(parent, name, mode);
    }
    Status preallocate(int fd, std::uint64_t length_bytes, std::string_view what) override {
        return inner_.preallocate(fd, length_bytes, what);
    }
    Status sync(int fd, bool data_only, std::string_view what) override {
        return inner_.sync(fd, data_only, what);
    }
    Status rename_at(const io::Directory& dir, std::string_view from,
                     std::string_view to) override {
        return inner_.rename_at(dir, from, to);
    }
    Status remove_at(const io::Directory& dir, std::string_view name, bool directory) override {
        return inner_.remove_at(dir, name, directory);
    }
    Status write_all(int fd, std::span<const std::byte> bytes, std::string_view what) override {
        if (what.find(gated_) != std::string_view::npos) {
            std::unique_lock lock(mutex_);
            if (!open_) waited_ = true;
            opened_.wait(lock, [&] { return open_; });
        }
        return inner_.write_all(fd, bytes, what);
    }
    Status read_exact(int fd, std::span<std::byte> bytes, std::string_view what) override {
        return inner_.read_exact(fd, bytes, what);
    }

private:
    io::FileSystem& inner_ = io::posix_file_system();
    std::string gated_;
    std::mutex mutex_;
    std::condition_variable opened_;
    bool open_ = false;
    std::atomic<bool> waited_{false};
};

// swap.background_checkpoint: the checkpoint holds the states of the step it was taken at,
// although steps ran while its copy was held back (the first wrote the states' other extents,
// the second waited for the snapshot's release); it becomes `latest` only once complete, and
// resuming from it is bitwise the uninterrupted run (which ran without copy-on-write).
TEST(CheckpointTest, BackgroundCheckpointKeepsItsStepWhileTrainingGoesOn) {
    test::TempDir nvme_a("nvme"), nvme_b("nvme"), nvme_c("nvme");
    const std::string extra = std::string(kNvmeZero) + R"( "bf16": {"enabled": true},)";
    const auto plain = load_config(with_nvme(small_config(extra), nvme_a.path()));
    const std::string background = extra + R"( "swap": {"background_checkpoint": true},)";
    const auto config_b = load_config(with_nvme(small_config(background), nvme_b.path()));
    const auto config_c = load_config(with_nvme(small_config(background), nvme_c.path()));
    const std::uint64_t n = 9, k = 4;
    Trainer full(plain);
    const auto full_losses = bits(full.run(n));
    const auto full_params = bits(full.engine().master_parameters().value());

    test::TempDir dir("ckpt");
    std::vector<std::uint32_t> resumed;
    {
        GatedFileSystem gated("master.fp32");
        EngineOptions options;
        options.file_system = &gated;
        Trainer first(config_b, TrainingStack::create(config_b, options));
        EXPECT_NE(first.engine().plan().describe().find("copy-on-write"), std::string::npos);
        // Two extents per partition: twice the plain run's swap bytes, predicted and on disk.
        const std::uint64_t predicted = first.engine().memory_prediction().nvme.total_bytes();
        EXPECT_EQ(predicted, 2 * full.engine().memory_prediction().nvme.total_bytes());
        auto swap_file_bytes = [](const std::string& path) {
            std::uint64_t bytes = 0;
            for (const auto& e : std::filesystem::recursive_directory_iterator(path)) {
                if (e.path().filename() == "swap.data") bytes += e.file_size();
            }
            return bytes;
        };
        EXPECT_GT(swap_file_bytes(nvme_a.path()), 0u);
        EXPECT_EQ(swap_file_bytes(nvme_b.path()), 2 * swap_file_bytes(nvme_a.path()));
        resumed = bits(first.run(k));
        ASSERT_TRUE(first.engine().save_checkpoint(dir.path(), "step4"));
        EXPECT_TRUE(first.engine().checkpoint_in_progress());
        first.run(1);  // writes the other extents: no wait
        // The copy reaches its first state file (and stops there) in its own time.
        for (int i = 0; i < 1000 && !gated.waited(); ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        if (!gated.waited()) {
            gated.open();  // else the engine's destructor would wait for the copy for ever
            FAIL() << "the background copy never reached its first state file";
        }
        EXPECT_FALSE(std::filesystem::exists(dir.path() + "/step4"));  // not yet complete
        EXPECT_FALSE(std::filesystem::exists(dir.path() + "/latest"));
        // The next step would overwrite the snapshot: it waits until the copy lets it go.
        std::thread opener([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            gated.open();
        });
        first.run(1);
        opener.join();
        EXPECT_GT(first.engine().times().checkpoint_wait_seconds, 0.1);
        ASSERT_TRUE(first.engine().wait_checkpoint());
        EXPECT_FALSE(first.engine().checkpoint_in_progress());
        EXPECT_GT(first.engine().times().checkpoint_background_seconds, 0.1);
        EXPECT_TRUE(std::filesystem::exists(dir.path() + "/step4"));
    }
    Trainer second(config_c);
    const Status s = second.engine().load_checkpoint(dir.path(), "step4");
    ASSERT_TRUE(s) << s.to_string();
    EXPECT_EQ(second.engine().global_steps(), k);
    const auto rest = bits(second.run(n - k));
    resumed.insert(resumed.end(), rest.begin(), rest.end());
    EXPECT_EQ(resumed, full_losses);
    EXPECT_EQ(bits(second.engine().master_parameters().value()), full_params);
}

// The files of a background checkpoint (the parameters written from the snapshot's master
// among them) are byte for byte those of a checkpoint written in the foreground at the same
// step, for parameters in fp32, bf16 and fp16 and int8 moments.
TEST(CheckpointTest, BackgroundCheckpointFilesAreTheForegroundOnes) {
    const char* dtypes[] = {"", R"( "bf16": {"enabled": true},)",
                            R"( "fp16": {"enabled": true, "initial_scale_power": 8},)",
                            "int8 moments (overrides below)"};
    for (const char* dtype : dtypes) {
        SCOPED_TRACE(dtype);
        test::TempDir nvme_a("nvme"), nvme_b("nvme"), dir_a("ckpt"), dir_b("ckpt");
        // The int8 case overrides offload_optimizer: its own small config keeps the rest.
        const bool int8 = std::string(dtype).find("int8") != std::string::npos;
        const std::string extra =
            int8 ? std::string(R"("bf16": {"enabled": true}, "swap": {"background_checkpoint": )")
                 : std::string(kNvmeZero) + dtype + R"( "swap": {"background_checkpoint": )";
        std::vector<std::string> overrides;
        if (int8) {
            overrides = {"zero_optimization.stage=3", "zero_optimization.sub_group_size=4096",
                         "zero_optimization.offload_optimizer.device=nvme",
                         "zero_optimization.offload_optimizer.state_dtype=int8"};
        }
        const auto nvme_override = [&](const std::string& path) {
            std::vector<std::string> o = overrides;
            if (int8) o.push_back("zero_optimization.offload_optimizer.nvme_path=" + path);
            return o;
        };
        const auto fg = load_config(with_nvme(small_config(extra + "false},"), nvme_a.path()),
                                    nvme_override(nvme_a.path()));
        const auto bg = load_config(with_nvme(small_config(extra + "true},"), nvme_b.path()),
                                    nvme_override(nvme_b.path()));
        Trainer a(fg), b(bg);
        a.run(3);
        b.run(3);
        ASSERT_TRUE(a.engine().save_checkpoint(dir_a.path(), "s"));
        ASSERT_TRUE(b.engine().save_checkpoint(dir_b.path(), "s"));
        ASSERT_TRUE(b.engine().checkpoint_in_progress());
        b.run(2);  // the copy runs beside these steps
        ASSERT_TRUE(b.engine().wait_checkpoint());
        std::size_t compared = 0;
        for (const auto& e : std::filesystem::directory_iterator(dir_a.path() + "/s")) {
            const std::string name = e.path().filename();
            if (name == "manifest.txt") continue;  // the configs' digests differ
            std::ifstream fa(e.path(), std::ios::binary),
                fb(dir_b.path() + "/s/" + name, std::ios::binary);
            ASSERT_TRUE(fb.good()) << name << " missing from the background checkpoint";
            const std::string ca((std::istreambuf_iterator<char>(fa)), {});
            const std::string cb((std::istreambuf_iterator<char>(fb)), {});
            EXPECT_EQ(ca.size(), cb.size()) << name;
            EXPECT_TRUE(ca == cb) << name << " differs";
            ++compared;
        }
        EXPECT_GE(compared, 4u);  // parameters, master, two moments
    }
}

// Overwrites one byte of a checkpoint file in place (0x55 at `offset`).
void overwrite_byte(const std::string& path, std::streamoff offset) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << path;
    f.seekp(offset);
    const char c = 0x55;
    f.write(&c, 1);
    ASSERT_TRUE(f.good()) << path;
}

TEST(CheckpointTest, CorruptionIsDetected) {
    const auto config = load_config(small_config());
    test::TempDir dir("ckpt");
    {
        Trainer t(config);
        t.run(2);
        ASSERT_TRUE(t.engine().save_checkpoint(dir.path(), "a"));
        ASSERT_TRUE(t.engine().save_checkpoint(dir.path(), "a"));  // replaces atomically
    }
    overwrite_byte(dir.file("a/master.fp32"), 100);
    Trainer t(config);
    const Status s = t.engine().load_checkpoint(dir.path(), "a");
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.to_string();
    EXPECT_EQ(t.engine().load_checkpoint(dir.path(), "missing").code(), StatusCode::kNotFound);
    std::ifstream latest(dir.file("latest"));
    std::string tag;
    latest >> tag;
    EXPECT_EQ(tag, "a");
}

// A load that fails after it began restoring states leaves the engine refusing to train or save
// (its states may disagree) until a load succeeds.
TEST(CheckpointTest, FailedLoadMakesTheEngineRefuseUntilALoadSucceeds) {
    const auto config = load_config(small_config());
    test::TempDir dir("ckpt");
    {
        Trainer t(config);
        t.run(2);
        ASSERT_TRUE(t.engine().save_checkpoint(dir.path(), "good"));
        ASSERT_TRUE(t.engine().save_checkpoint(dir.path(), "bad"));
    }
    // The last file read: its checksum fails after every state was written.
    overwrite_byte(dir.file("bad/parameters.fp32"), 8);
    Trainer t(config);
    ASSERT_EQ(t.engine().load_checkpoint(dir.path(), "bad").code(), StatusCode::kCorruption);
    const Status refused = t.engine().save_checkpoint(dir.path(), "after");
    EXPECT_FALSE(refused);
    EXPECT_NE(refused.message().find("load a checkpoint"), std::string::npos)
        << refused.to_string();
    std::vector<float> x(16 * 24, 0.5f);
    std::vector<std::int32_t> y(16, 1);
    EXPECT_FALSE(t.engine().forward(Batch{x, y, 16}).has_value());
    ASSERT_TRUE(t.engine().load_checkpoint(dir.path(), "good"));
    EXPECT_TRUE(t.engine().save_checkpoint(dir.path(), "after"));
    EXPECT_TRUE(t.engine().forward(Batch{x, y, 16}).has_value());
}

// Bad offload settings fail at create, naming the key, before any swap file exists.
TEST(EngineConfigTest, BadOffloadFailsBeforeAllocationNamingTheKey) {
    test::TempDir dir("nvme");
    const std::string file = dir.file("plain-file");
    std::ofstream(file) << "x";
    struct Case {
        std::string extra;
        std::string key;
    };
    const Case cases[] = {
        {R"("zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",)"
         R"( "nvme_path": ")" +
             file + R"(/sub"}},)",
         "offload_param.nvme_path"},
        {R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme",)"
         R"( "nvme_path": ")" +
             file + R"("}},)",
         "offload_optimizer.nvme_path"},
        {R"("zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",)"
         R"( "nvme_path": ")" +
             dir.path() + R"(", "buffer_size": 100}},)",
         "offload_param.buffer_size"},
        {R"("zero_optimization": {"stage": 3, "sub_group_size": 1000, "offload_optimizer":)"
         R"( {"device": "nvme", "nvme_path": ")" +
             dir.path() + R"("}},)",
         "device.host_memory_budget"},
    };
    for (const auto& c : cases) {
        const std::string text = small_config(c.extra);
        auto s = TrainingStack::create(load_config(text, {"device.host_memory_budget=4096"}));
        ASSERT_FALSE(s.has_value()) << c.key;
        EXPECT_NE(s.error().message().find(c.key), std::string::npos) << s.error().to_string();
    }
    // Nothing was left in the directory: no run directory, no lock taken.
    std::size_t entries = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
        (void)e;
        ++entries;
    }
    EXPECT_EQ(entries, 1u);  // plain-file
}

TEST(ScheduleTest, WarmupAndDecayFollowDeepSpeed) {
    config::SchedulerConfig s;
    s.type = config::SchedulerType::kWarmupLR;
    s.warmup_min_lr = 0.0;
    s.warmup_max_lr = 1.0;
    s.warmup_num_steps = 10;
    // Step k runs at DeepSpeed's last_batch_iteration k - 1 (the engine steps the scheduler
    // after the optimizer); step 0 gets the constructor's min_lr.
    s.warmup_min_lr = 0.25;
    EXPECT_DOUBLE_EQ(engine::learning_rate(s, 5, 0), 0.25);
    EXPECT_DOUBLE_EQ(engine::learning_rate(s, 5, 1), 0.25);  // log(1) = 0
    s.warmup_min_lr = 0.0;
    EXPECT_DOUBLE_EQ(engine::learning_rate(s, 5, 5), std::log(5.0) / std::log(10.0));
    EXPECT_DOUBLE_EQ(engine::learning_rate(s, 5, 11), 1.0);
    EXPECT_DOUBLE_EQ(engine::learning_rate(s, 5, 1000), 1.0);
    s.warmup_linear = true;
    EXPECT_DOUBLE_EQ(engine::learning_rate(s, 5, 5), 0.4);
    s.type = config::SchedulerType::kWarmupDecayLR;
    s.total_num_steps = 20;
    EXPECT_DOUBLE_EQ(engine::learning_rate(s, 5, 16), 0.5);
    EXPECT_DOUBLE_EQ(engine::learning_rate(s, 5, 26), 0.0);
    s.type = config::SchedulerType::kNone;
    EXPECT_DOUBLE_EQ(engine::learning_rate(s, 5, 3), 5.0);
}

TEST(ScheduleTest, LossScalerHysteresisAndWindow) {
    config::Fp16Config f;
    f.enabled = true;
    f.initial_scale_power = 4;
    f.hysteresis = 2;
    f.loss_scale_window = 3;
    f.min_loss_scale = 2;
    engine::LossScaler s(f);
    EXPECT_EQ(s.scale(), 16.0);
    s.update(true);  // hysteresis absorbs the first
    EXPECT_EQ(s.scale(), 16.0);
    s.update(true);
    EXPECT_EQ(s.scale(), 8.0);
    s.update(false);
    s.update(false);
    EXPECT_EQ(s.scale(), 8.0);
    s.update(false);  // 3 clean steps since the overflow
    EXPECT_EQ(s.scale(), 16.0);
    for (int i = 0; i < 10; ++i) s.update(true);
    EXPECT_EQ(s.scale(), 2.0);  // min_loss_scale
}

}  // namespace
}  // namespace zinf
