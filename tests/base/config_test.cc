// Config loading: DeepSpeed keys, defaults, warnings, suggestions and key-path errors.
#include "src/base/config.h"

#include <gtest/gtest.h>

#include <fstream>

#include "src/base/log.h"
#include "tests/support/test_seed.h"

namespace zinf::config {
namespace {

LoadOptions quiet() {
    LoadOptions o;
    o.log_warnings = false;
    return o;
}

Result<EngineConfig> load_text(const std::string& text, const LoadOptions& options = quiet()) {
    return load_from_string(text, options, "test.json");
}

std::string error_of(const std::string& text) {
    auto r = load_text(text);
    EXPECT_FALSE(r.has_value()) << text;
    return r.has_value() ? "" : r.error().message();
}

TEST(ConfigTest, DefaultsFromEmptyObject) {
    auto c = load_text("{}");
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    EXPECT_EQ(c->aio.block_size_bytes, 1u << 20);
    EXPECT_EQ(c->aio.backend, "auto");
    EXPECT_EQ(c->aio.use_direct, Tristate::kAuto);
    EXPECT_EQ(c->aio.intra_op_parallelism, 1);
    EXPECT_TRUE(c->swap.verify_checksums);
    EXPECT_EQ(c->zero.stage, 0);
}

TEST(ConfigTest, AioBlock) {
    auto c =
        load_text(R"({"aio": {"block_size": 4194304, "queue_depth": 16, "intra_op_parallelism": 2,
        "single_submit": false, "overlap_events": true, "backend": "libaio", "use_direct": true,
        "register_buffers": false, "sqpoll": true}})");
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    EXPECT_EQ(c->aio.block_size_bytes, 4u << 20);
    EXPECT_EQ(c->aio.queue_depth, 16);
    EXPECT_EQ(c->aio.intra_op_parallelism, 2);
    EXPECT_EQ(c->aio.backend, "libaio");
    EXPECT_EQ(c->aio.use_direct, Tristate::kOn);
    EXPECT_FALSE(c->aio.register_buffers);
    EXPECT_TRUE(c->aio.sqpoll);
}

TEST(ConfigTest, ThreadCountIsTheOldNameOfIntraOpParallelism) {
    auto c = load_text(R"({"aio": {"thread_count": 3}})");
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->aio.intra_op_parallelism, 3);
    EXPECT_NE(
        error_of(R"({"aio": {"thread_count": 3, "intra_op_parallelism": 2}})").find("thread_count"),
        std::string::npos);
}

TEST(ConfigTest, DeepSpeedKeyNotImplementedWarnsOnce) {
    auto c = load_text(R"({"wall_clock_breakdown": false, "train_batch_size": 8})");
    ASSERT_TRUE(c.has_value());
    ASSERT_EQ(c->warnings.size(), 1u);
    EXPECT_NE(c->warnings[0].find("wall_clock_breakdown"), std::string::npos);
}

TEST(ConfigTest, UnknownKeySuggestsNearest) {
    const auto m = error_of(R"({"aio": {"queue_dept": 8}})");
    EXPECT_NE(m.find("aio.queue_dept: unknown key"), std::string::npos) << m;
    EXPECT_NE(m.find("did you mean 'aio.queue_depth'"), std::string::npos) << m;
    const auto top = error_of(R"({"zero_optimisation": {}})");
    EXPECT_NE(top.find("did you mean 'zero_optimization'"), std::string::npos) << top;
    EXPECT_NE(top.find("test.json"), std::string::npos) << top;
}

TEST(ConfigTest, WrongTypesAndRangesNameTheKeyPath) {
    EXPECT_NE(error_of(R"({"aio": {"queue_depth": 0}})")
                  .find("aio.queue_depth: expected integer in [1, 4096], got 0"),
              std::string::npos);
    EXPECT_NE(
        error_of(R"({"aio": {"queue_depth": "deep"}})").find("aio.queue_depth: expected integer"),
        std::string::npos);
    EXPECT_NE(
        error_of(R"({"aio": {"single_submit": 1}})").find("aio.single_submit: expected boolean"),
        std::string::npos);
    EXPECT_NE(error_of(R"({"aio": {"backend": "spdk"}})").find("aio.backend: expected one of"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"aio": {"block_size": 1000}})")
                  .find("aio.block_size: expected a multiple of 512"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"aio": 3})").find("aio: expected object"), std::string::npos);
    EXPECT_NE(error_of("{not json").find("not valid JSON"), std::string::npos);
}

TEST(ConfigTest, ElementCountsAcceptScientificNotation) {
    auto c = load_text(R"({"zero_optimization": {"stage": 3, "sub_group_size": 1e8,
        "stage3_prefetch_bucket_size": 5e7}})");
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    EXPECT_EQ(c->zero.sub_group_size_numel, 100000000u);
    EXPECT_NE(error_of(R"({"zero_optimization": {"sub_group_size": 1.5}})")
                  .find("zero_optimization.sub_group_size"),
              std::string::npos);
}

TEST(ConfigTest, OffloadRules) {
    // Below stage 3 DeepSpeed ignores offload_param: a warning, and the parameters stay put.
    auto below =
        load_text(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})");
    ASSERT_TRUE(below.has_value()) << below.error().to_string();
    EXPECT_EQ(below->zero.offload_param.device, OffloadDevice::kNone);
    ASSERT_EQ(below->warnings.size(), 1u);
    EXPECT_NE(below->warnings[0].find("offload_param is ignored"), std::string::npos);
    EXPECT_NE(
        error_of(R"({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}})")
            .find("needs zero_optimization.stage 1, 2 or 3"),
        std::string::npos);
    EXPECT_NE(
        error_of(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})")
            .find("zero_optimization.offload_param.nvme_path: required"),
        std::string::npos);
    auto c = load_text(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",
        "nvme_path": ["/a", "/b"]}, "offload_optimizer": {"device": "nvme", "nvme_path": "/c",
        "pipeline_read": true, "ratio": 0.5}}})");
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    EXPECT_EQ(c->zero.offload_param.nvme_path.size(), 2u);
    EXPECT_EQ(c->zero.offload_optimizer.nvme_path[0], "/c");
    EXPECT_TRUE(c->zero.offload_optimizer.pipeline_read);
    EXPECT_EQ(c->warnings.size(), 1u);  // ratio
}

TEST(ConfigTest, StateDtype) {
    auto plain = load_text(R"({"zero_optimization": {"stage": 1}})");
    ASSERT_TRUE(plain.has_value());
    EXPECT_EQ(plain->zero.offload_optimizer.state_dtype, StateDType::kFp32);
    for (const char* name : {"fp32", "bf16", "int8"}) {
        auto c = load_text(str_cat(R"({"zero_optimization": {"stage": 2, "offload_optimizer": )",
                                   R"({"device": "cpu", "state_dtype": ")", name, R"("}}})"));
        ASSERT_TRUE(c.has_value()) << c.error().to_string();
        EXPECT_EQ(state_dtype_name(c->zero.offload_optimizer.state_dtype), name);
        EXPECT_TRUE(c->warnings.empty());
    }
    const std::string bad = error_of(
        R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"state_dtype": "fp8"}}})");
    EXPECT_NE(bad.find("zero_optimization.offload_optimizer.state_dtype"), std::string::npos)
        << bad;
    EXPECT_NE(bad.find("int8"), std::string::npos) << bad;
    // torch.optim's rounding is defined over fp32 states only.
    const std::string torch = error_of(
        R"({"optimizer": {"type": "AdamW", "params": {"torch_rounding": true}},
            "zero_optimization": {"stage": 2, "offload_optimizer": {"state_dtype": "bf16"}}})");
    EXPECT_NE(torch.find("state_dtype"), std::string::npos) << torch;
    EXPECT_NE(torch.find("torch_rounding"), std::string::npos) << torch;
    // Every built-in optimizer has compressed kernels (Adagrad's sum takes the unsigned code).
    auto adagrad = load_text(
        R"({"optimizer": {"type": "Adagrad"},
            "zero_optimization": {"stage": 2, "offload_optimizer": {"state_dtype": "int8"}}})");
    EXPECT_TRUE(adagrad.has_value()) << adagrad.error().to_string();
}

TEST(ConfigTest, BatchArithmetic) {
    auto a = load_text(R"({"train_batch_size": 32, "gradient_accumulation_steps": 4})");
    ASSERT_TRUE(a.has_value());
    EXPECT_EQ(a->batch.train_micro_batch_size_per_gpu, 8u);
    auto b =
        load_text(R"({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2})");
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(b->batch.train_batch_size, 16u);
    EXPECT_NE(error_of(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 4})")
                  .find("train_batch_size"),
              std::string::npos);
    LoadOptions two = quiet();
    two.world_size = 2;
    auto c = load_text(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8})", two);
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->batch.gradient_accumulation_steps, 2u);
}

TEST(ConfigTest, OptimizerAndScheduler) {
    auto c =
        load_text(R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "betas": [0.8, 0.99],
        "eps": 1e-6, "weight_decay": 0.1}}, "scheduler": {"type": "WarmupDecayLR", "params": {
        "warmup_num_steps": 10, "total_num_steps": 100, "warmup_type": "linear"}}})");
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    EXPECT_EQ(c->optimizer.type, OptimizerKind::kAdamW);
    EXPECT_DOUBLE_EQ(c->optimizer.beta1, 0.8);
    EXPECT_EQ(c->scheduler.type, SchedulerType::kWarmupDecayLR);
    EXPECT_TRUE(c->scheduler.warmup_linear);
    EXPECT_NE(error_of(R"({"optimizer": {"type": "SGD"}})").find("optimizer.type"),
              std::string::npos);
    EXPECT_NE(
        error_of(R"({"optimizer": {"params": {"betas": [0.9]}}})").find("optimizer.params.betas"),
        std::string::npos);
    EXPECT_NE(error_of(R"({"scheduler": {"type": "WarmupDecayLR"}})").find("total_num_steps"),
              std::string::npos);
}

TEST(ConfigTest, OverridesApplyBeforeValidation) {
    LoadOptions o = quiet();
    o.overrides = {"aio.queue_depth=8", "aio.backend=posix", "swap.verify_checksums=false"};
    auto c = load_text("{}", o);
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    EXPECT_EQ(c->aio.queue_depth, 8);
    EXPECT_EQ(c->aio.backend, "posix");
    EXPECT_FALSE(c->swap.verify_checksums);
    o.overrides = {"aio.queue_depth=0"};
    auto bad = load_text("{}", o);
    ASSERT_FALSE(bad.has_value());
    EXPECT_NE(bad.error().message().find("aio.queue_depth"), std::string::npos);
}

TEST(ConfigTest, MissingFileNamesThePath) {
    auto r = load("/nonexistent/zinf.json");
    ASSERT_FALSE(r.has_value());
    EXPECT_NE(r.error().message().find("/nonexistent/zinf.json"), std::string::npos);
}

TEST(ConfigTest, AioRoundTripsThroughJson) {
    AioConfig aio;
    aio.block_size_bytes = 8u << 20;
    aio.queue_depth = 16;
    aio.backend = "io_uring";
    aio.use_direct = Tristate::kOn;
    auto back = load_aio_from_string(aio_to_json(aio), "tune.json");
    ASSERT_TRUE(back.has_value()) << back.error().to_string();
    EXPECT_EQ(back->block_size_bytes, aio.block_size_bytes);
    EXPECT_EQ(back->queue_depth, 16);
    EXPECT_EQ(back->use_direct, Tristate::kOn);
    // And a full config accepts the same text.
    EXPECT_TRUE(load_text(aio_to_json(aio)).has_value());
}

TEST(ConfigTest, EditDistance) {
    EXPECT_EQ(edit_distance("queue_dept", "queue_depth"), 1u);
    EXPECT_EQ(edit_distance("", "abc"), 3u);
}

}  // namespace
}  // namespace zinf::config

namespace zinf::config {
namespace {

TEST(ConfigTest, ModelDataDeviceDefaultsAndValues) {
    auto d = load_text("{}");
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(d->model.layers, (std::vector<std::uint64_t>{784, 1024, 1024, 10}));
    EXPECT_EQ(d->data.dataset, "fashion-mnist");
    EXPECT_EQ(d->device.type, "cpu");
    EXPECT_FALSE(d->canonical_json.empty());
    auto c = load_text(R"({"model": {"type": "mlp", "layers": [4, 8, 2], "activation": "gelu",
                                      "dropout": 0.1, "layernorm": true},
                           "data": {"dataset": "synthetic", "epochs": 3, "max_steps": 7,
                                    "synthetic_samples": 99},
                           "device": {"type": "cpu", "memory_budget": 1073741824,
                                      "local_rank": 1}})");
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    EXPECT_EQ(c->model.layers, (std::vector<std::uint64_t>{4, 8, 2}));
    EXPECT_EQ(c->model.activation, "gelu");
    EXPECT_DOUBLE_EQ(c->model.dropout, 0.1);
    EXPECT_TRUE(c->model.layernorm);
    EXPECT_EQ(c->data.dataset, "synthetic");
    EXPECT_EQ(c->data.epochs, 3u);
    EXPECT_EQ(c->data.max_steps, 7u);
    EXPECT_EQ(c->data.synthetic_samples, 99u);
    EXPECT_EQ(c->device.memory_budget_bytes, 1u << 30);
    EXPECT_EQ(c->device.local_rank, 1);
}

TEST(ConfigTest, ModelDataDeviceErrorsNameTheKey) {
    const auto names = [](const std::string& text, const std::string& key) {
        return error_of(text).find(key) != std::string::npos;
    };
    EXPECT_TRUE(names(R"({"model": {"layers": [4]}})", "model.layers"));
    EXPECT_TRUE(names(R"({"model": {"layers": "784"}})", "model.layers"));
    EXPECT_TRUE(names(R"({"model": {"activation": "tanh"}})", "model.activation"));
    EXPECT_TRUE(names(R"({"model": {"dropout": 1.5}})", "model.dropout"));
    EXPECT_TRUE(names(R"({"data": {"dataset": "mnist"}})", "data.dataset"));
    EXPECT_TRUE(names(R"({"data": {"epoch": 2}})", "did you mean 'data.epochs'"));
    EXPECT_TRUE(names(R"({"device": {"memory_budget": 10}})", "device.memory_budget"));
    EXPECT_TRUE(names(R"({"device": {"type": "tpu"}})", "device.type"));
}

TEST(ConfigTest, GptModelTextDataAndActivationCheckpointing) {
    auto c = load_text(R"({"model": {"type": "gpt", "n_layer": 6, "n_head": 8, "d_model": 256,
                                      "seq_len": 64, "dropout": 0.1,
                                      "checkpoint_activations": true},
                           "data": {"dataset": "text"},
                           "activation_checkpointing": {"cpu_checkpointing": true,
                               "contiguous_memory_optimization": true, "number_checkpoints": 6,
                               "synchronize_checkpoint_boundary": true, "profile": true}})");
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    EXPECT_EQ(c->model.type, ModelType::kGpt);
    EXPECT_EQ(c->model.n_layer, 6u);
    EXPECT_EQ(c->model.n_head, 8u);
    EXPECT_EQ(c->model.d_model, 256u);
    EXPECT_EQ(c->model.seq_len, 64u);
    EXPECT_TRUE(c->model.checkpoint_activations);
    EXPECT_EQ(c->data.path, kFortunesPath);  // the text dataset's default
    const ActivationCheckpointingConfig& a = c->activation_checkpointing;
    EXPECT_TRUE(a.cpu_checkpointing);
    EXPECT_TRUE(a.contiguous_memory_optimization);
    EXPECT_EQ(a.number_checkpoints, 6u);
    EXPECT_TRUE(a.synchronize_checkpoint_boundary);
    EXPECT_TRUE(a.profile);
    EXPECT_TRUE(c->warnings.empty()) << c->warnings.front();
    // Keys with no effect warn, naming the key.
    auto w = load_text(R"({"model": {"type": "gpt", "checkpoint_activations": true},
                           "activation_checkpointing": {"partition_activations": true,
                                                        "number_checkpoints": 3}})");
    ASSERT_TRUE(w.has_value());
    ASSERT_EQ(w->warnings.size(), 2u);
    EXPECT_NE(w->warnings[0].find("activation_checkpointing.partition_activations"),
              std::string::npos);
    EXPECT_NE(w->warnings[1].find("number_checkpoints: 3 ignored"), std::string::npos);
    auto off = load_text(R"({"activation_checkpointing": {"cpu_checkpointing": true}})");
    ASSERT_TRUE(off.has_value());
    ASSERT_EQ(off->warnings.size(), 1u);
    EXPECT_NE(off->warnings[0].find("has no effect"), std::string::npos);
    // A user's text file.
    auto f = load_text(R"({"data": {"dataset": "text", "path": "/data/book.txt"}})");
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->data.path, "/data/book.txt");
}

TEST(ConfigTest, GptErrorsNameTheKey) {
    const auto names = [](const std::string& text, const std::string& key) {
        return error_of(text).find(key) != std::string::npos;
    };
    EXPECT_TRUE(names(R"({"model": {"type": "gpt", "d_model": 100, "n_head": 3}})",
                      "model.d_model: 100 is not divisible by model.n_head (3)"));
    EXPECT_TRUE(names(R"({"model": {"type": "gpt", "n_layer": 0}})", "model.n_layer"));
    EXPECT_TRUE(names(R"({"model": {"type": "gpt", "layers": [4, 2]}})", "model.layers"));
    EXPECT_TRUE(names(R"({"model": {"type": "mlp", "seq_len": 64}})", "model.seq_len"));
    EXPECT_TRUE(names(R"({"model": {"type": "transformer"}})", "model.type"));
    EXPECT_TRUE(names(R"({"activation_checkpointing": {"cpu_checkpoint": true}})",
                      "did you mean 'activation_checkpointing.cpu_checkpointing'"));
    EXPECT_TRUE(names(R"({"activation_checkpointing": {"nvme_checkpointing": true}})",
                      "activation_checkpointing.nvme_path: required"));
    EXPECT_TRUE(names(R"({"activation_checkpointing": {"nvme_checkpointing": true,
                          "cpu_checkpointing": true, "nvme_path": "/x"}})",
                      "choose one place"));
    EXPECT_TRUE(names(R"({"model": {"type": "gpt", "checkpoint_activations": true},
                          "zero_optimization": {"stage": 3, "offload_optimizer": {
                              "device": "nvme", "nvme_path": "/swap"}},
                          "activation_checkpointing": {"nvme_checkpointing": true,
                                                       "nvme_path": "/swap"}})",
                      "activation_checkpointing.nvme_path: /swap is also an offload nvme_path"));
}

TEST(ConfigTest, CanonicalJsonReflectsOverrides) {
    LoadOptions o = quiet();
    o.overrides = {"seed=5"};
    auto a = load_text(R"({"seed": 1})", o);
    auto b = load_text(R"({"seed": 5})");
    ASSERT_TRUE(a.has_value());
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(a->canonical_json, b->canonical_json);
}

}  // namespace
}  // namespace zinf::config
