#include "tools/plan/rank_plan.h"

#include <limits>
#include <utility>

#include "src/device/cpu_device.h"
#include "src/engine/model_registry.h"
#include "src/engine/offload.h"

namespace zinf::plan {

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
        auto step = engine::predict_step(own, r.plan, ranks, *profile, in.parameter_numels);
        if (step.has_value()) {
            r.step = std::move(step).value();
            r.timed = true;
        } else {
            r.step_error = step.error().to_string();
        }
    }
    return r;
}

}  // namespace zinf::plan
