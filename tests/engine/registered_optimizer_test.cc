// An optimizer added from outside the project's sources, as kernels/README.md's recipe says:
// one descriptor and its kernel, registered from this test binary (this file and one line in
// tests/engine/CMakeLists.txt), then used by the config parser, the plan, the three state stores
// (device, host, NVMe through the swapper), the checkpoints and a resume, with nothing else
// changed. The optimizer is SGD with heavy-ball momentum and decoupled weight decay:
//   buf = beta1 * buf + g;  p = p * (1 - lr * wd) - lr * buf
// (torch.optim.SGD's momentum_buffer with dampening 0; beta1 is the momentum).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "kernels/cast.h"
#include "kernels/optimizer.h"
#include "src/engine/engine.h"
#include "tests/engine/engine_test_support.h"
#include "tests/support/test_seed.h"

namespace zinf {
namespace {

// ---- the kernel: one element at a time, per gradient dtype and copy dtype -----------------

template <int kGrad>
float grad_at(const void* grads, std::size_t i) noexcept {
    if constexpr (kGrad == 0) return static_cast<const float*>(grads)[i];
    if constexpr (kGrad == 1)
        return kernels::bf16_to_float(static_cast<const std::uint16_t*>(grads)[i]);
    return kernels::fp16_to_float(static_cast<const std::uint16_t*>(grads)[i]);
}

template <int kGrad, int kCopy>
void sgd_chunk(const kernels::detail::StepArgs& a, std::size_t begin, std::size_t end) noexcept {
    float* buf = a.moments[0];
    for (std::size_t i = begin; i < end; ++i) {
        const float g = grad_at<kGrad>(a.grads, i) * a.c.grad_scale;
        buf[i] = a.c.beta1 * buf[i] + g;
        a.params[i] = a.params[i] * a.c.decay_factor + a.c.step_size * buf[i];
        auto* copy = static_cast<std::uint16_t*>(a.param_copy);
        if constexpr (kCopy == 1) copy[i] = kernels::float_to_bf16(a.params[i]);
        if constexpr (kCopy == 2) copy[i] = kernels::float_to_fp16(a.params[i]);
    }
}

template <int kGrad>
void set_copies(kernels::OptimizerKernelEntries& e) {
    e.step[0][kGrad][0] = &sgd_chunk<kGrad, 0>;
    e.step[0][kGrad][1] = &sgd_chunk<kGrad, 1>;
    e.step[0][kGrad][2] = &sgd_chunk<kGrad, 2>;
}

kernels::OptimizerKernelEntries sgd_entries() {
    kernels::OptimizerKernelEntries e;
    set_copies<0>(e);
    set_copies<1>(e);
    set_copies<2>(e);
    return e;  // no amsgrad entries: the descriptor says it has none
}

// ---- the descriptor -----------------------------------------------------------------------

OptimizerDescriptor sgd_descriptor() {
    OptimizerDescriptor d;
    d.name = "test_sgd";
    d.display_name = "TestSGD";
    d.moments = {MomentDescriptor{"momentum_buffer", "momentum_buffer", false, false}};
    d.moment_count = 1;
    d.uses_betas = true;  // beta1 is the momentum
    return d;
}

const kernels::OptimizerKernelEntries kSgdEntries = sgd_entries();
const OptimizerKind kSgd = kernels::register_optimizer(sgd_descriptor(), kSgdEntries).value();

// ---- the tests ----------------------------------------------------------------------------

using test_support::bits;
using test_support::load_config;
using test_support::small_config;
using test_support::Trainer;
using test_support::with_nvme;

std::string sgd_config(const std::string& zero) {
    std::string c = small_config(zero);
    const std::string adamw = R"("type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01})";
    c.replace(c.find(adamw), adamw.size(),
              R"("type": "testsgd", "params": {"lr": 0.05, "betas": [0.8, 0.999],)"
              R"( "weight_decay": 0.01})");
    return c;
}

TEST(RegisteredOptimizer, TheConfigThePlanAndTheSummaryKnowIt) {
    const auto config = load_config(sgd_config(""));
    EXPECT_EQ(config.optimizer.type, kSgd);
    EXPECT_EQ(config.optimizer.beta1, 0.8);
    Trainer t(config);
    EXPECT_EQ(t.engine().plan().state_count, 2u);  // the master and the momentum buffer
    EXPECT_NE(t.engine().summary().find("test_sgd"), std::string::npos) << t.engine().summary();
    // Keys its descriptor does not have are refused by name.
    config::LoadOptions o;
    o.log_warnings = false;
    std::string c = sgd_config("");
    c.replace(c.find(R"("weight_decay": 0.01})"), 21, R"("weight_decay": 0.01, "amsgrad": true})");
    const auto refused = config::load_from_string(c, o, "test.json");
    ASSERT_FALSE(refused.has_value());
    EXPECT_NE(refused.error().message().find("amsgrad: only Adam and AdamW have it"),
              std::string::npos)
        << refused.error().to_string();
    // Compressed states have kernels for the built-in optimizers only: refused by the key.
    const auto compressed = config::load_from_string(
        sgd_config(R"("zero_optimization": {"stage": 1, "offload_optimizer": )"
                   R"({"state_dtype": "int8"}},)"),
        o, "test.json");
    ASSERT_FALSE(compressed.has_value());
    EXPECT_EQ(compressed.error().code(), StatusCode::kNotSupported);
    EXPECT_NE(compressed.error().message().find("offload_optimizer.state_dtype"), std::string::npos)
        << compressed.error().to_string();
}

// The device, host and NVMe state stores (the last through the swapper, with the parameters and
// streamed gradients on NVMe too) all step it: bitwise the same losses and parameters, a loss
// that falls, and a run that is not AdamW's.
TEST(RegisteredOptimizer, EveryPlacementTrainsBitwiseTheSameAndLearns) {
    test::TempDir nvme("nvme");
    const char* zeros[] = {
        R"("zero_optimization": {"stage": 0},)",
        R"("zero_optimization": {"stage": 2, "sub_group_size": 100, "offload_optimizer": {"device": "cpu"}},)",
        R"("zero_optimization": {"stage": 3, "sub_group_size": 300, "stage3_param_persistence_threshold": 20,)"
        R"( "offload_param": {"device": "nvme", "nvme_path": "@NVME@"},)"
        R"( "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@", "stream_gradients": true}},)",
    };
    std::vector<std::uint32_t> ref_losses, ref_params;
    for (const char* zero : zeros) {
        Trainer t(load_config(with_nvme(sgd_config(zero), nvme.path())));
        const auto losses = t.run(20);
        EXPECT_LT(losses.back(), 0.8 * losses.front()) << zero;
        const auto params = bits(t.engine().master_parameters().value());
        if (ref_losses.empty()) {
            ref_losses = bits(losses);
            ref_params = params;
            Trainer adamw(load_config(small_config(zero)));
            EXPECT_NE(bits(adamw.run(20)), ref_losses);
            continue;
        }
        EXPECT_EQ(bits(losses), ref_losses) << zero;
        EXPECT_EQ(params, ref_params) << zero;
    }
}

// The first step is the formula: the momentum buffer starts at zero, so buf = g and
// p1 = p0 * (1 - lr * wd) - lr * g, checked on every element against the gradients the engine
// used (recovered from a zero-momentum, zero-decay step: p0 - p1 = lr * g).
TEST(RegisteredOptimizer, TheFirstStepIsTheFormula) {
    auto run_one = [](const std::string& params) {
        std::string c = sgd_config("");
        const std::string from =
            R"("params": {"lr": 0.05, "betas": [0.8, 0.999], "weight_decay": 0.01})";
        c.replace(c.find(from), from.size(), params);
        Trainer t(load_config(c));
        const auto before = t.engine().master_parameters().value();
        t.run(1);
        return std::make_pair(before, t.engine().master_parameters().value());
    };
    const auto [p0, plain] = run_one(R"("params": {"lr": 0.05, "betas": [0.0, 0.999]})");
    const auto [q0, decayed] =
        run_one(R"("params": {"lr": 0.05, "betas": [0.8, 0.999], "weight_decay": 0.01})");
    ASSERT_EQ(p0, q0);
    const float decay = static_cast<float>(1.0 - 0.05 * 0.01);
    for (std::size_t i = 0; i < p0.size(); ++i) {
        const float lr_g = p0[i] - plain[i];  // lr * g, exactly as the kernel computed -lr * g
        EXPECT_FLOAT_EQ(decayed[i], p0[i] * decay - lr_g) << i;
    }
}

// Checkpoints carry its moment under its descriptor's name, and a resume is bitwise.
TEST(RegisteredOptimizer, CheckpointsNameItsMomentAndResumeBitwise) {
    test::TempDir nvme("nvme");
    test::TempDir ckpt("ckpt");
    const std::string zero =
        R"("zero_optimization": {"stage": 3, "sub_group_size": 300, "stage3_param_persistence_threshold": 20,)"
        R"( "offload_param": {"device": "nvme", "nvme_path": "@NVME@"},)"
        R"( "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@"}},)";
    const auto config = load_config(with_nvme(sgd_config(zero), nvme.path()));
    std::vector<std::uint32_t> expected;
    {
        Trainer t(config);
        t.run(3);
        ASSERT_TRUE(t.engine().save_checkpoint(ckpt.path(), "three").is_ok());
        expected = bits(t.run(3));
    }
    EXPECT_TRUE(std::filesystem::exists(ckpt.file("three/momentum_buffer.fp32")));
    EXPECT_FALSE(std::filesystem::exists(ckpt.file("three/exp_avg.fp32")));
    Trainer r(config);
    ASSERT_TRUE(r.engine().load_checkpoint(ckpt.path(), "three").is_ok());
    EXPECT_EQ(bits(r.run(3)), expected);
}

}  // namespace
}  // namespace zinf
