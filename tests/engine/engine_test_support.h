// Helpers of the engine tests: a small config, a TrainingStack from it, and a few steps of
// training on synthetic data whose losses are returned for bitwise comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "src/base/config.h"
#include "src/data/batcher.h"
#include "src/data/dataset.h"
#include "src/engine/stack.h"
#include "src/engine/trainer.h"

namespace zinf::test_support {

// A 24-32-16-4 MLP on synthetic data, micro-batch 16, AdamW; `extra` is spliced into the
// top-level object (e.g. R"("zero_optimization": {"stage": 2},)").
inline std::string small_config(const std::string& extra = "") {
    return R"({
  )" + extra +
           R"(
  "train_micro_batch_size_per_gpu": 16,
  "gradient_accumulation_steps": 1,
  "steps_per_print": 1000,
  "seed": 7,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
  "model": {"type": "mlp", "layers": [24, 32, 16, 4]},
  "data": {"dataset": "synthetic", "synthetic_samples": 256},
  "device": {"type": "cpu", "memory_budget": 67108864},
  "cpu_optimizer": {"threads": 1}
})";
}

// Parameters and optimizer states on NVMe with budgets small enough that the 24-32-16-4 MLP's
// slices are evicted and read back during every step; "@NVME@" stands for the directory.
inline constexpr const char* kNvmeZero =
    R"("zero_optimization": {"stage": 3, "sub_group_size": 96,)"
    R"( "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 64,)"
    R"( "stage3_max_live_parameters": 1024,)"
    R"( "offload_param": {"device": "nvme", "nvme_path": "@NVME@", "buffer_count": 3,)"
    R"( "buffer_size": 1024, "max_in_cpu": 2048},)"
    R"( "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@",)"
    R"( "pipeline_read": true, "pipeline_write": true, "stream_gradients": true}},)";

// "@NVME@" in a config → `path`.
inline std::string with_nvme(std::string text, const std::string& path) {
    for (auto at = text.find("@NVME@"); at != std::string::npos; at = text.find("@NVME@")) {
        text.replace(at, 6, path);
    }
    return text;
}

inline config::EngineConfig load_config(const std::string& text,
                                        std::vector<std::string> overrides = {}) {
    config::LoadOptions o;
    o.log_warnings = false;
    o.overrides = std::move(overrides);
    auto c = config::load_from_string(text, o, "test.json");
    ZINF_ASSERT_MSG(c.has_value(), c.error().to_string());
    return std::move(c).value();
}

// Trains `steps` optimizer steps from the engine's current step; batch b of the run is batch
// (global micro-step) of a seeded shuffle, so a resumed run sees the same data.
struct Trainer {
    config::EngineConfig config;
    TrainingStack stack;
    std::unique_ptr<data::SyntheticDataset> dataset;
    std::unique_ptr<data::Batcher> batcher;
    // Called by run() between each micro-step's backward and its step (with the micro-step).
    std::function<void(std::uint64_t)> before_step;
    // Called by run() between each micro-step's forward and its backward (with the micro-step).
    std::function<void(std::uint64_t)> after_forward;

    explicit Trainer(const config::EngineConfig& c) : Trainer(c, make_stack(c)) {}
    // Over a stack built elsewhere (a GPU's, create_cuda_training_stack) from the same config.
    Trainer(const config::EngineConfig& c, Result<TrainingStack> s) : config(c) {
        ZINF_ASSERT_MSG(s.has_value(), s.error().to_string());
        stack = std::move(s).value();
        data::SyntheticOptions so;
        so.count = c.data.synthetic_samples;
        so.features = c.model.layers.front();
        so.classes = c.model.layers.back();
        so.seed = c.seed;
        dataset = std::move(data::SyntheticDataset::create(so)).value();
        data::BatcherOptions bo;
        bo.batch_rows = c.batch.train_micro_batch_size_per_gpu;
        bo.seed = c.seed;
        batcher =
            std::make_unique<data::Batcher>(std::move(data::Batcher::create(*dataset, bo)).value());
    }

    Engine& engine() { return *stack.engine; }

    static Result<TrainingStack> make_stack(const config::EngineConfig& c) {
        return TrainingStack::create(c);
    }

    // One optimizer step (its micro-steps) on the next batches; the last micro-step's loss, or
    // the first error.
    Result<float> try_step() {
        const std::size_t rows = config.batch.train_micro_batch_size_per_gpu;
        std::vector<float> x(rows * dataset->features());
        std::vector<std::int32_t> y(rows);
        float loss = 0;
        for (std::uint64_t s = 0; s < config.batch.gradient_accumulation_steps; ++s) {
            const std::uint64_t micro = engine().micro_steps();
            const std::uint64_t per_epoch = batcher->batches_per_epoch();
            if (batcher->epoch() != micro / per_epoch) batcher->start_epoch(micro / per_epoch);
            const std::size_t n = batcher->fill(micro % per_epoch, x, y);
            ZINF_ASSIGN_OR_RETURN(
                loss,
                engine().forward(Batch{std::span<const float>(x.data(), n * dataset->features()),
                                       std::span<const std::int32_t>(y.data(), n), n}));
            ZINF_TRY(engine().backward());
            ZINF_TRY(engine().step());
        }
        return loss;
    }

    std::vector<float> run(std::uint64_t steps) {
        std::vector<float> losses;
        const std::size_t rows = config.batch.train_micro_batch_size_per_gpu;
        std::vector<float> x(rows * dataset->features());
        std::vector<std::int32_t> y(rows);
        const std::uint64_t gas = config.batch.gradient_accumulation_steps;
        for (std::uint64_t s = 0; s < steps * gas; ++s) {
            const std::uint64_t micro = engine().micro_steps();
            const std::uint64_t per_epoch = batcher->batches_per_epoch();
            if (batcher->epoch() != micro / per_epoch) batcher->start_epoch(micro / per_epoch);
            const std::size_t n = batcher->fill(micro % per_epoch, x, y);
            Batch b{std::span<const float>(x.data(), n * dataset->features()),
                    std::span<const std::int32_t>(y.data(), n), n};
            auto loss = engine().forward(b);
            ZINF_ASSERT_MSG(loss.has_value(), loss.error().to_string());
            losses.push_back(*loss);
            if (after_forward) after_forward(micro);
            const Status backward = engine().backward();
            ZINF_ASSERT_MSG(backward.is_ok(), backward.to_string());
            if (before_step) before_step(micro);
            const Status step = engine().step();
            ZINF_ASSERT_MSG(step.is_ok(), step.to_string());
        }
        return losses;
    }
};

// A TrainerObserver that keeps every micro-step's loss.
class LossCollector final : public TrainerObserver {
public:
    explicit LossCollector(std::vector<float>& out) : out_(&out) {}
    Status on_micro_step(std::uint64_t, float loss) override {
        out_->push_back(loss);
        return Status::ok();
    }

private:
    std::vector<float>* out_;
};

// The shipped config `config_dir`/`name` with every swap path under `dir` and `extra` overrides
// (--set syntax); asserts that it loads.
inline config::EngineConfig shipped_config(const std::string& config_dir, const std::string& name,
                                           const std::string& dir,
                                           std::vector<std::string> extra = {}) {
    config::LoadOptions o;
    o.log_warnings = false;
    o.overrides = {
        str_cat("zero_optimization.offload_param.nvme_path=", dir),
        str_cat("zero_optimization.offload_optimizer.nvme_path=", dir),
        str_cat("activation_checkpointing.nvme_path=", dir, "/activations"),
    };
    for (auto& e : extra) o.overrides.push_back(std::move(e));
    auto c = config::load(str_cat(config_dir, "/", name), o);
    ZINF_ASSERT_MSG(c.has_value(), c.error().to_string());
    return std::move(c).value();
}

inline std::vector<std::uint32_t> bits(const std::vector<float>& v) {
    std::vector<std::uint32_t> out(v.size());
    if (!v.empty()) std::memcpy(out.data(), v.data(), v.size() * sizeof(float));  // none: null
    return out;
}
inline std::vector<std::uint32_t> bits(std::span<const float> v) {
    return bits(std::vector<float>(v.begin(), v.end()));
}

}  // namespace zinf::test_support
