// zinfinity-plan: what a config will hold on each tier of each rank, where every state goes and
// why, and whether the engine's admission takes it, computed as Engine::create does
// (engine::make_offload_plan, engine::predict_memory, engine::admit) without creating a file.
#include <cstdio>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "src/base/config.h"
#include "src/base/log.h"
#include "src/base/units.h"
#include "src/device/cpu_device.h"
#include "src/engine/memory_prediction.h"
#include "src/engine/model_registry.h"
#include "src/engine/offload.h"
#include "src/engine/offload_plan.h"
#include "src/engine/step_prediction.h"
#include "tools/cli/args.h"

namespace {

using zinf::Result;
using zinf::Status;
namespace engine = zinf::engine;
namespace config = zinf::config;

constexpr const char* kProgram = "zinfinity-plan";

// One rank's figures: its plan and prediction, or the error that refused it.
struct RankPlan {
    int rank = 0;
    Status status;  // the plan's error or admission's refusal; ok: admitted
    bool planned = false;
    engine::OffloadPlan plan;
    engine::MemoryPrediction prediction;
    // With --profile: the predicted step time, or why there is none.
    bool timed = false;
    engine::StepPrediction step;
    std::string step_error;
};

// The model's sizes, read from the model built on a CPU device of unbounded budget (its
// workspace is mapped, not written). Checkpoints kept on NVMe would create their swap files: the
// model is built with them kept in host memory instead, which gives it the same device layout.
struct ModelSizes {
    std::unique_ptr<zinf::Device> device;
    std::unique_ptr<zinf::model::Model> model;
};

Result<ModelSizes> build_model(const config::EngineConfig& c) {
    config::EngineConfig sizing = c;
    auto& ac = sizing.activation_checkpointing;
    if (ac.nvme_checkpointing && !ac.cpu_checkpointing) {
        ac.nvme_checkpointing = false;
        ac.cpu_checkpointing = true;
    }
    zinf::device::CpuDeviceOptions o;
    o.budget_bytes = std::numeric_limits<std::size_t>::max() / 2;
    o.worker_thread = false;
    ModelSizes m;
    ZINF_ASSIGN_OR_RETURN(m.device, zinf::device::CpuDevice::create(o));
    ZINF_ASSIGN_OR_RETURN(m.model, engine::build_model(sizing, *m.device));
    return m;
}

// Rank `rank`'s plan and prediction, as Engine::create_for_rank computes them.
RankPlan plan_rank(const config::EngineConfig& c, const ModelSizes& m, int ranks, int rank,
                   const engine::MachineProfile* profile) {
    RankPlan r;
    r.rank = rank;
    const config::EngineConfig own = ranks > 1 ? engine::with_rank_swap_paths(c, rank) : c;
    engine::PlanInputs in = engine::plan_inputs_for(*m.model, *m.device, ranks, rank);
    in.device_kind = c.device.type == "cuda" ? zinf::DeviceKind::kCuda : zinf::DeviceKind::kCpu;
    in.device_budget_bytes = c.device.memory_budget_bytes;
    auto plan = engine::make_offload_plan(own, in);
    if (!plan.has_value()) {
        r.status = plan.error();
        return r;
    }
    r.plan = std::move(plan).value();
    engine::PredictionInputs pi = engine::prediction_inputs_for(*m.model, *m.device);
    // A GPU charges allocations as they are asked for; the CPU device rounds them to pages.
    if (in.device_kind == zinf::DeviceKind::kCuda) pi.device_alignment_bytes = 1;
    auto prediction = engine::predict_memory(own, r.plan, in, pi);
    if (!prediction.has_value()) {
        r.status = prediction.error();
        return r;
    }
    r.prediction = std::move(prediction).value();
    r.planned = true;
    r.status = engine::admit(r.prediction);
    if (profile != nullptr) {
        auto step = engine::predict_step(own, r.plan, ranks, *profile);
        if (step.has_value()) {
            r.step = std::move(step).value();
            r.timed = true;
        } else {
            r.step_error = step.error().to_string();
        }
    }
    return r;
}

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
    auto model = build_model(*c);
    if (!model.has_value()) return zinf::cli::report_error(kProgram, model.error(), 1);
    std::optional<engine::MachineProfile> profile;
    if (!args.get("profile").empty()) {
        auto loaded = engine::load_profile(args.get("profile"));
        if (!loaded.has_value()) return zinf::cli::report_error(kProgram, loaded.error(), 2);
        profile = std::move(loaded).value();
    }
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
                         "step time on the profiled machine. Creates no file. Exit "
                         "status: 0 admitted, 1 not admitted (the error names the key), 2 usage.");
    args.add("config", "", "the config file (DeepSpeed-style JSON)");
    args.add("ranks", "1", "data-parallel ranks (mpirun -np N)");
    args.add_list("set", "override a config key before validation: --set key.path=value");
    args.add_switch("json", "print JSON instead of tables");
    args.add("profile", "",
             "a machine profile (zinfinity-bench profile --path DIR --out FILE): adds the "
             "predicted step time per rank, split into compute, I/O and exposed I/O");
    if (auto rc = args.parse_or_exit(argc - 1, argv + 1, kProgram)) return *rc;
    if (args.get("config").empty()) {
        return zinf::cli::report_error(kProgram, Status::invalid_argument("--config is required"));
    }
    // The model's construction logs; the figures are the output.
    zinf::log::set_level(zinf::log::Level::kWarning);
    return run(args);
}
