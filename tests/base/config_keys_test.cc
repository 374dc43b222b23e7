// DeepSpeed configs carry over with their meaning: every key of the table is read (implemented),
// warned, checked against DeepSpeed's default, refused when enabled, mapped (legacy) or spelled
// two ways (aliases); "auto" is resolved where zinfinity can determine it; docs/CONFIG.md's key
// list is the table's rendering.
#include "src/base/config_keys.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "src/base/config.h"

namespace zinf::config {
namespace {

using Json = nlohmann::json;

Result<EngineConfig> load_json_value(const Json& root) {
    LoadOptions o;
    o.log_warnings = false;
    return load_from_string(root.dump(), o, "test.json");
}

// {"a": {"b": {"c": value}}} for the path "a.b.c".
Json nested(std::string_view path, const Json& value) {
    Json root = Json::object();
    Json* node = &root;
    std::size_t start = 0;
    while (true) {
        const auto dot = path.find('.', start);
        const std::string part(path.substr(
            start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
        if (dot == std::string_view::npos) {
            (*node)[part] = value;
            return root;
        }
        node = &(*node)[part];
        start = dot + 1;
    }
}

// Blocks whose keys need their section present to mean anything: a scheduler's params need a
// type, offload sections a stage.
Json with_context(std::string_view path, Json root) {
    if (path.rfind("scheduler.", 0) == 0 && path != "scheduler.type")
        root["scheduler"]["type"] = "WarmupLR";
    if (path.rfind("zero_optimization.offload", 0) == 0) root["zero_optimization"]["stage"] = 3;
    return root;
}

// Every implemented key is read and checked by the parser: a value of a type no key takes is
// refused with an error naming the key (a key the parser forgot would reach finish() instead).
TEST(ConfigKeys, EveryImplementedKeyIsReadAndChecked) {
    std::size_t checked = 0;
    for (const KeyInfo& k : key_table()) {
        if (k.status != KeyStatus::kImplemented && k.status != KeyStatus::kZinfinity) continue;
        const Json bad = Json::array({Json::array()});  // [[]]
        auto c = load_json_value(with_context(k.path, nested(k.path, bad)));
        ASSERT_FALSE(c.has_value()) << k.path << " accepted [[]]";
        EXPECT_NE(c.error().code(), StatusCode::kInternal)
            << k.path << ": " << c.error().to_string();
        EXPECT_NE(c.error().message().find(std::string(k.path)), std::string::npos)
            << k.path << ": " << c.error().to_string();
        ++checked;
    }
    EXPECT_GT(checked, 80u);
}

TEST(ConfigKeys, EveryWarnedKeyWarnsOnceNamingItselfAndIsIgnored) {
    for (const KeyInfo& k : key_table()) {
        if (k.status != KeyStatus::kWarned) continue;
        auto c = load_json_value(with_context(k.path, nested(k.path, true)));
        ASSERT_TRUE(c.has_value()) << k.path << ": " << c.error().to_string();
        ASSERT_EQ(c->warnings.size(), 1u) << k.path;
        EXPECT_NE(c->warnings[0].find(std::string(k.path) + ": DeepSpeed key not implemented"),
                  std::string::npos)
            << c->warnings[0];
    }
}

TEST(ConfigKeys, DefaultOnlyKeysTakeDeepSpeedsDefaultAndRefuseAnythingElse) {
    for (const KeyInfo& k : key_table()) {
        if (k.status != KeyStatus::kDefaultOnly) continue;
        auto ok = load_json_value(with_context(k.path, nested(k.path, Json::parse(k.accepted))));
        ASSERT_TRUE(ok.has_value()) << k.path << ": " << ok.error().to_string();
        EXPECT_TRUE(ok->warnings.empty()) << k.path;
        auto refused = load_json_value(with_context(k.path, nested(k.path, "something else")));
        ASSERT_FALSE(refused.has_value()) << k.path;
        const std::string& m = refused.error().message();
        EXPECT_NE(m.find(std::string(k.path) + ": zinfinity implements only DeepSpeed's default " +
                         std::string(k.accepted)),
                  std::string::npos)
            << m;
    }
}

TEST(ConfigKeys, BlocksThatChangeTheArithmeticAreRefusedOnlyWhenEnabled) {
    for (const KeyInfo& k : key_table()) {
        if (k.status != KeyStatus::kRefusedIfEnabled) continue;
        EXPECT_TRUE(load_json_value(nested(k.path, Json{{"enabled", false}})).has_value())
            << k.path;
        auto refused = load_json_value(nested(k.path, Json{{"enabled", true}}));
        ASSERT_FALSE(refused.has_value()) << k.path;
        EXPECT_NE(refused.error().message().find(std::string(k.path) + ".enabled: true"),
                  std::string::npos)
            << refused.error().message();
    }
}

TEST(ConfigKeys, AliasesAreOneKeyAndBothSpellingsAreAnError) {
    auto c = load_json_value(Json::parse(R"({"zero_optimization": {"stage": 3,
        "prefetch_bucket_size": 123, "param_persistence_threshold": 7, "max_live_parameters": 9}})"));
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    EXPECT_EQ(c->zero.stage3_prefetch_bucket_size_numel, 123u);
    EXPECT_EQ(c->zero.stage3_param_persistence_threshold_numel, 7u);
    EXPECT_EQ(c->zero.stage3_max_live_parameters_numel, 9u);
    for (const KeyInfo& k : key_table()) {
        if (k.status != KeyStatus::kAlias) continue;
        const KeyInfo* canonical = find_key(k.accepted);
        ASSERT_NE(canonical, nullptr) << k.path;
        if (canonical->status == KeyStatus::kDeprecated) continue;  // checked below
        Json root = nested(k.path, 1);
        const std::string name(k.accepted.substr(k.accepted.rfind('.') + 1));
        Json* parent = &root;
        for (std::string_view rest = k.accepted; rest.find('.') != std::string_view::npos;) {
            const auto dot = rest.find('.');
            parent = &(*parent)[std::string(rest.substr(0, dot))];
            rest = rest.substr(dot + 1);
        }
        (*parent)[name] = 1;
        auto both = load_json_value(root);
        ASSERT_FALSE(both.has_value()) << k.path;
        EXPECT_NE(both.error().message().find("two spellings of one key"), std::string::npos)
            << k.path << ": " << both.error().message();
    }
}

TEST(ConfigKeys, LegacyOffloadSwitchesMapWithADeprecationWarning) {
    auto c = load_json_value(Json::parse(
        R"({"zero_optimization": {"stage": 2, "cpu_offload": true, "cpu_offload_use_pin_memory": false}})"));
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    EXPECT_EQ(c->zero.offload_optimizer.device, OffloadDevice::kCpu);
    EXPECT_FALSE(c->zero.offload_optimizer.pin_memory);
    ASSERT_EQ(c->warnings.size(), 1u);
    EXPECT_NE(c->warnings[0].find("cpu_offload: deprecated"), std::string::npos) << c->warnings[0];
    auto p = load_json_value(
        Json::parse(R"({"zero_optimization": {"stage": 3, "cpu_offload_param": true}})"));
    ASSERT_TRUE(p.has_value()) << p.error().to_string();
    EXPECT_EQ(p->zero.offload_param.device, OffloadDevice::kCpu);
    auto misspelt = load_json_value(
        Json::parse(R"({"zero_optimization": {"stage": 3, "cpu_offload_params": true}})"));
    ASSERT_TRUE(misspelt.has_value()) << misspelt.error().to_string();
    EXPECT_EQ(misspelt->zero.offload_param.device, OffloadDevice::kCpu);
    auto both = load_json_value(Json::parse(R"({"zero_optimization": {"stage": 2,
        "cpu_offload": true, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}})"));
    ASSERT_FALSE(both.has_value());
    EXPECT_NE(both.error().message().find("keep offload_optimizer"), std::string::npos);
    auto off = load_json_value(
        Json::parse(R"({"zero_optimization": {"stage": 2, "cpu_offload": false}})"));
    ASSERT_TRUE(off.has_value());
    EXPECT_EQ(off->zero.offload_optimizer.device, OffloadDevice::kNone);
}

// Hugging Face's own ZeRO-3 test config (transformers tests/deepspeed/ds_config_zero3.json):
// "auto" everywhere and reduce_bucket_size 0.
constexpr const char* kHuggingFaceZero3 = R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                              "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": 500}},
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": true},
        "offload_param": {"device": "cpu", "pin_memory": true},
        "overlap_comm": true, "contiguous_gradients": true, "sub_group_size": 1e9,
        "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": true},
    "gradient_accumulation_steps": "auto",
    "steps_per_print": 2000,
    "train_batch_size": 64,
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": false
})";

TEST(ConfigAuto, HuggingFacesZero3ConfigLoadsWithEveryAutoResolvedAndPrinted) {
    auto c = load_json_value(Json::parse(kHuggingFaceZero3));
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    // Batch: gradient_accumulation_steps has nothing to come from but its default.
    EXPECT_EQ(c->batch.gradient_accumulation_steps, 1u);
    EXPECT_EQ(c->batch.train_micro_batch_size_per_gpu, 64u);
    EXPECT_FALSE(c->fp16.enabled);
    EXPECT_EQ(c->optimizer.lr, 1e-3);
    EXPECT_EQ(c->optimizer.beta2, 0.999);
    EXPECT_EQ(c->scheduler.warmup_max_lr, 1e-3);
    // Hidden size 1024 (the default MLP): prefetch 0.9 x 1024^2, persistence 10 x 1024.
    EXPECT_EQ(c->zero.stage3_prefetch_bucket_size_numel, 943718u);
    EXPECT_EQ(c->zero.stage3_param_persistence_threshold_numel, 10240u);
    std::string notes;
    for (const auto& n : c->resolved) notes += n + "\n";
    for (const char* key :
         {"optimizer.params.lr: auto -> 0.001", "fp16.enabled: auto -> false",
          "train_micro_batch_size_per_gpu: auto -> 64", "gradient_accumulation_steps: auto -> 1",
          "zero_optimization.stage3_prefetch_bucket_size: auto -> 943718",
          "scheduler.params.warmup_max_lr: auto -> 0.001"}) {
        EXPECT_NE(notes.find(key), std::string::npos) << key << "\n" << notes;
    }
    // What it does not implement draws warnings, each naming the key.
    std::string warnings;
    for (const auto& w : c->warnings) warnings += w + "\n";
    for (const char* key : {"overlap_comm", "contiguous_gradients", "reduce_bucket_size",
                            "stage3_max_reuse_distance", "wall_clock_breakdown"}) {
        EXPECT_NE(warnings.find(key), std::string::npos) << key << "\n" << warnings;
    }
}

TEST(ConfigAuto, WhatCannotBeDeterminedIsAnErrorNamingTheKey) {
    Json root = Json::parse(kHuggingFaceZero3);
    root["train_batch_size"] = "auto";
    auto c = load_json_value(root);
    ASSERT_FALSE(c.has_value());
    EXPECT_NE(
        c.error().message().find("train_micro_batch_size_per_gpu: \"auto\" cannot be resolved"),
        std::string::npos)
        << c.error().message();
    root = Json::parse(kHuggingFaceZero3);
    root["gradient_clipping"] = "auto";
    c = load_json_value(root);
    ASSERT_FALSE(c.has_value());
    EXPECT_NE(c.error().message().find("gradient_clipping: \"auto\" cannot be resolved"),
              std::string::npos)
        << c.error().message();
    root = Json::parse(kHuggingFaceZero3);
    root["scheduler"]["params"]["warmup_num_steps"] = "auto";
    c = load_json_value(root);
    ASSERT_FALSE(c.has_value());
    EXPECT_NE(c.error().message().find("scheduler.params.warmup_num_steps: \"auto\""),
              std::string::npos)
        << c.error().message();
}

TEST(ConfigKeys, ZeroIsValidWhereDeepSpeedAllowsIt) {
    auto c = load_json_value(Json::parse(R"({"zero_optimization": {"stage": 3,
        "reduce_bucket_size": 0, "stage3_prefetch_bucket_size": 0,
        "stage3_param_persistence_threshold": 0, "sub_group_size": 0}})"));
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    EXPECT_EQ(c->zero.stage3_prefetch_bucket_size_numel, 0u);
    EXPECT_EQ(c->zero.sub_group_size_numel, 0u);
}

TEST(ConfigKeys, OutOfRangeNumbersNameTheValue) {
    auto c = load_json_value(Json::parse(R"({"steps_per_print": 1e30})"));
    ASSERT_FALSE(c.has_value());
    EXPECT_NE(c.error().message().find("got 1e+30"), std::string::npos) << c.error().message();
    c = load_json_value(Json::parse(R"({"aio": {"queue_depth": 2.5}})"));
    ASSERT_FALSE(c.has_value());
    EXPECT_NE(c.error().message().find("got number 2.5"), std::string::npos) << c.error().message();
}

TEST(ConfigKeys, BiasCorrectionAndAmsgradAreAdamsOnly) {
    auto c = load_json_value(Json::parse(
        R"({"optimizer": {"type": "Adam", "params": {"bias_correction": false, "amsgrad": true}}})"));
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    EXPECT_FALSE(c->optimizer.bias_correction);
    EXPECT_TRUE(c->optimizer.amsgrad);
    EXPECT_TRUE(c->warnings.empty());
    c = load_json_value(
        Json::parse(R"({"optimizer": {"type": "Lion", "params": {"amsgrad": false}}})"));
    ASSERT_FALSE(c.has_value());
    EXPECT_NE(c.error().message().find("optimizer.params.amsgrad: only Adam and AdamW"),
              std::string::npos)
        << c.error().message();
}

// docs/CONFIG.md's key list is the table, rendered: one source of truth.
TEST(ConfigKeys, ConfigDocListsEveryKeyFromTheTable) {
    std::ifstream in(std::string(ZINF_SOURCE_DIR) + "/docs/CONFIG.md");
    ASSERT_TRUE(in) << "docs/CONFIG.md";
    std::stringstream doc;
    doc << in.rdbuf();
    const std::string begin =
        "<!-- BEGIN KEY TABLE (generated: scripts/update-config-doc.sh) -->\n";
    const std::string end = "<!-- END KEY TABLE -->";
    const auto b = doc.str().find(begin);
    const auto e = doc.str().find(end);
    ASSERT_NE(b, std::string::npos);
    ASSERT_NE(e, std::string::npos);
    EXPECT_EQ(doc.str().substr(b + begin.size(), e - b - begin.size()), key_table_markdown())
        << "docs/CONFIG.md is out of date: run scripts/update-config-doc.sh";
}

}  // namespace
}  // namespace zinf::config
