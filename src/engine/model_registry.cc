// The model registry's table.
#include "src/engine/model_registry.h"

#include "src/engine/activation_store.h"
#include "src/engine/offload_plan.h"
#include "src/model/gpt.h"
#include "src/model/mlp.h"

namespace zinf::engine {
namespace {

Result<std::unique_ptr<model::Model>> build_mlp(const config::EngineConfig& config,
                                                Device& device) {
    model::MlpConfig m;
    m.layer_sizes.assign(config.model.layers.begin(), config.model.layers.end());
    m.activation =
        config.model.activation == "gelu" ? model::Activation::kGelu : model::Activation::kRelu;
    m.dropout_prob = static_cast<float>(config.model.dropout);
    m.layer_norm = config.model.layernorm;
    m.batch_rows_max = config.batch.train_micro_batch_size_per_gpu;
    m.seed = config.seed;
    ZINF_ASSIGN_OR_RETURN(auto mlp, model::Mlp::create(m, device));
    return std::unique_ptr<model::Model>(std::move(mlp));
}

Result<std::unique_ptr<model::Model>> build_gpt(const config::EngineConfig& config,
                                                Device& device) {
    const config::ModelConfig& m = config.model;
    const config::ActivationCheckpointingConfig& a = config.activation_checkpointing;
    model::GptConfig g;
    g.n_layer = m.n_layer;
    g.n_head = m.n_head;
    g.d_model = m.d_model;
    g.seq_len = m.seq_len;
    g.dropout = static_cast<float>(m.dropout);
    g.batch_rows_max = config.batch.train_micro_batch_size_per_gpu;
    g.seed = config.seed;
    g.checkpoint_activations = m.checkpoint_activations;
    g.checkpoint_place = a.cpu_checkpointing    ? model::CheckpointPlace::kHost
                         : a.nvme_checkpointing ? model::CheckpointPlace::kStore
                                                : model::CheckpointPlace::kDevice;
    g.contiguous_checkpoints = a.contiguous_memory_optimization;
    g.synchronize_boundaries = a.synchronize_checkpoint_boundary;
    g.profile = a.profile;
    std::unique_ptr<model::ActivationStore> store;
    if (g.checkpoint_activations && g.checkpoint_place == model::CheckpointPlace::kStore) {
        NvmeActivationStoreOptions o;
        o.paths = a.nvme_path;
        o.verify_checksums = config.swap.verify_checksums;
        o.aio = aio_options(config.aio);
        o.input_bytes = g.batch_rows_max * g.seq_len * g.d_model * sizeof(float);
        o.input_count = g.n_layer;
        ZINF_ASSIGN_OR_RETURN(store, NvmeActivationStore::create(o, device));
    }
    ZINF_ASSIGN_OR_RETURN(auto gpt, model::Gpt::create(g, device, std::move(store)));
    return std::unique_ptr<model::Model>(std::move(gpt));
}

struct Entry {
    config::ModelType type;
    std::string_view name;
    Result<std::unique_ptr<model::Model>> (*build)(const config::EngineConfig&, Device&);
};

constexpr Entry kModels[] = {
    {config::ModelType::kMlp, "mlp", &build_mlp},
    {config::ModelType::kGpt, "gpt", &build_gpt},
};

}  // namespace

Result<std::unique_ptr<model::Model>> build_model(const config::EngineConfig& config,
                                                  Device& device) {
    for (const Entry& e : kModels) {
        if (e.type == config.model.type) return e.build(config, device);
    }
    return Status::not_supported("model.type: no model of this type is registered");
}

std::vector<std::string_view> model_types() {
    std::vector<std::string_view> names;
    for (const Entry& e : kModels) names.push_back(e.name);
    return names;
}

}  // namespace zinf::engine
