// zinfinity-train end to end: the shipped Fashion-MNIST configs give bitwise the same loss at
// every step with and without optimizer offload; a run resumed from a checkpoint continues
// bitwise; bad configs fail with the key named; --help works.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "src/data/dataset.h"
#include "tests/support/test_seed.h"
#include "tests/tools/svg_check.h"

namespace zinf {
namespace {

struct RunResult {
    int exit_code = -1;
    std::string out;
};

std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

RunResult train(const test::TempDir& dir, const std::string& args) {
    const std::string out = dir.file("out.txt");
    const std::string cmd = std::string(ZINF_TRAIN_BINARY) + " " + args + " > " + out + " 2>&1";
    const int status = std::system(cmd.c_str());
    RunResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    return r;
}

std::vector<std::string> lines(const std::string& path) {
    std::vector<std::string> v;
    std::ifstream in(path);
    for (std::string l; std::getline(in, l);) v.push_back(l);
    return v;
}

// What a swap directory holds besides its lock file (top level): the swap files belong to the
// run, so after a run has ended, nothing.
std::vector<std::string> left_in_swap(const std::string& swap) {
    std::vector<std::string> left;
    for (const auto& e : std::filesystem::directory_iterator(swap)) {
        if (e.path().filename() != "zinfinity-swap.lock") left.push_back(e.path().string());
    }
    return left;
}

bool have_fashion_mnist() {
    return std::filesystem::exists(std::string(data::kFashionMnistDirectory) +
                                   "/train-images-idx3-ubyte.gz");
}

TEST(TrainCliTest, OffloadDoesNotChangeTheLoss) {
    if (!have_fashion_mnist())
        GTEST_SKIP() << "no Fashion-MNIST: " << data::kFashionMnistPackageHint;
    test::TempDir dir("train");
    std::vector<std::vector<std::string>> logs;
    // The NVMe config's swap files go to this test's directory (one run per nvme_path).
    const std::string nvme =
        " --set zero_optimization.offload_param.nvme_path=" + dir.file("swap") +
        " --set zero_optimization.offload_optimizer.nvme_path=" + dir.file("swap");
    for (const char* config :
         {"fashion-mnist.json", "fashion-mnist-cpu.json", "fashion-mnist-nvme.json"}) {
        const std::string log = dir.file(std::string(config) + ".losses");
        const bool on_nvme = std::string(config).find("nvme") != std::string::npos;
        const RunResult r =
            train(dir, std::string("--config ") + ZINF_CONFIG_DIR + "/" + config +
                           " --max-steps 6 --no-eval --loss-log " + log + (on_nvme ? nvme : ""));
        ASSERT_EQ(r.exit_code, 0) << r.out;
        logs.push_back(lines(log));
        ASSERT_EQ(logs.back().size(), 6u) << r.out;
    }
    EXPECT_EQ(logs[0], logs[1]);
    EXPECT_EQ(logs[0], logs[2]);
    EXPECT_EQ(left_in_swap(dir.file("swap")), std::vector<std::string>{});
}

// Parameters and optimizer on NVMe under budgets that force eviction, with --measure-overlap:
// the three passes run and print, I/O figures appear on the step lines.
TEST(TrainCliTest, NvmeOffloadWithMeasureOverlap) {
    test::TempDir dir("train");
    const std::string config = dir.file("nvme.json");
    std::ofstream(config) << R"({
  "train_micro_batch_size_per_gpu": 32,
  "steps_per_print": 2,
  "seed": 3,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.005}},
  "zero_optimization": {"stage": 3, "sub_group_size": 300,
    "stage3_param_persistence_threshold": 0, "stage3_max_live_parameters": 600,
    "offload_param": {"device": "nvme", "nvme_path": ")" +
                                 dir.file("swap") + R"(",
                      "buffer_count": 2, "buffer_size": 640, "max_in_cpu": 1400},
    "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                                 dir.file("swap") + R"(",
                          "pipeline_read": true, "pipeline_write": true}},
  "bf16": {"enabled": true},
  "model": {"type": "mlp", "layers": [16, 40, 16, 5]},
  "data": {"dataset": "synthetic", "synthetic_samples": 320, "epochs": 1},
  "device": {"type": "cpu", "memory_budget": 16777216},
  "cpu_optimizer": {"threads": 1}
})";
    const RunResult r =
        train(dir, "--config " + config + " --measure-overlap --overlap-steps 2 --trace " +
                       dir.file("trace.json"));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("parameters: nvme ("), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("I/O read "), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("I/O read 0 B"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("compute-only:"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("real / max(compute-only, I/O-only) = "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("write-backs"), std::string::npos) << r.out;
    // The trace shows the parameters' reads from NVMe next to compute and optimizer spans.
    const std::string trace = slurp(dir.file("trace.json"));
    EXPECT_NE(trace.find("swap in\""), std::string::npos);
    EXPECT_NE(trace.find("\"forward\""), std::string::npos);
    EXPECT_NE(trace.find("\"optimizer\""), std::string::npos);

    // The same with copy-on-write states and a checkpoint copied in the background: the
    // compute-only pass discards the steps' shadow writes too, which leaves the states as they
    // were instead of committing them.
    const RunResult cow =
        train(dir, "--config " + config + " --measure-overlap --overlap-steps 2 --save-dir " +
                       dir.file("ckpt") + " --set swap.background_checkpoint=true");
    ASSERT_EQ(cow.exit_code, 0) << cow.out;
    EXPECT_NE(cow.out.find("copy-on-write for background checkpoints"), std::string::npos)
        << cow.out;
    EXPECT_NE(cow.out.find("optimizer states copied beside training"), std::string::npos)
        << cow.out;
    EXPECT_NE(cow.out.find("real / max(compute-only, I/O-only) = "), std::string::npos) << cow.out;

    // The step beside backward: the real pass speculates (the first window records the order),
    // a sequential pass is timed beside it, and the summary counts what the speculations became.
    const RunResult beside =
        train(dir, "--config " + config + " --measure-overlap --overlap-steps 3 --set " +
                       "swap.overlap_step=true --set " +
                       "zero_optimization.offload_optimizer.stream_gradients=false");
    ASSERT_EQ(beside.exit_code, 0) << beside.out;
    EXPECT_NE(beside.out.find("copy-on-write: the step runs beside backward"), std::string::npos)
        << beside.out;
    EXPECT_NE(beside.out.find("sequential:   "), std::string::npos) << beside.out;
    EXPECT_NE(beside.out.find(" committed, "), std::string::npos) << beside.out;
    EXPECT_EQ(beside.out.find(" 0 committed, "), std::string::npos) << beside.out;
    EXPECT_NE(beside.out.find("optimizer step beside backward (swap.overlap_step): "),
              std::string::npos)
        << beside.out;
}

// --io-faults: a failed read or write stops the run naming the injected fault, the swap
// directory is left empty (its lock file aside), and a bad plan is refused before training.
TEST(TrainCliTest, InjectedIoFaultStopsTheRunNamingItAndLeavesNoSwapFile) {
    test::TempDir dir("train");
    const std::string config = dir.file("nvme.json");
    std::ofstream(config) << R"({
  "train_micro_batch_size_per_gpu": 32,
  "seed": 3,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.005}},
  "zero_optimization": {"stage": 3, "sub_group_size": 300,
    "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                                 dir.file("swap") + R"("}},
  "model": {"type": "mlp", "layers": [16, 40, 16, 5]},
  "data": {"dataset": "synthetic", "synthetic_samples": 320, "epochs": 1},
  "device": {"type": "cpu"},
  "cpu_optimizer": {"threads": 1}
})";
    const RunResult clean = train(dir, "--config " + config);
    ASSERT_EQ(clean.exit_code, 0) << clean.out;
    const RunResult r = train(dir, "--config " + config + " --io-faults fail_nth=20,errno=EIO");
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("(a fault --io-faults injected)"), std::string::npos) << r.out;
    std::size_t files = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir.file("swap"))) {
        if (e.is_regular_file() && e.path().filename() != "zinfinity-swap.lock") ++files;
    }
    EXPECT_EQ(files, 0u);
    const RunResult bad = train(dir, "--config " + config + " --io-faults fail_nth=x");
    EXPECT_EQ(bad.exit_code, 1) << bad.out;
    EXPECT_NE(bad.out.find("--io-faults: "), std::string::npos) << bad.out;
    EXPECT_EQ(bad.out.find("step 1"), std::string::npos) << bad.out;
}

// Runs `script` with bash ($TRAIN set), capturing stdout and stderr.
RunResult run_script(const test::TempDir& dir, const std::string& script) {
    const std::string file = dir.file("run.sh");
    std::ofstream(file) << "TRAIN='" << ZINF_TRAIN_BINARY << "'\n" << script << "\n";
    const std::string out = dir.file("script-out.txt");
    const int status = std::system(("bash " + file + " > " + out + " 2>&1").c_str());
    RunResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    return r;
}

// A run stopped by a termination signal (mpirun stopping a rank after another one failed, a
// closed terminal, Ctrl-C) removes its swap run directory, then dies of the signal (exit status
// 128 + signal). Issue 32: the directory and its swap file stayed until the next run on the path.
TEST(TrainCliTest, ARunStoppedByATerminationSignalRemovesItsSwapFilesAndDiesOfTheSignal) {
    test::TempDir dir("train");
    const std::string swap = dir.file("swap");
    const std::string config = dir.file("nvme.json");
    std::ofstream(config) << R"({
  "train_micro_batch_size_per_gpu": 32,
  "seed": 3,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.005}},
  "zero_optimization": {"stage": 3,
    "offload_param": {"device": "nvme", "nvme_path": ")" +
                                 swap + R"("},
    "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                                 swap + R"("}},
  "model": {"type": "mlp", "layers": [16, 40, 16, 5]},
  "data": {"dataset": "synthetic", "synthetic_samples": 320, "epochs": 1000000},
  "device": {"type": "cpu"},
  "cpu_optimizer": {"threads": 1}
})";
    for (const auto& [name, number] : {std::pair{"TERM", 15}, {"HUP", 1}, {"INT", 2}}) {
        // `trap - INT`: bash starts background commands with SIGINT ignored, and the watcher
        // rightly leaves an ignored signal ignored. The clean-up line is at level info.
        std::string script = "(trap - INT; ZINF_LOG_LEVEL=info exec $TRAIN --config ";
        script.append(config).append(" --no-eval --progress off) > ");
        script.append(dir.file("train-out.txt")).append(" 2>&1 &\npid=$!\n");
        script.append("for i in $(seq 600); do ls -d ").append(swap);
        script.append("/zinf-run-* >/dev/null 2>&1 && break; sleep 0.05; done\nsleep 0.3\n");
        script.append("kill -").append(name).append(" $pid\nwait $pid; echo exit=$?");
        const RunResult r = run_script(dir, script);
        const std::string train_out = test::read_text(dir.file("train-out.txt"));
        EXPECT_NE(r.out.find("exit=" + std::to_string(128 + number)), std::string::npos)
            << name << ": " << r.out << train_out;
        EXPECT_NE(train_out.find(std::string("stopped by SIG") + name + " (" +
                                 std::to_string(number) + "): removed 1 swap run directory"),
                  std::string::npos)
            << train_out;
        EXPECT_EQ(left_in_swap(swap), std::vector<std::string>{}) << name;
    }
}

const char* kSmallConfig = R"({
  "train_micro_batch_size_per_gpu": 32,
  "steps_per_print": 2,
  "seed": 3,
  "optimizer": {"type": "Adam", "params": {"lr": 0.005}},
  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
  "bf16": {"enabled": true},
  "model": {"type": "mlp", "layers": [16, 32, 5], "dropout": 0.1},
  "data": {"dataset": "synthetic", "synthetic_samples": 320, "epochs": 2},
  "device": {"type": "cpu", "memory_budget": 16777216},
  "cpu_optimizer": {"threads": 1}
})";

TEST(TrainCliTest, ResumeThroughTheToolIsBitwiseExact) {
    test::TempDir dir("train");
    const std::string config = dir.file("small.json");
    std::ofstream(config) << kSmallConfig;
    const RunResult full =
        train(dir, "--config " + config + " --loss-log " + dir.file("full.losses"));
    ASSERT_EQ(full.exit_code, 0) << full.out;
    EXPECT_NE(full.out.find("train accuracy"), std::string::npos) << full.out;
    EXPECT_NE(full.out.find("summary:"), std::string::npos) << full.out;
    const RunResult first =
        train(dir, "--config " + config + " --max-steps 7 --no-eval --save-dir " +
                       dir.file("ckpt") + " --loss-log " + dir.file("a.losses"));
    ASSERT_EQ(first.exit_code, 0) << first.out;
    const RunResult second =
        train(dir, "--config " + config + " --no-eval --resume " + dir.file("ckpt") + " --trace " +
                       dir.file("trace.json") + " --loss-log " + dir.file("b.losses"));
    ASSERT_EQ(second.exit_code, 0) << second.out;
    auto resumed = lines(dir.file("a.losses"));
    const auto rest = lines(dir.file("b.losses"));
    resumed.insert(resumed.end(), rest.begin(), rest.end());
    EXPECT_EQ(resumed, lines(dir.file("full.losses")));
    const std::string trace = slurp(dir.file("trace.json"));
    EXPECT_NE(trace.find("\"traceEvents\""), std::string::npos);
    EXPECT_NE(trace.find("\"optimizer\""), std::string::npos);
}

// The losses of a loss log by micro-step; a line cut short by a kill (no fp32 bits after the
// loss) is left out.
std::map<long, std::string> losses_by_step(const std::string& path) {
    std::map<long, std::string> m;
    for (const std::string& l : lines(path)) {
        std::istringstream in(l);
        long step = 0;
        std::string loss, bits;
        if (in >> step >> loss >> bits && bits.size() == 8) m[step] = loss.append(" ").append(bits);
    }
    return m;
}

// kill -9 at many points of a run that checkpoints every step with the optimizer states copied
// in the background (swap.background_checkpoint): each run resumes from `latest` and is killed
// again, a little further in each time. `latest` must always name a complete checkpoint (the
// next run resumes from it), every loss computed on the way equals the uninterrupted run's at
// the same micro-step, the last run ends with the same losses, and the killed runs' swap files
// are gone once a run has ended.
TEST(TrainCliTest, KilledWhileCheckpointingInTheBackgroundLeavesTheLastCompleteCheckpoint) {
    test::TempDir dir("train");
    const std::string swap = dir.file("swap");
    const std::string config = dir.file("nvme.json");
    std::ofstream(config) << R"({
  "train_micro_batch_size_per_gpu": 32,
  "seed": 5,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.002}},
  "zero_optimization": {"stage": 3, "sub_group_size": 100000,
    "offload_param": {"device": "nvme", "nvme_path": ")" +
                                 swap + R"(", "buffer_count": 4, "buffer_size": 600000,
                      "max_in_cpu": 1200000},
    "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                                 swap + R"("}},
  "swap": {"background_checkpoint": true},
  "model": {"type": "mlp", "layers": [128, 768, 768, 10]},
  "data": {"dataset": "synthetic", "synthetic_samples": 320, "epochs": 6},
  "device": {"type": "cpu", "memory_budget": 67108864},
  "cpu_optimizer": {"threads": 1}
})";
    const std::string common = "--config " + config + " --no-eval --progress off --save-every 1";
    // The uninterrupted run, timed: to its first complete checkpoint (`latest` appears) and to
    // its end. The kill points below are placed by these two times, so that they fall alike
    // on a slow build (sanitizers) or a loaded machine.
    const std::string ref = dir.file("ref");
    const RunResult timing = run_script(
        dir, "start=$(date +%s%N)\n$TRAIN " + common + " --save-dir " + ref + " --loss-log " +
                 dir.file("full.losses") + " > " + dir.file("full-out.txt") +
                 " 2>&1 &\npid=$!\nwhile kill -0 $pid 2>/dev/null && [ ! -e " + ref +
                 "/latest ]; do sleep 0.01; done\nfirst=$(date +%s%N)\nwait $pid; rc=$?\n"
                 "echo rc=$rc first_ms=$(( (first - start) / 1000000 )) "
                 "total_ms=$(( ($(date +%s%N) - start) / 1000000 ))");
    const std::string full_out = test::read_text(dir.file("full-out.txt"));
    ASSERT_NE(timing.out.find("rc=0 "), std::string::npos) << timing.out << full_out;
    ASSERT_NE(full_out.find("checkpoints in the background"), std::string::npos) << full_out;
    long first_ms = 0;
    long total_ms = 0;
    ASSERT_EQ(std::sscanf(timing.out.substr(timing.out.find("first_ms=")).c_str(),
                          "first_ms=%ld total_ms=%ld", &first_ms, &total_ms),
              2)
        << timing.out;
    const double first = static_cast<double>(first_ms) / 1000.0;
    const double seconds = static_cast<double>(total_ms) / 1000.0;
    const auto reference = losses_by_step(dir.file("full.losses"));
    ASSERT_EQ(reference.size(), 60u);

    const std::string ckpt = dir.file("ckpt");
    constexpr int kKills = 12;
    int killed = 0;
    int resumed = 0;
    for (int i = 0; i < kKills; ++i) {
        // Two points before the first checkpoint is complete, the others spread over the first
        // 60 % of the training after it, in a scrambled order; a run that ends before its kill
        // starts the next one afresh.
        const double frac = ((i * 5) % kKills + 0.5) / kKills;
        const double at = i % 6 == 0 ? first * frac : first + 0.6 * (seconds - first) * frac;
        const std::string log = dir.file("part" + std::to_string(i) + ".losses");
        std::string script = "resume=; [ -e " + ckpt;
        script.append("/latest ] && resume='--resume ").append(ckpt);
        script.append("'\necho resume=$resume\n$TRAIN ").append(common);
        script.append(" --save-dir ").append(ckpt).append(" $resume --loss-log ").append(log);
        script.append(" > ").append(dir.file("part-out.txt")).append(" 2>&1 &\npid=$!\nsleep ");
        script.append(std::to_string(at)).append("\nkill -KILL $pid\nwait $pid; echo exit=$?");
        const RunResult r = run_script(dir, script);
        const std::string out = test::read_text(dir.file("part-out.txt"));
        if (r.out.find("exit=137") != std::string::npos) {
            ++killed;
        } else {
            ASSERT_NE(r.out.find("exit=0"), std::string::npos) << r.out << out;
            std::filesystem::remove_all(ckpt);
        }
        if (r.out.find("resume=--resume") != std::string::npos) ++resumed;
        for (const auto& [step, loss] : losses_by_step(log)) {
            ASSERT_TRUE(reference.count(step)) << step;
            EXPECT_EQ(loss, reference.at(step)) << "kill " << i << ", micro-step " << step;
        }
    }
    std::printf(
        "%d of %d runs killed part-way, %d resumed from latest (a whole run: %.2f s, its first "
        "checkpoint complete at %.2f s)\n",
        killed, kKills, resumed, seconds, first);
    EXPECT_GE(killed, kKills / 2) << "most runs must have been killed part-way (the whole run took "
                                  << seconds << " s)";
    EXPECT_GE(resumed, 2) << "the killed runs left no checkpoint to resume from";

    // The last run goes on from `latest` (or from the start) to the end.
    const std::string resume =
        std::filesystem::exists(ckpt + "/latest") ? " --resume " + ckpt : std::string();
    const RunResult last = train(
        dir, common + " --save-dir " + ckpt + resume + " --loss-log " + dir.file("last.losses"));
    ASSERT_EQ(last.exit_code, 0) << last.out;
    const auto tail = losses_by_step(dir.file("last.losses"));
    for (const auto& [step, loss] : tail) EXPECT_EQ(loss, reference.at(step)) << step;
    if (!tail.empty()) {
        EXPECT_EQ(tail.rbegin()->first, reference.rbegin()->first);
    }
    EXPECT_EQ(left_in_swap(swap), std::vector<std::string>{});
}

// swap.background_checkpoint where it cannot apply (here the optimizer states in host memory):
// a warning says so, and the checkpoints are written in the foreground.
TEST(TrainCliTest, BackgroundCheckpointWithoutNvmeStatesWarnsAndSavesInTheForeground) {
    test::TempDir dir("train");
    const std::string config = dir.file("small.json");
    std::ofstream(config) << kSmallConfig;
    const RunResult r = train(dir, "--config " + config + " --max-steps 2 --no-eval --save-dir " +
                                       dir.file("ckpt") + " --set swap.background_checkpoint=true");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("swap.background_checkpoint: checkpoints are written in the foreground "
                         "(the optimizer states are not on NVMe"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("checkpoints in the background"), std::string::npos) << r.out;
    EXPECT_TRUE(std::filesystem::exists(dir.file("ckpt") + "/latest")) << r.out;
}

// The progress line is redrawn (carriage returns on stderr) with --progress on, and not by
// default when stderr is not a terminal (here a file), however long the run. It appears after
// two seconds: each run trains for longer than that.
TEST(TrainCliTest, ProgressLineOnlyWhereAsked) {
    test::TempDir dir("train");
    const std::string config = dir.file("small.json");
    std::ofstream(config) << kSmallConfig;
    const std::string long_run = "--config " + config +
                                 " --set data.epochs=1000000 --set steps_per_print=1000000"
                                 " --no-eval --max-steps 15000";
    auto timed = [&](const std::string& args) {
        const auto start = std::chrono::steady_clock::now();
        RunResult r = train(dir, args);
        return std::make_pair(r, std::chrono::steady_clock::now() - start);
    };
    auto [shown, shown_time] = timed(long_run + " --progress on");
    ASSERT_EQ(shown.exit_code, 0) << shown.out;
    if (shown_time < std::chrono::milliseconds(2500)) {
        GTEST_SKIP() << "the run took under 2.5 s: too short for the progress line to appear";
    }
    EXPECT_NE(shown.out.find("\rtrain "), std::string::npos) << shown.out.substr(0, 400);
    const RunResult piped = train(dir, long_run);
    ASSERT_EQ(piped.exit_code, 0) << piped.out;
    EXPECT_EQ(piped.out.find('\r'), std::string::npos) << piped.out.substr(0, 400);
}

// The seed's evaluation after training: --eval-only --resume evaluates the saved model without
// training (the same accuracy the run printed), and --predict N shows N test samples, with a
// PNG grid for image data.
TEST(TrainCliTest, EvalOnlyAndPredictFromACheckpoint) {
    if (!have_fashion_mnist())
        GTEST_SKIP() << "no Fashion-MNIST: " << data::kFashionMnistPackageHint;
    test::TempDir dir("train");
    const std::string config = std::string(ZINF_CONFIG_DIR) + "/fashion-mnist.json";
    const RunResult trained =
        train(dir, "--config " + config + " --max-steps 30 --save-dir " + dir.file("ckpt"));
    ASSERT_EQ(trained.exit_code, 0) << trained.out;
    const auto at = trained.out.find("epoch 1: test accuracy ");
    ASSERT_NE(at, std::string::npos) << trained.out;
    const std::string accuracy = trained.out.substr(at + 23, trained.out.find('\n', at) - at - 23);

    const std::string png = dir.file("grid.png");
    const RunResult r = train(dir, "--config " + config + " --eval-only --resume " +
                                       dir.file("ckpt") + " --predict 12 --predict-png " + png);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("evaluation only (no training) of the checkpoint at step 30: test "
                         "accuracy " +
                         accuracy),
              std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("\nstep "), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("summary:"), std::string::npos) << r.out;
    std::size_t predicted = 0;
    for (auto p = r.out.find("predict: sample "); p != std::string::npos;
         p = r.out.find("predict: sample ", p + 1)) {
        ++predicted;
    }
    EXPECT_EQ(predicted, 12u) << r.out;
    EXPECT_NE(r.out.find(" of 12 right"), std::string::npos) << r.out;
    EXPECT_EQ(slurp(png).substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));

    const RunResult no_resume = train(dir, "--config " + config + " --eval-only");
    EXPECT_NE(no_resume.exit_code, 0);
    EXPECT_NE(no_resume.out.find("--eval-only: needs --resume"), std::string::npos)
        << no_resume.out;
}

// A save or swap directory another user could write into is refused before any training, with
// the flag or key, the directory and its mode named; nothing is written into it.
TEST(TrainCliTest, UntrustedSaveAndSwapDirectoriesAreRefusedBeforeTraining) {
    test::TempDir dir("train");
    const std::string config = dir.file("small.json");
    std::ofstream(config) << kSmallConfig;
    const std::string open = dir.file("open");
    ASSERT_EQ(::mkdir(open.c_str(), 0700), 0);
    ASSERT_EQ(::chmod(open.c_str(), 0777), 0);
    RunResult r = train(dir, "--config " + config + " --max-steps 2 --save-dir " + open);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("--save-dir"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(open + " (owner"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("mode 0777"), std::string::npos) << r.out;
    EXPECT_TRUE(std::filesystem::is_empty(open));
    r = train(dir, "--config " + config +
                       " --max-steps 2 --set zero_optimization.stage=3"
                       " --set zero_optimization.offload_optimizer.device=nvme"
                       " --set zero_optimization.offload_optimizer.nvme_path=" +
                       open);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("zero_optimization.offload_optimizer.nvme_path"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("mode 0777"), std::string::npos) << r.out;
    EXPECT_TRUE(std::filesystem::is_empty(open));
}

// --plot and the csv_monitor block on one run: the SVG parses, with one point per step in every
// per-step series and one per evaluation; the CSV files hold the run's losses (--loss-log, one
// micro-step per step) at DeepSpeed's x values, in DeepSpeed's file names and header.
TEST(TrainCliTest, PlotAndCsvMonitorDrawTheRunsFigures) {
    test::TempDir dir("train");
    const std::string config = dir.file("small.json");
    std::ofstream(config) << kSmallConfig;
    const std::string svg = dir.file("curves.svg");
    const RunResult r = train(
        dir, "--config " + config + " --max-steps 12 --eval-every 4 --plot " + svg +
                 " --loss-log " + dir.file("losses") +
                 " --set csv_monitor.enabled=true --set csv_monitor.output_path=" + dir.path() +
                 " --set csv_monitor.job_name=job");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const test::SvgDocument doc = test::check_svg(slurp(svg));
    ASSERT_EQ(doc.error, "") << r.out;
    ASSERT_EQ(doc.polylines.size(), 6u);
    for (const auto& p : doc.polylines) {
        const std::string& series = p.at("data-series");
        // Evaluations at steps 4, 8, 10 (the end of the first epoch) and 12.
        const std::size_t expected = series == "eval_loss" ? 4u : 12u;
        EXPECT_EQ(test::SvgDocument::point_count(p), expected) << series;
    }
    const std::vector<std::string> losses = lines(dir.file("losses"));
    ASSERT_EQ(losses.size(), 12u);
    const std::string csv = slurp(dir.file("job/Train_Samples_train_loss.csv"));
    std::istringstream rows(csv);
    std::string row;
    ASSERT_TRUE(std::getline(rows, row));
    EXPECT_EQ(row, "step,train_loss\r");
    for (std::size_t k = 0; k < losses.size(); ++k) {
        ASSERT_TRUE(std::getline(rows, row)) << csv;
        // "step loss bits" in the log; "samples before the step,loss" in the CSV, the same
        // float (Python writes its shortest double, the log 9 digits).
        std::istringstream log(losses[k]);
        std::string step, logged;
        log >> step >> logged;
        const auto comma = row.find(',');
        ASSERT_NE(comma, std::string::npos) << row;
        EXPECT_EQ(row.substr(0, comma), std::to_string(32 * k));
        EXPECT_EQ(std::stof(row.substr(comma + 1)), std::stof(logged)) << row;
    }
    EXPECT_FALSE(std::getline(rows, row)) << csv;
    EXPECT_NE(slurp(dir.file("job/Train_Samples_lr.csv")).find("step,lr\r\n32,"),
              std::string::npos);
    EXPECT_NE(slurp(dir.file("job/Train_Samples_eval_loss.csv")).find("step,eval_loss\r\n128,"),
              std::string::npos);
}

// A --plot path that cannot be written is refused before the data or the engine is touched.
TEST(TrainCliTest, PlotToAMissingDirectoryFailsBeforeTraining) {
    test::TempDir dir("train");
    const std::string config = dir.file("small.json");
    std::ofstream(config) << kSmallConfig;
    const RunResult r = train(
        dir, "--config " + config + " --max-steps 2 --plot " + dir.file("missing/curves.svg"));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("--plot " + dir.file("missing/curves.svg")), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("step "), std::string::npos) << r.out;
}

TEST(TrainCliTest, BadConfigNamesTheKey) {
    test::TempDir dir("train");
    const std::string config = dir.file("small.json");
    std::ofstream(config) << kSmallConfig;
    RunResult r = train(dir, "--config " + config + " --set zero_optimization.stag=2");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("did you mean 'zero_optimization.stage'"), std::string::npos) << r.out;
    r = train(dir, "--config " + config +
                       " --set zero_optimization.stage=0 "
                       "--set zero_optimization.offload_optimizer.device=cpu");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("offload_optimizer.device"), std::string::npos) << r.out;
    r = train(dir, "--config " + config + " --set train_batch_size=33");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("train_batch_size"), std::string::npos) << r.out;
    r = train(dir, "--config " + config + " --progress sometimes");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("--progress: expected auto, on or off, got 'sometimes'"),
              std::string::npos)
        << r.out;
    r = train(dir, "--help");
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_NE(r.out.find("--save-dir"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("--progress"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace zinf
