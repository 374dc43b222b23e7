// Host memory does not grow with the model under NVMe offload: zinfinity-train runs the same MLP
// at 1x, 2x and 4x its layers with parameters and optimizer states on NVMe, and the peak RSS of
// each run (the child's own, from wait4) stays within 10 % of the 1x run's with the gradients
// streamed (the default), while with zero_optimization.offload_optimizer.stream_gradients false
// (the gradient partition in host memory) it grows by at least most of the gradients' bytes:
// the control that shows the check can fail.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>  // environ

#include <cstdio>
#include <string>
#include <vector>

#include "tests/support/test_seed.h"

namespace zinf {
namespace {

struct Child {
    int exit_code = -1;
    double peak_rss_mib = 0;
};

// Runs zinfinity-train with `args`, its output to `log`; returns its exit code and peak RSS.
Child run_train(const std::vector<std::string>& args, const std::string& log) {
    std::vector<std::string> argv_s = {ZINF_TRAIN_BINARY};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    pid_t pid = 0;
    Child c;
    const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) return c;
    int status = 0;
    rusage usage{};
    if (::wait4(pid, &status, 0, &usage) != pid) return c;
    c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    c.peak_rss_mib = static_cast<double>(usage.ru_maxrss) / 1024.0;
    return c;
}

std::string layers(int copies) {
    std::string s = "model.layers=[512";
    for (int i = 0; i < 8 * copies; ++i) s += ",1024";
    return s + ",10]";
}

// Writes `text` to `path`; false when it cannot.
bool write_text(const std::string& path, const char* text) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) return false;
    const bool written = std::fputs(text, f) >= 0;
    return std::fclose(f) == 0 && written;
}

TEST(MemoryScaling, PeakRssIsFlatOverModelSizeWithStreamedGradients) {
    test::TempDir dir("scaling");
    const std::string config = dir.file("mlp.json");
    ASSERT_TRUE(write_text(config, R"({
  "train_micro_batch_size_per_gpu": 8,
  "steps_per_print": 100,
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 0.0001}},
  "zero_optimization": {
    "stage": 3, "sub_group_size": 1048576, "stage3_prefetch_bucket_size": 1048576,
    "stage3_max_live_parameters": 4194304, "stage3_param_persistence_threshold": 0,
    "offload_param": {"device": "nvme", "nvme_path": "SWAP", "buffer_count": 4,
                      "buffer_size": 1048576, "max_in_cpu": 4194304},
    "offload_optimizer": {"device": "nvme", "nvme_path": "SWAP"}
  },
  "model": {"type": "mlp", "layers": [512, 1024, 10]},
  "data": {"dataset": "synthetic", "synthetic_samples": 64, "max_steps": 2},
  "device": {"type": "cpu", "memory_budget": 33554432, "host_memory_budget": 268435456}
})"));
    const std::string swap = dir.file("swap");
    std::vector<double> streamed, held;
    for (const bool stream : {true, false}) {
        for (int copies : {1, 2, 4}) {
            const std::string log =
                dir.file("log-" + std::to_string(copies) + (stream ? "-s" : "-h"));
            const Child c =
                run_train({"--config", config, "--no-eval", "--set", layers(copies), "--set",
                           "zero_optimization.offload_param.nvme_path=" + swap, "--set",
                           "zero_optimization.offload_optimizer.nvme_path=" + swap, "--set",
                           std::string("zero_optimization.offload_optimizer.stream_gradients=") +
                               (stream ? "true" : "false")},
                          log);
            ASSERT_EQ(c.exit_code, 0) << test::read_text(log);
            std::printf("%dx (%d hidden layers of 1024), gradients %s: peak RSS %.1f MiB\n", copies,
                        8 * copies, stream ? "streamed" : "in host memory", c.peak_rss_mib);
            (stream ? streamed : held).push_back(c.peak_rss_mib);
        }
    }
    // Streamed: flat within 10 %, and under the host budget + 512 MiB.
    for (double rss : streamed) {
        EXPECT_LE(rss, 1.10 * streamed[0]);
        EXPECT_LE(rss, 256.0 + 512.0);
    }
    // In host memory: 4x holds 24 M more bf16 gradients (48 MiB) than 1x.
    EXPECT_GE(held[2] - held[0], 40.0);
}

// --measure-overlap keeps to the budgets training keeps to: on a model whose optimizer states
// (540 MiB) are four times the host budget (128 MiB), its three passes stay within the device
// budget + the host budget + 512 MiB of peak RSS (on the CPU device the device budget is host
// memory too). A compute-only pass with every state in memory (what the pass did before) would
// hold the states, the parameters and the gradients at once: more than that bound.
TEST(MemoryScaling, MeasureOverlapStaysWithinTheBudgets) {
    test::TempDir dir("overlap");
    const std::string config = dir.file("mlp.json");
    const std::string swap = dir.file("swap");
    ASSERT_TRUE(write_text(config, R"({
  "train_micro_batch_size_per_gpu": 8,
  "steps_per_print": 100,
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 0.0001}},
  "zero_optimization": {
    "stage": 3, "sub_group_size": 1048576, "stage3_prefetch_bucket_size": 4194304,
    "stage3_max_live_parameters": 8388608, "stage3_param_persistence_threshold": 0,
    "offload_param": {"device": "nvme", "nvme_path": "SWAP", "buffer_count": 4,
                      "buffer_size": 4194304, "max_in_cpu": 8388608},
    "offload_optimizer": {"device": "nvme", "nvme_path": "SWAP"}
  },
  "model": {"type": "mlp", "layers": [512, 2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048,
                                      2048, 2048, 2048, 2048, 10]},
  "data": {"dataset": "synthetic", "synthetic_samples": 64, "max_steps": 1},
  "device": {"type": "cpu", "memory_budget": 134217728, "host_memory_budget": 134217728}
})"));
    const std::string log = dir.file("log");
    const Child c =
        run_train({"--config", config, "--no-eval", "--measure-overlap", "--overlap-steps", "1",
                   "--set", "zero_optimization.offload_param.nvme_path=" + swap, "--set",
                   "zero_optimization.offload_optimizer.nvme_path=" + swap},
                  log);
    const std::string out = test::read_text(log);
    ASSERT_EQ(c.exit_code, 0) << out;
    std::printf("--measure-overlap, 540 MiB of optimizer states: peak RSS %.1f MiB\n",
                c.peak_rss_mib);
    EXPECT_NE(out.find("optimizer states (fp32 master + 2 fp32 states, 12 B per parameter, "
                       "540.52 MiB): nvme"),
              std::string::npos)
        << out;
    EXPECT_LE(c.peak_rss_mib, 128.0 + 128.0 + 512.0) << out;
    // The compute-only pass ran with its I/O discarded, not skipped.
    const auto at = out.find("its I/O discarded: ");
    ASSERT_NE(at, std::string::npos) << out;
    EXPECT_GT(std::stoull(out.substr(at + std::string("its I/O discarded: ").size())), 0u) << out;
}

}  // namespace
}  // namespace zinf
