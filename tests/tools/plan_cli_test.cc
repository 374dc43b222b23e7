// zinfinity-plan end to end: tables and JSON for shipped configs, the issue-32 crash shape
// reported as not admitted (exit 1, the key named), and no file created under the swap paths.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
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
