// zinfinity-plan end to end: tables and JSON for shipped configs, the issue-32 crash shape
// reported as not admitted (exit 1, the key named), and no file created under the swap paths.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "tests/support/test_seed.h"

namespace zinf {
namespace {

struct RunResult {
    int exit_code = -1;
    std::string out;
};

// Runs zinfinity-plan with `args`; stdout only when `stdout_only` (JSON), else both streams.
RunResult plan(const test::TempDir& dir, const std::string& args, bool stdout_only = false) {
    const std::string out = dir.file("out.txt");
    const std::string cmd = std::string(ZINF_PLAN_BINARY) + " " + args + " > " + out +
                            (stdout_only ? " 2>/dev/null" : " 2>&1");
    const int status = std::system(cmd.c_str());
    RunResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = test::read_text(out);
    return r;
}

std::string config(const std::string& name) {
    return std::string(ZINF_CONFIG_DIR) + "/" + name;
}

// Every swap path of a config under `swap`, which must not exist afterwards.
std::string swap_paths(const std::string& swap) {
    return " --set zero_optimization.offload_param.nvme_path=" + swap +
           " --set zero_optimization.offload_optimizer.nvme_path=" + swap +
           " --set activation_checkpointing.nvme_path=" + swap + "/activations";
}

TEST(PlanCliTest, PrintsEveryTierAndThePlacementOfAShippedConfig) {
    test::TempDir dir("plan");
    const std::string swap = dir.file("swap");
    const RunResult r =
        plan(dir, "--config " + config("fashion-mnist-nvme.json") + swap_paths(swap));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    for (const char* expected :
         {"rank 0:", "parameters: nvme", "gradients: host memory", "fit in the host budget",
          "optimizer states", "device peak", "pinned host", "pageable host", "nvme",
          "gathered parameters", "admitted"}) {
        EXPECT_NE(r.out.find(expected), std::string::npos) << expected << "\n" << r.out;
    }
    EXPECT_EQ(r.out.find("NOT ADMITTED"), std::string::npos) << r.out;
    EXPECT_FALSE(std::filesystem::exists(swap)) << "zinfinity-plan created " << swap;
}

TEST(PlanCliTest, JsonParsesWithOneEntryPerRank) {
    test::TempDir dir("plan");
    const std::string swap = dir.file("swap");
    const RunResult r =
        plan(dir, "--config " + config("gpt-nvme.json") + " --ranks 2 --json" + swap_paths(swap),
             /*stdout_only=*/true);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    EXPECT_TRUE(j.at("admitted").get<bool>());
    EXPECT_EQ(j.at("ranks").get<int>(), 2);
    ASSERT_EQ(j.at("per_rank").size(), 2u);
    for (const auto& rank : j.at("per_rank")) {
        EXPECT_TRUE(rank.at("admitted").get<bool>());
        EXPECT_EQ(rank.at("placement").at("parameters").get<std::string>(), "nvme");
        EXPECT_EQ(rank.at("placement").at("optimizer_states").get<std::string>(), "nvme");
        const auto& device = rank.at("device");
        EXPECT_GT(device.at("total_bytes").get<std::uint64_t>(), 0u);
        EXPECT_LE(device.at("total_bytes").get<std::uint64_t>(),
                  device.at("budget_bytes").get<std::uint64_t>());
        EXPECT_TRUE(device.at("exact").get<bool>());
        EXPECT_GT(rank.at("nvme").at("optimizer states").get<std::uint64_t>(), 0u);
        EXPECT_GT(rank.at("nvme").at("activations").get<std::uint64_t>(), 0u);
        EXPECT_GT(rank.at("pinned_host").at("total_bytes").get<std::uint64_t>(), 0u);
    }
    EXPECT_FALSE(std::filesystem::exists(swap)) << "zinfinity-plan created " << swap;
}

// Issue 32's crash shape: big-mlp-nvme.json at two 8192 x 8192 layers with a 1 GiB device budget.
constexpr const char* kCrashShape =
    " --set model.layers=[1024,8192,8192,8192,10] --set device.memory_budget=1073741824"
    " --set device.host_memory_budget=4294967296"
    " --set zero_optimization.offload_param.buffer_size=67108864"
    " --set zero_optimization.offload_param.max_in_cpu=134217728";

TEST(PlanCliTest, CrashShapeIsNotAdmittedAndNamesTheKey) {
    test::TempDir dir("plan");
    const std::string swap = dir.file("swap");
    const std::string args =
        "--config " + config("big-mlp-nvme.json") + kCrashShape + swap_paths(swap);
    const RunResult r = plan(dir, args);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("NOT ADMITTED"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("device.memory_budget"), std::string::npos) << r.out;
    const RunResult j = plan(dir, args + " --json", /*stdout_only=*/true);
    EXPECT_EQ(j.exit_code, 1);
    const auto parsed = nlohmann::json::parse(j.out, nullptr, false);
    ASSERT_FALSE(parsed.is_discarded()) << j.out;
    EXPECT_FALSE(parsed.at("admitted").get<bool>());
    const auto& rank = parsed.at("per_rank").at(0);
    EXPECT_NE(rank.at("error").get<std::string>().find("device.memory_budget"), std::string::npos);
    EXPECT_GT(rank.at("device").at("total_bytes").get<std::uint64_t>(),
              rank.at("device").at("budget_bytes").get<std::uint64_t>());
    EXPECT_FALSE(std::filesystem::exists(swap)) << "zinfinity-plan created " << swap;
}

// zinfinity-bench profile --quick measures every figure the planner reads; zinfinity-plan
// --profile then predicts the step, with the optimizer states' 12 B per parameter each way.
TEST(PlanCliTest, ProfileThenPredictedStepTime) {
    test::TempDir dir("plan");
    const std::string profile = dir.file("profile.json");
    const std::string log = dir.file("profile.txt");
    const std::string cmd = std::string(ZINF_BENCH_BINARY) + " profile --quick --path " +
                            dir.path() + " --out " + profile +
                            " --block-sizes 256KiB,1MiB --queue-depths 4,16 > " + log + " 2>&1";
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << test::read_text(log);
    const auto p = nlohmann::json::parse(test::read_text(profile), nullptr, false);
    ASSERT_FALSE(p.is_discarded()) << test::read_text(profile);
    EXPECT_GT(p.at("memory_copy_gb_per_s").get<double>(), 0);
    EXPECT_GE(p.at("gemm").size(), 3u);
    for (const auto& g : p.at("gemm")) EXPECT_GT(g.at("gflop_per_s").get<double>(), 0);
    // Every point of the grid asked for, each with both directions measured.
    ASSERT_EQ(p.at("io").at("points").size(), 4u);
    for (const auto& point : p.at("io").at("points")) {
        EXPECT_GT(point.at("read_gb_per_s").get<double>(), 0);
        EXPECT_GT(point.at("write_gb_per_s").get<double>(), 0);
    }
    // Every built-in optimizer with fp32 states, and AdamW with each compressed dtype.
    std::set<std::string> measured;
    for (const auto& o : p.at("optimizer")) {
        measured.insert(o.at("type").get<std::string>() + "/" +
                        o.at("state_dtype").get<std::string>());
    }
    for (const char* expected :
         {"adam/fp32", "adamw/fp32", "adagrad/fp32", "lion/fp32", "adamw/bf16", "adamw/int8"}) {
        EXPECT_TRUE(measured.count(expected)) << expected;
    }
    // The test file is gone.
    for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
        EXPECT_EQ(entry.path().filename().string().find("zinf-bench"), std::string::npos)
            << entry.path();
    }

    const std::string swap = dir.file("swap");
    const std::string args = "--config " + config("fashion-mnist-nvme.json") + swap_paths(swap) +
                             " --profile " + profile;
    const RunResult text = plan(dir, args);
    ASSERT_EQ(text.exit_code, 0) << text.out;
    EXPECT_NE(text.out.find("predicted step time"), std::string::npos) << text.out;
    EXPECT_NE(text.out.find("optimizer states (read, updated, written back)"), std::string::npos)
        << text.out;
    const RunResult json = plan(dir, args + " --json", /*stdout_only=*/true);
    ASSERT_EQ(json.exit_code, 0) << json.out;
    const auto j = nlohmann::json::parse(json.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << json.out;
    const auto& t = j.at("per_rank").at(0).at("step_time");
    const double states = t.at("read_bytes").get<double>();
    EXPECT_NEAR(states / 1863696.0, 12.0, 1e-9) << json.out;
    EXPECT_GT(t.at("compute_s").get<double>(), 0);
    EXPECT_NEAR(t.at("step_s").get<double>(),
                t.at("compute_s").get<double>() + t.at("exposed_io_s").get<double>(), 1e-9);
    EXPECT_FALSE(std::filesystem::exists(swap)) << "zinfinity-plan created " << swap;

    // --fit with the profile: the fastest candidate that fits is chosen, with the profile's I/O
    // settings.
    const RunResult fit = plan(dir,
                               "--config " + config("big-mlp-nvme.json") + swap_paths(swap) +
                                   " --fit --device-memory 256MiB --host-memory 4GiB "
                                   "--nvme-free 64GiB --json --profile " +
                                   profile,
                               /*stdout_only=*/true);
    ASSERT_EQ(fit.exit_code, 0) << fit.out;
    const auto f = nlohmann::json::parse(fit.out, nullptr, false);
    ASSERT_FALSE(f.is_discarded()) << fit.out;
    double fastest = 1e300;
    std::string fastest_name;
    int fitting = 0;
    for (const auto& c : f.at("candidates")) {
        if (!c.at("fits").get<bool>()) continue;
        ++fitting;
        ASSERT_TRUE(c.contains("step_s")) << c.dump();
        if (c.at("step_s").get<double>() < fastest) {
            fastest = c.at("step_s").get<double>();
            fastest_name = c.at("name").get<std::string>();
        }
        bool has_aio = false;
        for (const auto& o : c.at("overrides")) {
            has_aio = has_aio || o.get<std::string>().rfind("aio.block_size=", 0) == 0;
        }
        EXPECT_TRUE(has_aio) << c.dump();
    }
    EXPECT_GE(fitting, 2) << fit.out;
    EXPECT_EQ(f.at("chosen").get<std::string>(), fastest_name);

    // A profile that is not one is a usage error naming the file.
    const RunResult bad = plan(
        dir, "--config " + config("fashion-mnist.json") + " --profile " + dir.file("profile.txt"));
    EXPECT_EQ(bad.exit_code, 2) << bad.out;
    EXPECT_NE(bad.out.find("profile.txt"), std::string::npos) << bad.out;
}

// --fit on big-mlp-nvme with a 256 MiB device and 2 GiB of host memory: neither no offload nor
// the optimizer alone offloaded fits the device, parameters and states on cpu exceed the host;
// without a profile the least offload that fits is chosen and written, and the written config is
// admitted as it stands. A file that exists is never replaced.
TEST(PlanCliTest, FitChoosesAndWritesAConfigThatFits) {
    test::TempDir dir("plan");
    const std::string swap = dir.file("swap");
    const std::string out = dir.file("fitted.json");
    const std::string args = "--config " + config("big-mlp-nvme.json") + swap_paths(swap) +
                             " --fit --device-memory 256MiB --host-memory 2GiB --nvme-free 64GiB";
    const RunResult r = plan(dir, args + " --json --out " + out, /*stdout_only=*/true);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    const auto& list = j.at("candidates");
    ASSERT_EQ(list.size(), 6u);
    EXPECT_FALSE(list.at(0).at("fits").get<bool>());
    EXPECT_NE(list.at(0).at("why_not").get<std::string>().find("device.memory_budget"),
              std::string::npos);
    EXPECT_FALSE(list.at(3).at("fits").get<bool>());
    EXPECT_NE(list.at(3).at("why_not").get<std::string>().find("--host-memory"), std::string::npos);
    EXPECT_TRUE(list.at(4).at("fits").get<bool>());
    EXPECT_EQ(j.at("chosen").get<std::string>(), list.at(4).at("name").get<std::string>());
    EXPECT_LE(list.at(4).at("device_peak_bytes").get<std::uint64_t>(), 256u << 20);
    EXPECT_LE(list.at(4).at("host_bytes").get<std::uint64_t>(), 2ull << 30);
    ASSERT_TRUE(std::filesystem::exists(out));
    const std::string written = test::read_text(out);
    EXPECT_NE(written.find("268435456"), std::string::npos) << written;

    // The written config plans as admitted on its own, with the placement chosen.
    const RunResult again = plan(dir, "--config " + out + " --json", /*stdout_only=*/true);
    ASSERT_EQ(again.exit_code, 0) << again.out;
    const auto k = nlohmann::json::parse(again.out, nullptr, false);
    ASSERT_FALSE(k.is_discarded()) << again.out;
    const auto& placement = k.at("per_rank").at(0).at("placement");
    EXPECT_EQ(placement.at("parameters").get<std::string>(), "cpu");
    EXPECT_EQ(placement.at("optimizer_states").get<std::string>(), "nvme");

    // Never over an existing file.
    const RunResult twice = plan(dir, args + " --out " + out);
    EXPECT_EQ(twice.exit_code, 1) << twice.out;
    EXPECT_NE(twice.out.find("File exists"), std::string::npos) << twice.out;
    EXPECT_EQ(test::read_text(out), written);
    EXPECT_FALSE(std::filesystem::exists(swap)) << "zinfinity-plan created " << swap;
}

TEST(PlanCliTest, FitWithNothingThatFitsWritesNothing) {
    test::TempDir dir("plan");
    const std::string swap = dir.file("swap");
    const std::string out = dir.file("fitted.json");
    const RunResult r = plan(dir, "--config " + config("big-mlp-nvme.json") + swap_paths(swap) +
                                      " --fit --device-memory 256MiB --host-memory 1200MiB "
                                      "--nvme-free 1GiB --out " +
                                      out);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("no placement fits"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("device.memory_budget"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("--host-memory"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("--nvme-free"), std::string::npos) << r.out;
    EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(PlanCliTest, WithoutConfigIsAUsageError) {
    test::TempDir dir("plan");
    EXPECT_EQ(plan(dir, "").exit_code, 2);
    EXPECT_EQ(plan(dir, "--config " + config("fashion-mnist.json") + " --ranks 0").exit_code, 2);
    const RunResult help = plan(dir, "--help");
    EXPECT_EQ(help.exit_code, 0);
    EXPECT_NE(help.out.find("--ranks"), std::string::npos) << help.out;
}

}  // namespace
}  // namespace zinf
