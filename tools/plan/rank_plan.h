// One rank's plan, memory prediction, admission and (with a machine profile) step time, as
// Engine::create_for_rank computes them: shared by zinfinity-plan's report and its --fit search.
#pragma once

#include <memory>
#include <string>

#include "src/base/config.h"
#include "src/base/device.h"
#include "src/base/status.h"
#include "src/engine/memory_prediction.h"
#include "src/engine/offload_plan.h"
#include "src/engine/step_prediction.h"
#include "src/model/model.h"

namespace zinf::plan {

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

Result<ModelSizes> build_model(const config::EngineConfig& c);

// Rank `rank` of `ranks`: its plan and prediction; `profile` may be null (no step time).
RankPlan plan_rank(const config::EngineConfig& c, const ModelSizes& m, int ranks, int rank,
                   const engine::MachineProfile* profile);

}  // namespace zinf::plan
