// The engine over several ranks (run under mpiexec with 2 and 3 ranks;
// tests/engine/CMakeLists.txt): data-parallel training against a single-rank engine built in the
// same process, every ZeRO stage and placement against each other, checkpoints (shards, atomicity,
// re-partitioning) and errors every rank reports instead of a hang. The deterministic reduction
// (comm.deterministic) makes the arithmetic of N ranks the arithmetic of one rank accumulating N
// micro-batches: added in rank order, exactly what gradient accumulation adds when 1/N is a power
// of two.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/fault.h"
#include "io/file_system.h"
#include "src/data/dataset.h"
#include "src/engine/engine.h"
#include "src/engine/stack.h"
#include "src/engine/trainer.h"
#include "tests/engine/engine_test_support.h"
#include "tests/support/test_seed.h"
#include "zero/mpi_communicator.h"

namespace zinf {
namespace {

using test_support::with_nvme;

constexpr std::size_t kMicro = 8;

// The 24-32-16-4 MLP on 256 synthetic samples; `zero` spliced in (a "zero_optimization" entry
// and anything else, with a trailing comma).
std::string config_text(const std::string& zero, std::uint64_t gas, double clipping) {
    return R"({
  )" + zero +
           R"(
  "train_micro_batch_size_per_gpu": 8,
  "gradient_accumulation_steps": )" +
           std::to_string(gas) + R"(,
  "gradient_clipping": )" +
           std::to_string(clipping) + R"(,
  "steps_per_print": 1000,
  "seed": 7,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
  "model": {"type": "mlp", "layers": [24, 32, 16, 4]},
  "data": {"dataset": "synthetic", "synthetic_samples": 256},
  "device": {"type": "cpu", "memory_budget": 67108864},
  "comm": {"deterministic": true, "timeout_s": 120},
  "cpu_optimizer": {"threads": 1}
})";
}

config::EngineConfig load(const std::string& text, int world_size) {
    config::LoadOptions o;
    o.log_warnings = false;
    o.world_size = world_size;
    auto c = config::load_from_string(text, o, "mpi_engine_test.json");
    ZINF_ASSERT_MSG(c.has_value(), c.error().to_string());
    return std::move(c).value();
}

CommunicatorFactory mpi_factory() {
    return [](Device& d) -> Result<std::unique_ptr<zero::Communicator>> {
        zero::MpiCommunicatorOptions o;
        o.deterministic = true;
        o.timeout = std::chrono::seconds(120);
        ZINF_ASSIGN_OR_RETURN(auto c, zero::MpiCommunicator::create(d, o));
        return std::unique_ptr<zero::Communicator>(std::move(c));
    };
}

// An engine with its data and the losses its trainer reported.
struct RankRun {
    config::EngineConfig config;
    TrainingStack stack;
    std::unique_ptr<data::SyntheticDataset> data;
    std::vector<float> losses;

    RankRun(const config::EngineConfig& c, bool several_ranks) : config(c) {
        auto s =
            TrainingStack::create(c, {}, several_ranks ? mpi_factory() : CommunicatorFactory{});
        ZINF_ASSERT_MSG(s.has_value(), s.error().to_string());
        stack = std::move(*s);
        data::SyntheticOptions so;
        so.count = c.data.synthetic_samples;
        so.features = 24;
        so.classes = 4;
        so.seed = c.seed;
        data = std::move(data::SyntheticDataset::create(so)).value();
    }
    Engine& engine() { return *stack.engine; }

    // Trains up to optimizer step `until` through zinf::Trainer (sharded batches, mean loss).
    Status train_until(std::uint64_t until) {
        test_support::LossCollector observer(losses);
        TrainerOptions o;
        o.max_steps = until;
        o.evaluate_each_epoch = false;
        ZINF_ASSIGN_OR_RETURN(auto trainer, Trainer::create(engine(), *data, nullptr, o));
        return trainer.run(observer).status();
    }

    // Parameter p's master values this rank owns: (first element, values).
    std::vector<std::pair<std::size_t, std::vector<float>>> owned() {
        auto master = engine().master_parameters();
        ZINF_ASSERT_MSG(master.has_value(), master.error().to_string());
        const auto& co = engine().coordinator();
        const auto& part = co.partitioning();
        std::vector<std::pair<std::size_t, std::vector<float>>> out;
        for (std::size_t p = 0; p < part.parameter_count(); ++p) {
            const std::size_t first =
                co.plan().optimizer_partitioned
                    ? static_cast<std::size_t>(part.rank()) * part.slot(p).slice_numel
                    : 0;
            const auto begin =
                master->begin() + static_cast<std::ptrdiff_t>(co.domain_offset_numel(p));
            out.emplace_back(
                first, std::vector<float>(
                           begin, begin + static_cast<std::ptrdiff_t>(co.domain_valid_numel(p))));
        }
        return out;
    }
};

// Every element this rank owns in `mine` equals (bitwise, or within `tolerance` relative) the
// same element of `whole`, a run whose rank owns all of them too.
void expect_same_parameters(RankRun& mine, RankRun& whole, double tolerance = 0) {
    const auto a = mine.owned();
    const auto b = whole.owned();
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t p = 0; p < a.size(); ++p) {
        // b owns at least a's elements (all of them, or the same slice of the same rank); a
        // rank may own none of a small parameter (its slice is padding).
        if (a[p].second.empty()) continue;
        ASSERT_LE(b[p].first, a[p].first);
        ASSERT_LE(a[p].first + a[p].second.size(), b[p].first + b[p].second.size());
        for (std::size_t i = 0; i < a[p].second.size(); ++i) {
            const float x = a[p].second[i];
            const float y = b[p].second[a[p].first - b[p].first + i];
            if (tolerance == 0) {
                ASSERT_EQ(test_support::bits({x}), test_support::bits({y}))
                    << "parameter " << p << " element " << a[p].first + i << ": " << x << " vs "
                    << y;
            } else {
                ASSERT_LE(std::abs(x - y), tolerance * std::max(std::abs(y), 1e-2f))
                    << "parameter " << p << " element " << a[p].first + i;
            }
        }
    }
}

// Each step's loss of N ranks is the mean of the one rank's N micro-batch losses of that step:
// bitwise with tolerance 0, else within tolerance of it.
void expect_mean_losses(const RankRun& ranks, const RankRun& one, int n, double tolerance) {
    for (std::size_t s = 0; s < ranks.losses.size(); ++s) {
        double sum = 0;
        for (int r = 0; r < n; ++r) sum += one.losses[s * n + r];
        const auto want = static_cast<float>(sum / n);
        if (tolerance == 0) {
            EXPECT_EQ(test_support::bits({ranks.losses[s]}), test_support::bits({want}))
                << "step " << s;
        } else {
            EXPECT_NEAR(ranks.losses[s], want, tolerance * want) << "step " << s;
        }
    }
}

// A directory every rank sees: rank 0 makes it and tells the others.
class SharedDir {
public:
    explicit SharedDir(zero::Communicator& comm) : comm_(comm) {
        std::array<char, 512> name{};
        if (comm.rank() == 0) {
            own_ = std::make_unique<test::TempDir>("mpi");
            std::snprintf(name.data(), name.size(), "%s", own_->path().c_str());
        }
        std::vector<std::array<char, 512>> all(static_cast<std::size_t>(comm.world_size()));
        ZINF_ASSERT(comm.all_gather_host(std::as_bytes(std::span(name)),
                                         std::as_writable_bytes(std::span(all)))
                        .is_ok());
        path_ = all[0].data();
    }
    ~SharedDir() { (void)comm_.barrier(); }  // nobody uses it when rank 0 removes it
    const std::string& path() const { return path_; }

private:
    zero::Communicator& comm_;
    std::unique_ptr<test::TempDir> own_;
    std::string path_;
};

std::string latest_tag(const std::string& dir) {
    auto tag = engine::read_latest_tag(io::posix_file_system(), dir);
    return tag.has_value() ? *tag : "(none: " + tag.error().to_string() + ")";
}

int world() {
    auto launch = zero::detect_launch();
    ZINF_ASSERT_MSG(launch.has_value(), launch.error().to_string());
    return launch->world_size;
}

constexpr const char* kStages[] = {
    R"("zero_optimization": {"stage": 0},)",
    R"("zero_optimization": {"stage": 1},)",
    R"("zero_optimization": {"stage": 2},)",
    R"("zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},)",
    R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},)",
    R"("zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}},)",
};

// N ranks with micro-batch 8 take the steps one rank takes with micro-batch 8 accumulated N
// times over the same samples: the same parameters, and the same mean loss per step (bitwise
// where 1/N is exact, as for 2 ranks; within fp32 rounding otherwise).
TEST(MpiEngine, RanksTrainAsOneRankAccumulatingTheirMicroBatches) {
    const int n = world();
    // 1/3 is inexact: one rank scales each micro-batch's gradient by it, three ranks the sum.
    const double tolerance = (n & (n - 1)) == 0 ? 0.0 : 1e-4;
    for (const char* zero : kStages) {
        SCOPED_TRACE(zero);
        RankRun ranks(load(config_text(zero, 1, 0.0), n), true);
        RankRun one(load(config_text(zero, static_cast<std::uint64_t>(n), 0.0), 1), false);
        ASSERT_EQ(ranks.engine().world_size(), n);
        ASSERT_TRUE(ranks.train_until(6).is_ok());
        ASSERT_TRUE(one.train_until(6).is_ok());
        ASSERT_EQ(ranks.losses.size(), 6u);
        ASSERT_EQ(one.losses.size(), 6u * n);
        expect_mean_losses(ranks, one, n, tolerance);
        expect_same_parameters(ranks, one, tolerance);
        // Each rank saw distinct samples: its own loss differs from the global mean.
        EXPECT_EQ(ranks.engine().global_samples(), 6u * kMicro * n);
    }
}

// Evaluation shards the samples over the ranks (a rank past the end of the last batch runs one
// uncounted sample, so that stage 3's gathers stay matched) and adds the counts: the accuracy is
// the one rank's.
TEST(MpiEngine, ShardedEvaluationGivesOneRanksAccuracy) {
    const int n = world();
    RankRun ranks(load(config_text(kStages[3], 1, 0.0), n), true);
    RankRun one(load(config_text(kStages[3], static_cast<std::uint64_t>(n), 0.0), 1), false);
    ASSERT_TRUE(ranks.train_until(4).is_ok());
    ASSERT_TRUE(one.train_until(4).is_ok());
    TrainerOptions o;
    o.evaluate_each_epoch = false;
    auto tr = Trainer::create(ranks.engine(), *ranks.data, nullptr, o);
    auto to = Trainer::create(one.engine(), *one.data, nullptr, o);
    ASSERT_TRUE(tr.has_value());
    ASSERT_TRUE(to.has_value());
    auto a = tr->evaluate();
    auto b = to->evaluate();
    ASSERT_TRUE(a.has_value()) << a.error().to_string();
    ASSERT_TRUE(b.has_value());
    EXPECT_GT(*b, 0.0);
    if ((n & (n - 1)) == 0) {
        EXPECT_EQ(*a, *b);
    } else {
        EXPECT_NEAR(*a, *b, 2.0 / 256);  // parameters within 1e-4: a sample or two may flip
    }
}

// With clipping on (the global norm agreed over the ranks), every stage and placement trains
// the same bits on N ranks, as they do on one.
TEST(MpiEngine, EveryStageAndPlacementTrainsTheSameBits) {
    const int n = world();
    test::TempDir nvme("mpi-nvme");
    RankRun reference(load(config_text(kStages[0], 1, 0.05), n), true);
    ASSERT_TRUE(reference.train_until(5).is_ok());
    std::vector<std::string> zeros(std::begin(kStages) + 1, std::end(kStages));
    zeros.push_back(with_nvme(test_support::kNvmeZero, nvme.path()));
    for (const auto& zero : zeros) {
        SCOPED_TRACE(zero);
        RankRun run(load(config_text(zero, 1, 0.05), n), true);
        ASSERT_TRUE(run.train_until(5).is_ok());
        EXPECT_EQ(test_support::bits(run.losses), test_support::bits(reference.losses));
        expect_same_parameters(run, reference);
        // The global norm is the same on every rank and clipping happened.
        EXPECT_GT(run.engine().last_step().grad_norm, 0.05);
        EXPECT_EQ(run.engine().last_step().grad_norm, reference.engine().last_step().grad_norm);
    }
}

// bf16 parameters and gradients: the optimizer's new 16-bit values reach the rank's slices in
// the full layout (stages 1-2) or its partition (stage 3) and train the same bits.
TEST(MpiEngine, Bf16TrainsTheSameBitsUnderEveryStage) {
    const int n = world();
    const std::string bf16 = R"("bf16": {"enabled": true},)";
    RankRun reference(load(config_text(bf16 + kStages[0], 1, 0.05), n), true);
    ASSERT_TRUE(reference.train_until(4).is_ok());
    for (const char* zero : {kStages[1], kStages[2], kStages[3], kStages[5]}) {
        SCOPED_TRACE(zero);
        RankRun run(load(config_text(bf16 + zero, 1, 0.05), n), true);
        ASSERT_TRUE(run.train_until(4).is_ok());
        EXPECT_EQ(test_support::bits(run.losses), test_support::bits(reference.losses));
        expect_same_parameters(run, reference);
    }
}

// The seed's memory formulas, per rank: parameters b·Ψ (stage 3: /N), gradients b·Ψ (stages
// 2-3: /N), optimizer states K·Ψ (stages 1-3: /N), held to within the layout's padding; the
// only copy beyond them is stage 1's reduced gradient slices.
TEST(MpiEngine, EachRankHoldsWhatTheSeedFormulasGive) {
    const int n = world();
    for (const std::string dtype : {"", R"("bf16": {"enabled": true},)"}) {
        for (int stage = 0; stage <= 3; ++stage) {
            SCOPED_TRACE(dtype + kStages[stage]);
            RankRun run(load(config_text(dtype + kStages[stage], 1, 0.0), n), true);
            const MemoryAccount a = run.engine().memory_account();
            EXPECT_EQ(a.world_size, n);
            EXPECT_EQ(a.b, dtype.empty() ? 4u : 2u);
            EXPECT_EQ(a.k, 12.0);
            const double pad = static_cast<double>(a.padding_numel);
            auto within = [&](std::size_t held, double formula, double per_elem) {
                EXPECT_GE(static_cast<double>(held), formula);
                EXPECT_LE(static_cast<double>(held), formula + pad * per_elem);
            };
            within(a.held.parameters, a.formula_parameters, static_cast<double>(a.b));
            within(a.held.gradients, a.formula_gradients, static_cast<double>(a.b));
            within(a.optimizer_states, a.formula_states, a.k);
            EXPECT_EQ(a.held.parameter_staging, 0u);
            EXPECT_EQ(a.held.gradient_staging,
                      stage == 1 ? run.engine().coordinator().partitioning().partition_numel() * a.b
                                 : 0u);
            if (stage == 3) {
                EXPECT_LT(
                    static_cast<double>(a.held.parameters) * n,
                    static_cast<double>(a.b) * (static_cast<double>(a.model_numel) + pad) + 1);
            }
            EXPECT_NE(run.engine().summary().find("model states per rank"), std::string::npos);
        }
    }
}

// Each rank swaps under its own subdirectory of every nvme_path: one path, or a list that
// stripes each rank's files over <path>/rank<r> of every entry.
TEST(MpiEngine, EachRankSwapsInItsOwnSubdirectoryOfEveryPath) {
    const int n = world();
    test::TempDir a("mpi-swap"), b("mpi-swap");
    std::string striped = with_nvme(test_support::kNvmeZero, "@");
    for (auto at = striped.find("\"@\""); at != std::string::npos; at = striped.find("\"@\"")) {
        striped.replace(at, 3, "[\"" + a.path() + "\", \"" + b.path() + "\"]");
    }
    for (const bool list : {false, true}) {
        SCOPED_TRACE(list ? "two paths" : "one path");
        const std::string zero = list ? striped : with_nvme(test_support::kNvmeZero, a.path());
        RankRun run(load(config_text(zero, 1, 0.0), n), true);
        ASSERT_TRUE(run.train_until(2).is_ok());
        const std::string sub = "/rank" + std::to_string(run.engine().rank());
        for (const auto* dir : {&a, &b}) {
            if (dir == &b && !list) continue;
            const std::string mine = dir->path() + sub;
            EXPECT_TRUE(std::filesystem::exists(mine + "/zinfinity-swap.lock")) << mine;
            EXPECT_NE(run.engine().summary().find(mine), std::string::npos)
                << run.engine().summary();
        }
        EXPECT_GT(run.engine().io_figures().bytes_read, 0u);
    }
}

// Save on N ranks, continue: the run resumed from the shards continues bitwise. The same
// checkpoint loads on one rank (re-partitioned, every shard read) and under another stage.
TEST(MpiEngine, ShardedCheckpointResumesBitwiseAndRepartitions) {
    const int n = world();
    const std::string zero2 = kStages[2];
    RankRun first(load(config_text(zero2, 1, 0.05), n), true);
    SharedDir dir(first.engine().communicator());
    ASSERT_TRUE(first.train_until(3).is_ok());
    ASSERT_TRUE(first.engine().save_checkpoint(dir.path(), "step3").is_ok());
    EXPECT_EQ(latest_tag(dir.path()), "step3");
    EXPECT_TRUE(std::filesystem::exists(dir.path() + "/step3/rank" + std::to_string(n - 1) +
                                        "/master.fp32"));
    ASSERT_TRUE(first.train_until(6).is_ok());

    RankRun resumed(load(config_text(zero2, 1, 0.05), n), true);
    ASSERT_TRUE(resumed.engine().load_checkpoint(dir.path(), "step3").is_ok());
    EXPECT_EQ(resumed.engine().global_steps(), 3u);
    ASSERT_TRUE(resumed.train_until(6).is_ok());
    EXPECT_EQ(test_support::bits(resumed.losses),
              test_support::bits(std::vector<float>(first.losses.begin() + 3, first.losses.end())));
    expect_same_parameters(resumed, first);

    // Stage 3 at the same world size, and one rank accumulating N micro-batches: both
    // re-partition. One rank holds everything: its parameters at step 3 are the shards'.
    RankRun stage3(load(config_text(kStages[3], 1, 0.05), n), true);
    ASSERT_TRUE(stage3.engine().load_checkpoint(dir.path(), "step3").is_ok());
    ASSERT_TRUE(stage3.train_until(6).is_ok());
    expect_same_parameters(stage3, first);
    RankRun single(load(config_text(zero2, static_cast<std::uint64_t>(n), 0.05), 1), false);
    ASSERT_TRUE(single.engine().load_checkpoint(dir.path(), "step3").is_ok());
    EXPECT_EQ(single.engine().global_steps(), 3u);
    RankRun at3(load(config_text(zero2, 1, 0.05), n), true);
    ASSERT_TRUE(at3.engine().load_checkpoint(dir.path(), "step3").is_ok());
    expect_same_parameters(at3, single);
}

// Compressed optimizer states (offload_optimizer.state_dtype) key their blocks and rounding
// words on the global flat index, and the partitions are padded to whole blocks: N ranks store
// and train the bits one rank accumulating their micro-batches does, at every stage and
// placement. A sharded checkpoint of them resumes bitwise and re-partitions for one rank, and
// loads into fp32 states too (converted).
TEST(MpiEngine, CompressedStatesTrainTheSameBitsOnNRanksAsOnOne) {
    const int n = world();
    const double tolerance = (n & (n - 1)) == 0 ? 0.0 : 1e-4;
    test::TempDir nvme("mpi-nvme");
    const std::string zeros[] = {
        R"("zero_optimization": {"stage": 0, "offload_optimizer": {"state_dtype": "@DT@"}},)",
        R"("zero_optimization": {"stage": 1, "offload_optimizer": {"state_dtype": "@DT@"}},)",
        R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "state_dtype": "@DT@"}},)",
        R"("zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "offload_optimizer": {"device": "cpu", "state_dtype": "@DT@"}},)",
        R"("zero_optimization": {"stage": 2, "sub_group_size": 4096, "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@", "state_dtype": "@DT@"}},)",
    };
    for (const char* dtype : {"bf16", "int8"}) {
        std::vector<float> first_losses;
        for (const std::string& z : zeros) {
            // Each run its own swap directory: both are alive at once.
            std::string zero = with_nvme(z, nvme.path() + "/ranks");
            std::string zero_one = with_nvme(z, nvme.path() + "/one");
            zero.replace(zero.find("@DT@"), 4, dtype);
            zero_one.replace(zero_one.find("@DT@"), 4, dtype);
            std::filesystem::create_directories(nvme.path() + "/ranks");
            std::filesystem::create_directories(nvme.path() + "/one");
            SCOPED_TRACE(zero);
            RankRun ranks(load(config_text(zero, 1, 0.05), n), true);
            RankRun one(load(config_text(zero_one, static_cast<std::uint64_t>(n), 0.05), 1), false);
            ASSERT_TRUE(ranks.train_until(5).is_ok());
            ASSERT_TRUE(one.train_until(5).is_ok());
            EXPECT_EQ(ranks.engine().plan().state_dtype, find_state_dtype(dtype).value());
            ASSERT_EQ(one.losses.size(), 5u * n);
            expect_mean_losses(ranks, one, n, tolerance);
            expect_same_parameters(ranks, one, tolerance);
            // Every stage and placement: the same bits.
            if (first_losses.empty()) {
                first_losses = ranks.losses;
            } else {
                EXPECT_EQ(test_support::bits(ranks.losses), test_support::bits(first_losses));
            }
        }
        // Compressed states train differently from fp32 ones (the option took effect).
        RankRun exact(load(config_text(kStages[1], 1, 0.05), n), true);
        ASSERT_TRUE(exact.train_until(5).is_ok());
        EXPECT_NE(test_support::bits(exact.losses), test_support::bits(first_losses));

        // A sharded checkpoint at step 3: resumed on N ranks bitwise; one rank and fp32 states
        // re-partition (and convert).
        std::string zero2 = zeros[1];
        zero2.replace(zero2.find("@DT@"), 4, dtype);
        RankRun first(load(config_text(zero2, 1, 0.05), n), true);
        SharedDir dir(first.engine().communicator());
        ASSERT_TRUE(first.train_until(3).is_ok());
        ASSERT_TRUE(first.engine().save_checkpoint(dir.path(), "step3").is_ok());
        EXPECT_TRUE(std::filesystem::exists(dir.path() + "/step3/rank0/exp_avg." + dtype));
        EXPECT_EQ(std::filesystem::exists(dir.path() + "/step3/rank0/exp_avg.int8_scales"),
                  std::string(dtype) == "int8");
        ASSERT_TRUE(first.train_until(6).is_ok());
        RankRun resumed(load(config_text(zero2, 1, 0.05), n), true);
        ASSERT_TRUE(resumed.engine().load_checkpoint(dir.path(), "step3").is_ok());
        ASSERT_TRUE(resumed.train_until(6).is_ok());
        EXPECT_EQ(
            test_support::bits(resumed.losses),
            test_support::bits(std::vector<float>(first.losses.begin() + 3, first.losses.end())));
        expect_same_parameters(resumed, first);
        RankRun single(load(config_text(zero2, static_cast<std::uint64_t>(n), 0.05), 1), false);
        ASSERT_TRUE(single.engine().load_checkpoint(dir.path(), "step3").is_ok());
        ASSERT_TRUE(single.train_until(6).is_ok());
        expect_same_parameters(first, single, tolerance);
        RankRun as_fp32(load(config_text(kStages[1], 1, 0.05), n), true);
        ASSERT_TRUE(as_fp32.engine().load_checkpoint(dir.path(), "step3").is_ok());
        EXPECT_EQ(as_fp32.engine().global_steps(), 3u);
        ASSERT_TRUE(as_fp32.train_until(6).is_ok());
    }
}

// One rank that cannot write its shard: every rank reports the failure, the checkpoint never
// appears, and `latest` still names the previous one, whose files are intact.
TEST(MpiEngine, AShardThatFailsLeavesLatestOnThePreviousCheckpoint) {
    const int n = world();
    io::FileFaultPlan plan;
    plan.ops = static_cast<std::uint32_t>(io::FileOp::kWrite);
    plan.fail_nth_op = 2;
    plan.errno_to_inject = ENOSPC;
    io::FaultyFileSystem faulty(io::posix_file_system(), plan);
    auto c = load(config_text(kStages[1], 1, 0.0), n);
    RankRun good(c, true);
    SharedDir dir(good.engine().communicator());
    ASSERT_TRUE(good.train_until(2).is_ok());
    ASSERT_TRUE(good.engine().save_checkpoint(dir.path(), "step2").is_ok());
    ASSERT_TRUE(good.train_until(3).is_ok());
    // The last rank writes through the faulty file system.
    EngineOptions eo;
    if (good.engine().rank() == n - 1) eo.file_system = &faulty;
    auto stack = TrainingStack::create(c, eo, mpi_factory());
    ASSERT_TRUE(stack.has_value());
    ASSERT_TRUE(stack->engine->load_checkpoint(dir.path(), "step2").is_ok());
    const Status saved = stack->engine->save_checkpoint(dir.path(), "step2b");
    ASSERT_FALSE(saved.is_ok());
    if (good.engine().rank() == n - 1) {
        EXPECT_EQ(saved.code(), StatusCode::kNoSpace) << saved.to_string();
    } else {
        EXPECT_NE(saved.message().find("rank " + std::to_string(n - 1)), std::string::npos)
            << saved.to_string();
    }
    EXPECT_FALSE(std::filesystem::exists(dir.path() + "/step2b"));
    EXPECT_EQ(latest_tag(dir.path()), "step2");
    RankRun again(c, true);
    EXPECT_TRUE(again.engine().load_checkpoint(dir.path(), "step2").is_ok());
}

// A rank that cannot create its engine (a file stands where its swap directory goes): every
// rank's create fails, the others naming another rank, none waits in the summary's gather.
TEST(MpiEngine, ARankThatCannotCreateItsEngineFailsEveryRank) {
    const int n = world();
    RankRun probe(load(config_text(kStages[0], 1, 0.0), n), true);
    SharedDir dir(probe.engine().communicator());
    if (probe.engine().rank() == 0) {
        std::filesystem::create_directories(dir.path() + "/swap");
        std::ofstream(dir.path() + "/swap/rank" + std::to_string(n - 1)) << "not a directory";
    }
    ASSERT_TRUE(probe.engine().communicator().barrier().is_ok());
    const std::string zero =
        R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
        dir.path() + R"(/swap"}},)";
    auto stack = TrainingStack::create(load(config_text(zero, 1, 0.0), n), {}, mpi_factory());
    ASSERT_FALSE(stack.has_value());
    if (probe.engine().rank() == n - 1) {
        EXPECT_NE(stack.error().message().find("rank" + std::to_string(n - 1)), std::string::npos)
            << stack.error().to_string();
    } else {
        EXPECT_NE(stack.error().message().find("another rank"), std::string::npos)
            << stack.error().to_string();
    }
}

// One rank's optimizer states cannot be read back: every rank's step fails (the others naming
// another rank) before the parameters' all-gather, and every engine refuses to go on.
TEST(MpiEngine, AnOptimizerStepThatFailsOnOneRankFailsOnEvery) {
    const int n = world();
    test::TempDir nvme("mpi-fail");
    const std::string zero =
        R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
        nvme.path() + R"("}},)";
    const auto c = load(config_text(zero, 1, 0.0), n);
    RankRun probe(load(config_text(kStages[0], 1, 0.0), n), true);
    EngineOptions eo;
    if (probe.engine().rank() == n - 1) {
        io::FaultPlan plan;
        plan.read_error_probability = 1.0;
        eo.io_faults = plan;
    }
    auto stack = TrainingStack::create(c, eo, mpi_factory());
    ASSERT_TRUE(stack.has_value()) << stack.error().to_string();
    Engine& e = *stack->engine;
    std::vector<float> x(kMicro * 24, 0.5f);
    std::vector<std::int32_t> y(kMicro, 1);
    ASSERT_TRUE(e.forward(Batch(x, y, kMicro)).has_value());
    ASSERT_TRUE(e.backward().is_ok());
    const Status step = e.step();
    ASSERT_FALSE(step.is_ok());
    if (e.rank() != n - 1) {
        EXPECT_NE(step.message().find("another rank"), std::string::npos) << step.to_string();
    }
    const auto again = e.forward(Batch(x, y, kMicro));
    ASSERT_FALSE(again.has_value());
    EXPECT_NE(again.error().message().find("unusable"), std::string::npos)
        << again.error().to_string();
}

// A checkpoint of another model: every rank refuses it, naming the difference, none waits.
TEST(MpiEngine, EveryRankRefusesACheckpointOfAnotherModel) {
    const int n = world();
    RankRun small(load(config_text(kStages[2], 1, 0.0), n), true);
    SharedDir dir(small.engine().communicator());
    ASSERT_TRUE(small.train_until(1).is_ok());
    ASSERT_TRUE(small.engine().save_checkpoint(dir.path(), "s").is_ok());
    std::string other = config_text(kStages[2], 1, 0.0);
    other.replace(other.find("[24, 32, 16, 4]"), 15, "[24, 40, 16, 4]");
    RankRun wide(load(other, n), true);
    const Status s = wide.engine().load_checkpoint(dir.path(), "s");
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("model_numel"), std::string::npos) << s.to_string();
}

TEST(MpiEngine, ABatchTheRanksCannotShareIsRefusedByName) {
    const int n = world();
    config::LoadOptions o;
    o.log_warnings = false;
    o.world_size = n;
    std::string text = config_text(kStages[0], 1, 0.0);
    text.replace(text.find("\"train_micro_batch_size_per_gpu\": 8"), 35,
                 "\"train_batch_size\": " + std::to_string(8 * n + 1));
    auto c = config::load_from_string(text, o, "x.json");
    ASSERT_FALSE(c.has_value());
    EXPECT_NE(c.error().message().find("world size " + std::to_string(n)), std::string::npos)
        << c.error().to_string();
}

}  // namespace
}  // namespace zinf
