// zinfinity-plan: what a config will hold on each tier of each rank, where every state goes and
// why, and whether the engine's admission takes it, computed as Engine::create does
// (engine::make_offload_plan, engine::predict_memory, engine::admit) without creating a file.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "src/base/config.h"
#include "src/base/file.h"
#include "src/base/log.h"
#include "src/base/units.h"
#include "src/device/cpu_device.h"
#include "src/engine/memory_prediction.h"
#include "src/engine/model_registry.h"
#include "src/engine/offload.h"
#include "src/engine/offload_plan.h"
#include "src/engine/step_prediction.h"
#include "tools/cli/args.h"
#include "tools/plan/fit.h"
#include "tools/plan/rank_plan.h"

namespace {

using zinf::Result;
using zinf::Status;
using zinf::plan::build_model;
using zinf::plan::plan_rank;
using zinf::plan::RankPlan;
namespace engine = zinf::engine;
namespace config = zinf::config;

constexpr const char* kProgram = "zinfinity-plan";

nlohmann::json tier_json(const engine::TierPrediction& tier) {
    nlohmann::json j;
    j["total_bytes"] = tier.total_bytes();
    for (std::size_t h = 0; h < engine::kHolderCount; ++h) {
        const auto holder = static_cast<engine::Holder>(h);
        j[std::string(engine::holder_name(holder))] = tier.bytes(holder);
    }
    nlohmann::json items = nlohmann::json::array();
    for (const auto& item : tier.items) {
        items.push_back({{"what", item.what},
                         {"holder", std::string(engine::holder_name(item.holder))},
                         {"bytes", item.bytes}});
    }
    j["items"] = std::move(items);
    return j;
}

nlohmann::json rank_json(const RankPlan& r) {
    nlohmann::json j;
    j["rank"] = r.rank;
    j["admitted"] = r.status.is_ok();
    if (!r.status.is_ok()) j["error"] = r.status.to_string();
    if (!r.planned) return j;
    const engine::OffloadPlan& p = r.plan;
    const engine::MemoryPrediction& m = r.prediction;
    j["placement"] = {{"stage", p.stage},
                      {"dtype", std::string(zinf::dtype_name(p.dtype))},
                      {"parameters", std::string(engine::home_name(p.parameters))},
                      {"gradients", std::string(engine::home_name(p.gradients))},
                      {"gradients_reason", p.gradients_reason},
                      {"optimizer_states", std::string(engine::home_name(p.optimizer_states))},
                      {"sub_group_numel", p.sub_group_numel}};
    j["device"] = tier_json(m.device);
    j["device"]["budget_bytes"] = m.device_budget_bytes;
    j["device"]["exact"] = m.device_inexact_reason.empty();
    if (!m.device_inexact_reason.empty()) j["device"]["inexact_reason"] = m.device_inexact_reason;
    j["pinned_host"] = tier_json(m.pinned_host);
    j["pinned_host"]["budget_bytes"] = m.host_budget_bytes;
    j["pinned_host"]["budgeted_bytes"] = m.host_budgeted_bytes;
    j["pageable_host"] = tier_json(m.pageable_host);
    j["nvme"] = tier_json(m.nvme);
    if (r.timed) {
        const engine::StepPrediction& t = r.step;
        nlohmann::json flows = nlohmann::json::array();
        for (const auto& f : t.flows) {
            flows.push_back(
                {{"what", f.what}, {"read_bytes", f.read_bytes}, {"write_bytes", f.write_bytes}});
        }
        j["step_time"] = {{"step_s", t.step_s},
                          {"forward_s", t.forward_s},
                          {"backward_s", t.backward_s},
                          {"optimizer_s", t.optimizer_s},
                          {"compute_s", t.forward_s + t.backward_s + t.optimizer_s},
                          {"io_s", t.io_s},
                          {"exposed_io_s", t.exposed_io_s},
                          {"collective_s", t.collective_s},
                          {"collective_calls", t.collective_calls},
                          {"collective_bytes", t.collective_bytes},
                          {"read_bytes", t.read_bytes},
                          {"write_bytes", t.write_bytes},
                          {"read_gb_per_s", t.read_gb_per_s},
                          {"write_gb_per_s", t.write_gb_per_s},
                          {"optimizer_params_per_s", t.optimizer_params_per_s},
                          {"flows", flows},
                          {"notes", t.notes}};
    } else if (!r.step_error.empty()) {
        j["step_time"] = {{"error", r.step_error}};
    }
    return j;
}

std::string rank_text(const RankPlan& r) {
    std::string s = zinf::str_cat("rank ", r.rank, ":\n");
    if (r.planned) {
        const engine::MemoryPrediction& m = r.prediction;
        s += zinf::str_cat(r.plan.describe(), "\n  predicted bytes per tier:\n", describe(m),
                           "\n  device peak ", zinf::format_bytes(m.device.total_bytes()),
                           " of a budget of ", zinf::format_bytes(m.device_budget_bytes),
                           " (device.memory_budget)");
        if (m.host_budget_bytes > 0) {
            s += zinf::str_cat(
                "; pinned host under the budget ", zinf::format_bytes(m.host_budgeted_bytes),
                " of ", zinf::format_bytes(m.host_budget_bytes), " (device.host_memory_budget)");
        }
        if (!m.device_inexact_reason.empty()) {
            s += zinf::str_cat("\n  the device figure is a lower bound: ", m.device_inexact_reason);
        }
        s += "\n";
        if (r.timed) s += r.step.describe();
        if (!r.step_error.empty()) s += zinf::str_cat("  no step time: ", r.step_error, "\n");
    }
    s += r.status.is_ok() ? "  admitted\n"
                          : zinf::str_cat("  NOT ADMITTED: ", r.status.to_string(), "\n");
    return s;
}

// The machine's available memory (MemAvailable), or 0 where /proc/meminfo does not say.
std::uint64_t available_host_bytes() {
    std::ifstream meminfo("/proc/meminfo");
    for (std::string line; std::getline(meminfo, line);) {
        unsigned long long kib = 0;
        if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kib) == 1) return kib * 1024;
    }
    return 0;
}

// --fit's limits: given, else the config's device budget, the machine's available memory and the
// free space of the file system that holds the config's (or --nvme-path's) NVMe directory.
Result<zinf::plan::FitOptions> fit_options(const zinf::cli::Args& args,
                                           const config::EngineConfig& c, int ranks) {
    zinf::plan::FitOptions f;
    f.config_path = args.get("config");
    f.overrides = args.get_list("set");
    f.ranks = ranks;
    f.out_path = args.get("out");
    f.json = args.get_switch("json");
    f.nvme_path = args.get("nvme-path");
    f.device_bytes = c.device.memory_budget_bytes;
    if (!args.get("device-memory").empty()) {
        ZINF_ASSIGN_OR_RETURN(f.device_bytes, args.get_size_bytes("device-memory"));
    }
    f.host_bytes = available_host_bytes();
    if (!args.get("host-memory").empty()) {
        ZINF_ASSIGN_OR_RETURN(f.host_bytes, args.get_size_bytes("host-memory"));
    }
    if (f.host_bytes == 0) {
        return Status::invalid_argument("--host-memory: give the host memory the run may use");
    }
    std::string nvme_dir = f.nvme_path;
    if (nvme_dir.empty() && !c.zero.offload_optimizer.nvme_path.empty()) {
        nvme_dir = c.zero.offload_optimizer.nvme_path[0];
    }
    if (nvme_dir.empty() && !c.zero.offload_param.nvme_path.empty()) {
        nvme_dir = c.zero.offload_param.nvme_path[0];
    }
    if (!args.get("nvme-free").empty()) {
        ZINF_ASSIGN_OR_RETURN(f.nvme_free_bytes, args.get_size_bytes("nvme-free"));
    } else if (!nvme_dir.empty()) {
        // The nearest existing directory on the way to it (the engine makes the rest).
        std::filesystem::path p = std::filesystem::absolute(nvme_dir);
        while (!p.empty() && !std::filesystem::exists(p) && p != p.root_path()) p = p.parent_path();
        ZINF_ASSIGN_OR_RETURN(f.nvme_free_bytes, zinf::free_space_bytes(p.string()));
    }
    if (f.device_bytes == 0) return Status::invalid_argument("--device-memory: must be > 0");
    return f;
}

// Loads the config, plans every rank and prints; 0 when every rank is admitted, 1 when one is
// not (or the config cannot be planned), 2 for a usage error.
int run(const zinf::cli::Args& args) {
    auto ranks = args.get_int("ranks", 1, 4096);
    if (!ranks.has_value()) return zinf::cli::report_error(kProgram, ranks.error());
    config::LoadOptions lo;
    lo.overrides = args.get_list("set");
    lo.world_size = static_cast<int>(*ranks);
    auto c = config::load(args.get("config"), lo);
    if (!c.has_value()) return zinf::cli::report_error(kProgram, c.error(), 1);
    std::optional<engine::MachineProfile> profile;
    if (!args.get("profile").empty()) {
        auto loaded = engine::load_profile(args.get("profile"));
        if (!loaded.has_value()) return zinf::cli::report_error(kProgram, loaded.error(), 2);
        profile = std::move(loaded).value();
    }
    if (args.get_switch("fit")) {
        auto fit = fit_options(args, *c, static_cast<int>(*ranks));
        if (!fit.has_value()) return zinf::cli::report_error(kProgram, fit.error(), 2);
        fit->profile = profile.has_value() ? &*profile : nullptr;
        return zinf::plan::run_fit(*fit);
    }
    auto model = build_model(*c);
    if (!model.has_value()) return zinf::cli::report_error(kProgram, model.error(), 1);
    std::vector<RankPlan> plans;
    bool admitted = true;
    for (int r = 0; r < *ranks; ++r) {
        plans.push_back(plan_rank(*c, *model, static_cast<int>(*ranks), r,
                                  profile.has_value() ? &*profile : nullptr));
        admitted = admitted && plans.back().status.is_ok();
    }
    if (args.get_switch("json")) {
        nlohmann::json j;
        j["config"] = args.get("config");
        j["ranks"] = *ranks;
        if (profile.has_value()) {
            j["profile"] = {{"path", args.get("profile")}, {"machine", profile->machine}};
        }
        j["admitted"] = admitted;
        j["model"] = {{"type", std::string(model->model->name())},
                      {"parameters", model->model->parameters().total_numel()}};
        j["per_rank"] = nlohmann::json::array();
        for (const RankPlan& r : plans) j["per_rank"].push_back(rank_json(r));
        std::printf("%s\n", j.dump(2).c_str());
    } else {
        std::printf("%s: %s, %s model of %zu parameters, %lld rank(s)\n", kProgram,
                    args.get("config").c_str(), std::string(model->model->name()).c_str(),
                    model->model->parameters().total_numel(), static_cast<long long>(*ranks));
        for (const RankPlan& r : plans) std::printf("%s", rank_text(r).c_str());
    }
    return admitted ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    zinf::cli::Args args(zinf::str_cat(kProgram, " --config FILE [flags]"),
                         "Predicts, per rank, the bytes a config holds on the device, in pinned "
                         "and pageable host memory and on NVMe (parameters, gradients, optimizer "
                         "states, activations, buffers), where each state is placed and why, "
                         "whether the engine admits it under its budgets, and with --profile the "
                         "step time on the profiled machine. Creates no file (--fit --out "
                         "writes the config it chose). Exit status: 0 admitted (--fit: a "
                         "placement fits), 1 not admitted (the error names the key; --fit: "
                         "none fits), 2 usage.");
    args.add("config", "", "the config file (DeepSpeed-style JSON)");
    args.add("ranks", "1", "data-parallel ranks (mpirun -np N)");
    args.add_list("set", "override a config key before validation: --set key.path=value");
    args.add_switch("json", "print JSON instead of tables");
    args.add("profile", "",
             "a machine profile (zinfinity-bench profile --path DIR --out FILE): adds the "
             "predicted step time per rank, split into compute, I/O and exposed I/O");
    args.add_switch("fit",
                    "search the placements (no offload; optimizer states on cpu or nvme; "
                    "parameters too), sub_group_size, offload_param.max_in_cpu and buffer_size "
                    "and, with --profile, the aio block size and queue depth for the ones that "
                    "fit the limits below; choose the fastest with --profile, else the least "
                    "offload; with --out, write the config");
    args.add("device-memory", "",
             "--fit: device memory per rank (default: the config's device.memory_budget)");
    args.add("host-memory", "",
             "--fit: host memory for all ranks (default: MemAvailable of /proc/meminfo)");
    args.add("nvme-free", "",
             "--fit: free NVMe bytes (default: the free space under the config's nvme_path or "
             "--nvme-path)");
    args.add("nvme-path", "", "--fit: the directory for NVMe candidates if the config names none");
    args.add("out", "", "--fit: write the chosen config to this new file (never replaces one)");
    if (auto rc = args.parse_or_exit(argc - 1, argv + 1, kProgram)) return *rc;
    if (args.get("config").empty()) {
        return zinf::cli::report_error(kProgram, Status::invalid_argument("--config is required"));
    }
    // The model's construction logs; the figures are the output.
    zinf::log::set_level(zinf::log::Level::kWarning);
    return run(args);
}
