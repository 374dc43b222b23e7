// The model registry: the model zinfinity-train builds for `model.type`, from the `model` block.
// One factory per type in one table; a new architecture adds a row. An embedding program that
// defines its own model::Model passes it to Engine::create directly.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "src/base/config.h"
#include "src/base/device.h"
#include "src/base/status.h"
#include "src/model/model.h"

namespace zinf::engine {

// Builds the model `config.model.type` names on `device` (borrowed; outlives the model), with
// its workspace for train_micro_batch_size_per_gpu rows. Errors: the model's create errors
// (kInvalidArgument naming the key, kNoSpace from the device budget).
Result<std::unique_ptr<model::Model>> build_model(const config::EngineConfig& config,
                                                  Device& device);

// The types the registry knows, in table order ("mlp", ...).
std::vector<std::string_view> model_types();

}  // namespace zinf::engine
