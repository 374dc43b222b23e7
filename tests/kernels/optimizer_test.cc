// kernels/optimizer.h: every variant against the double-precision oracle, bias correction over
// 1000 steps, bitwise equality across thread counts and offsets, and between SIMD widths.
#include "kernels/optimizer.h"

#include <gtest/gtest.h>
#include <oneapi/tbb/global_control.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cast.h"
#include "src/base/log.h"
#include "tests/kernels/optimizer_reference.h"
#include "tests/support/test_seed.h"

namespace zinf::kernels {
namespace {

using test::kRelativeTolerance;
using test::make_inputs;
using test::matches;
using test::reference_step;
using test::StepInputs;

constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};

std::string isa_param_name(const ::testing::TestParamInfo<Isa>& param_info) {
    return std::string(isa_name(param_info.param));
}
constexpr OptimizerKind kAllKinds[] = {OptimizerKind::kAdam, OptimizerKind::kAdamW,
                                       OptimizerKind::kAdagrad, OptimizerKind::kLion};
constexpr Dtype kAllGradDtypes[] = {Dtype::kFp32, Dtype::kBf16, Dtype::kFp16};

OptimizerKernel make_kernel(Isa isa, int threads) {
    auto kernel = OptimizerKernel::create(isa, threads);
    EXPECT_TRUE(kernel.has_value()) << kernel.status().to_string();
    return std::move(kernel).value();
}

OptimizerParams default_params(OptimizerKind kind, std::uint64_t step) {
    OptimizerParams p;
    p.kind = kind;
    p.step = step;
    p.lr = 1e-3;
    p.beta1 = 0.9;
    p.beta2 = kind == OptimizerKind::kLion ? 0.99 : 0.999;
    p.eps = 1e-8;
    p.weight_decay = 0.01;
    p.grad_scale = 0.5;
    return p;
}

// The outputs of one step over a copy of `in`.
struct StepOutputs {
    std::vector<float> params, exp_avg, exp_avg_sq;
    std::vector<std::uint16_t> copy;
};

StepOutputs run_step(const OptimizerKernel& kernel, const OptimizerParams& params,
                     const StepInputs& in, Dtype grad_dtype, Dtype copy_dtype, bool with_copy) {
    StepOutputs out{in.params, in.exp_avg, in.exp_avg_sq, {}};
    out.copy.assign(in.params.size(), 0xdead);
    ParamCopy copy = ParamCopy::none();
    if (with_copy)
        copy = copy_dtype == Dtype::kBf16 ? ParamCopy::bf16(out.copy) : ParamCopy::fp16(out.copy);
    const Status status = kernel.step(params, {out.params, out.exp_avg, out.exp_avg_sq},
                                      in.grad_view(grad_dtype), copy);
    EXPECT_TRUE(status.is_ok()) << status.to_string();
    return out;
}

std::string describe(std::size_t i, const StepInputs& in, Dtype grad_dtype) {
    return str_cat("element ", i, ": p=", in.params[i], " m=", in.exp_avg[i],
                   " v=", in.exp_avg_sq[i], " g=", in.grad_value(grad_dtype, i));
}

// Checks every output of a step against the oracle; stops after a few failures.
void expect_matches_reference(const OptimizerParams& params, const StepInputs& in,
                              const StepOutputs& out, Dtype grad_dtype, bool with_copy,
                              Dtype copy_dtype) {
    int failures = 0;
    const bool uses_exp_avg = params.kind != OptimizerKind::kAdagrad;
    const bool uses_exp_avg_sq = params.kind != OptimizerKind::kLion;
    for (std::size_t i = 0; i < in.params.size() && failures < 5; ++i) {
        const auto r = reference_step(params, {in.params[i], in.exp_avg[i], in.exp_avg_sq[i]},
                                      in.grad_value(grad_dtype, i));
        bool ok = matches(out.params[i], r.params, r.params_scale, kRelativeTolerance);
        EXPECT_TRUE(ok) << describe(i, in, grad_dtype) << ": params " << out.params[i] << " vs "
                        << r.params;
        if (uses_exp_avg) {
            const bool m_ok =
                matches(out.exp_avg[i], r.exp_avg, r.exp_avg_scale, kRelativeTolerance);
            EXPECT_TRUE(m_ok) << describe(i, in, grad_dtype) << ": exp_avg " << out.exp_avg[i]
                              << " vs " << r.exp_avg;
            ok = ok && m_ok;
        } else {
            EXPECT_EQ(float_bits(out.exp_avg[i]), float_bits(in.exp_avg[i]))
                << "unused exp_avg changed";
        }
        if (uses_exp_avg_sq) {
            const bool v_ok =
                matches(out.exp_avg_sq[i], r.exp_avg_sq, r.exp_avg_sq_scale, kRelativeTolerance);
            EXPECT_TRUE(v_ok) << describe(i, in, grad_dtype) << ": exp_avg_sq " << out.exp_avg_sq[i]
                              << " vs " << r.exp_avg_sq;
            ok = ok && v_ok;
        } else {
            EXPECT_EQ(float_bits(out.exp_avg_sq[i]), float_bits(in.exp_avg_sq[i]))
                << "unused exp_avg_sq changed";
        }
        if (with_copy) {
            const std::uint16_t expected = copy_dtype == Dtype::kBf16
                                               ? float_to_bf16(out.params[i])
                                               : float_to_fp16(out.params[i]);
            EXPECT_EQ(out.copy[i], expected) << describe(i, in, grad_dtype) << ": param copy";
            ok = ok && out.copy[i] == expected;
        } else {
            EXPECT_EQ(out.copy[i], 0xdead) << "copy written without being asked for";
        }
        if (!ok) ++failures;
    }
}

class OptimizerVariantTest
    : public ::testing::TestWithParam<std::tuple<Isa, OptimizerKind, Dtype>> {
protected:
    void SetUp() override {
        isa_ = std::get<0>(GetParam());
        kind_ = std::get<1>(GetParam());
        grad_dtype_ = std::get<2>(GetParam());
        if (!isa_supported(isa_)) {
            GTEST_SKIP() << "this CPU lacks the " << isa_name(isa_)
                         << " variant (detected: " << cpu_features().to_string() << ")";
        }
    }
    Isa isa_ = Isa::kScalar;
    OptimizerKind kind_ = OptimizerKind::kAdamW;
    Dtype grad_dtype_ = Dtype::kFp32;
};

TEST_P(OptimizerVariantTest, MatchesReferenceOnAwkwardSizesAndValues) {
    const auto kernel = make_kernel(isa_, 2);
    const std::size_t sizes[] = {0, 1, 15, 17, kChunkNumel + 3, 3 * kChunkNumel + 5};
    std::uint64_t seed = zinf::test::seed();
    int round = 0;
    for (const std::size_t numel : sizes) {
        for (const std::uint64_t step : {std::uint64_t{1}, std::uint64_t{7}}) {
            SCOPED_TRACE(str_cat("numel ", numel, ", step ", step));
            const StepInputs in = make_inputs(numel, ++seed);
            const OptimizerParams params = default_params(kind_, step);
            const bool with_copy = round % 3 != 0;
            const Dtype copy_dtype = round % 3 == 1 ? Dtype::kBf16 : Dtype::kFp16;
            ++round;
            const StepOutputs out =
                run_step(kernel, params, in, grad_dtype_, copy_dtype, with_copy);
            expect_matches_reference(params, in, out, grad_dtype_, with_copy, copy_dtype);
        }
    }
}

TEST_P(OptimizerVariantTest, MatchesReferenceWithoutWeightDecayOrBiasCorrection) {
    const auto kernel = make_kernel(isa_, 1);
    OptimizerParams params = default_params(kind_, 3);
    params.weight_decay = 0.0;
    params.bias_correction = false;
    params.grad_scale = 1.0;
    const StepInputs in = make_inputs(1000, zinf::test::seed() + 17);
    const StepOutputs out = run_step(kernel, params, in, grad_dtype_, Dtype::kBf16, false);
    expect_matches_reference(params, in, out, grad_dtype_, false, Dtype::kBf16);
}

TEST_P(OptimizerVariantTest, BitwiseIdenticalForThreadCounts1And2And7) {
    // Let oneTBB run more threads than this machine's cores, so that 7 really means 7.
    tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 8);
    const std::size_t numel = 7 * kChunkNumel + 5;
    const StepInputs in = make_inputs(numel, zinf::test::seed() + 29);
    const OptimizerParams params = default_params(kind_, 5);
    std::vector<StepOutputs> results;
    for (const int threads : {1, 2, 7}) {
        const auto kernel = make_kernel(isa_, threads);
        ASSERT_EQ(kernel.threads(), threads);
        results.push_back(run_step(kernel, params, in, grad_dtype_, Dtype::kBf16, true));
    }
    for (std::size_t r = 1; r < results.size(); ++r) {
        EXPECT_EQ(0, std::memcmp(results[0].params.data(), results[r].params.data(),
                                 numel * sizeof(float)));
        EXPECT_EQ(0, std::memcmp(results[0].exp_avg.data(), results[r].exp_avg.data(),
                                 numel * sizeof(float)));
        EXPECT_EQ(0, std::memcmp(results[0].exp_avg_sq.data(), results[r].exp_avg_sq.data(),
                                 numel * sizeof(float)));
        EXPECT_EQ(results[0].copy, results[r].copy);
    }
}

TEST_P(OptimizerVariantTest, ElementResultsDoNotDependOnOffsetOrChunking) {
    // The same values at a different offset fall in different chunks, vectors and tails, and
    // are misaligned; each element must still get the same bits.
    const std::size_t numel = 2 * kChunkNumel + 21;
    const StepInputs in = make_inputs(numel, zinf::test::seed() + 31);
    const OptimizerParams params = default_params(kind_, 2);
    const auto kernel = make_kernel(isa_, 2);
    const StepOutputs whole = run_step(kernel, params, in, grad_dtype_, Dtype::kFp16, true);
    for (const std::size_t offset : {std::size_t{1}, std::size_t{5}, kChunkNumel - 3}) {
        StepOutputs part{in.params, in.exp_avg, in.exp_avg_sq, std::vector<std::uint16_t>(numel)};
        const std::size_t n = numel - offset;
        GradView g = in.grad_view(grad_dtype_);
        g.data = static_cast<const char*>(g.data) + offset * dtype_size_bytes(grad_dtype_);
        g.numel = n;
        const Status status = kernel.step(
            params,
            {std::span(part.params).subspan(offset), std::span(part.exp_avg).subspan(offset),
             std::span(part.exp_avg_sq).subspan(offset)},
            g, ParamCopy::fp16(std::span(part.copy).subspan(offset)));
        ASSERT_TRUE(status.is_ok()) << status.to_string();
        EXPECT_EQ(0, std::memcmp(whole.params.data() + offset, part.params.data() + offset,
                                 n * sizeof(float)))
            << "offset " << offset;
        EXPECT_EQ(0, std::memcmp(whole.exp_avg.data() + offset, part.exp_avg.data() + offset,
                                 n * sizeof(float)));
        EXPECT_EQ(0, std::memcmp(whole.exp_avg_sq.data() + offset, part.exp_avg_sq.data() + offset,
                                 n * sizeof(float)));
        EXPECT_EQ(0, std::memcmp(whole.copy.data() + offset, part.copy.data() + offset,
                                 n * sizeof(std::uint16_t)));
    }
}

std::string variant_name(
    const ::testing::TestParamInfo<std::tuple<Isa, OptimizerKind, Dtype>>& info) {
    return str_cat(isa_name(std::get<0>(info.param)), "_",
                   optimizer_kind_name(std::get<1>(info.param)), "_",
                   dtype_name(std::get<2>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(AllVariants, OptimizerVariantTest,
                         ::testing::Combine(::testing::ValuesIn(kAllIsas),
                                            ::testing::ValuesIn(kAllKinds),
                                            ::testing::ValuesIn(kAllGradDtypes)),
                         variant_name);

class OptimizerIsaTest : public ::testing::TestWithParam<Isa> {
protected:
    void SetUp() override {
        if (!isa_supported(GetParam())) {
            GTEST_SKIP() << "this CPU lacks the " << isa_name(GetParam())
                         << " variant (detected: " << cpu_features().to_string() << ")";
        }
    }
};

TEST_P(OptimizerIsaTest, MatchesReferenceOnAMillionElements) {
    const std::size_t numel = (std::size_t{1} << 20) + 3;
    const StepInputs in = make_inputs(numel, zinf::test::seed() + 37);
    const OptimizerParams params = default_params(OptimizerKind::kAdamW, 11);
    const auto kernel = make_kernel(GetParam(), 0);
    const StepOutputs out = run_step(kernel, params, in, Dtype::kFp32, Dtype::kBf16, true);
    expect_matches_reference(params, in, out, Dtype::kFp32, true, Dtype::kBf16);
}

// Bias correction over 1000 steps: the kernel's trajectory stays on the double-precision one.
// Errors compound over steps, so the bound is relative to how far the parameters have moved.
TEST_P(OptimizerIsaTest, BiasCorrectionTracksReferenceOver1000Steps) {
    const std::size_t numel = 1024 + 5;
    const auto kernel = make_kernel(GetParam(), 2);
    for (const OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kAdam}) {
        SCOPED_TRACE(optimizer_kind_name(kind));
        std::mt19937_64 rng(zinf::test::seed() + 41);
        StepInputs in = make_inputs(numel, zinf::test::seed() + 43, {false, false});
        std::fill(in.exp_avg.begin(), in.exp_avg.end(), 0.0f);
        std::fill(in.exp_avg_sq.begin(), in.exp_avg_sq.end(), 0.0f);
        std::vector<test::ReferenceState> ref(numel);
        for (std::size_t i = 0; i < numel; ++i) ref[i] = {in.params[i], 0.0, 0.0};
        std::normal_distribution<float> noise(0.0f, 1.0f);
        double worst = 0.0;
        for (std::uint64_t step = 1; step <= 1000; ++step) {
            OptimizerParams params = default_params(kind, step);
            params.grad_scale = 1.0;
            // A gradient with a steady part, so that the moments are far from their start.
            for (std::size_t i = 0; i < numel; ++i)
                in.grads_fp32[i] = 0.1f * static_cast<float>(i % 7) - 0.3f + noise(rng);
            ASSERT_TRUE(kernel
                            .step(params, {in.params, in.exp_avg, in.exp_avg_sq},
                                  in.grad_view(Dtype::kFp32))
                            .is_ok());
            for (std::size_t i = 0; i < numel; ++i) {
                const auto r = reference_step(params, ref[i], in.grads_fp32[i]);
                ref[i] = {r.params, r.exp_avg, r.exp_avg_sq};
                // Each step moves a parameter by about lr; allow 1e-4 of the distance travelled.
                const double scale = std::fabs(r.params) + params.lr * static_cast<double>(step);
                const double error = std::fabs(in.params[i] - r.params) / scale;
                worst = std::max(worst, error);
                if (step == 1 || step == 2 || step == 10 || step == 100 || step == 1000) {
                    ASSERT_LE(error, 1e-4) << "step " << step << " element " << i << ": "
                                           << in.params[i] << " vs " << r.params;
                }
            }
        }
        RecordProperty(str_cat("worst_relative_error_", optimizer_kind_name(kind)),
                       std::to_string(worst));
        EXPECT_LE(worst, 1e-4);
    }
}

// With a constant gradient the bias-corrected moments are exactly g and g*g at every step, so
// AdamW moves each parameter by lr * g / (|g| + eps) per step: any error in the bias
// correction of step t shows up as a wrong distance.
TEST_P(OptimizerIsaTest, ConstantGradientMovesLrPerStep) {
    const std::size_t numel = 67;
    const auto kernel = make_kernel(GetParam(), 1);
    std::vector<float> p(numel, 1.0f), m(numel, 0.0f), v(numel, 0.0f), g(numel);
    for (std::size_t i = 0; i < numel; ++i)
        g[i] = (i % 2 == 0 ? 1.0f : -1.0f) * (0.01f + 0.1f * static_cast<float>(i));
    OptimizerParams params = default_params(OptimizerKind::kAdamW, 1);
    params.weight_decay = 0.0;
    params.grad_scale = 1.0;
    for (std::uint64_t step = 1; step <= 1000; ++step) {
        params.step = step;
        ASSERT_TRUE(kernel.step(params, {p, m, v}, GradView::fp32(g)).is_ok());
        for (std::size_t i = 0; i < numel; ++i) {
            const double per_step = params.lr * std::fabs(g[i]) / (std::fabs(g[i]) + params.eps);
            const double expected =
                1.0 - (g[i] > 0 ? 1.0 : -1.0) * per_step * static_cast<double>(step);
            ASSERT_NEAR(p[i], expected, 1e-4 * per_step * static_cast<double>(step) + 1e-6)
                << "step " << step << " element " << i;
        }
    }
}

TEST_P(OptimizerIsaTest, RejectsOutOfRangeParamsAndChangesNothing) {
    const auto kernel = make_kernel(GetParam(), 1);
    const StepInputs in = make_inputs(33, zinf::test::seed() + 47, {false, false});
    std::vector<float> p = in.params, m = in.exp_avg, v = in.exp_avg_sq;
    std::vector<OptimizerParams> bad(6, default_params(OptimizerKind::kAdamW, 1));
    bad[0].step = 0;
    bad[1].beta1 = 1.0;
    bad[2].beta2 = -0.1;
    bad[3].lr = std::numeric_limits<double>::quiet_NaN();
    bad[4].eps = -1e-8;
    bad[5].grad_scale = std::numeric_limits<double>::infinity();
    for (const auto& params : bad) {
        const Status status = kernel.step(params, {p, m, v}, in.grad_view(Dtype::kFp32));
        EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
        EXPECT_NE(status.message().find("optimizer "), std::string::npos) << status.message();
    }
    EXPECT_EQ(p, in.params);
    EXPECT_EQ(m, in.exp_avg);
    EXPECT_EQ(v, in.exp_avg_sq);
}

INSTANTIATE_TEST_SUITE_P(AllIsas, OptimizerIsaTest, ::testing::ValuesIn(kAllIsas), isa_param_name);

// The AVX2 and AVX-512 variants perform the same IEEE operations in the same order, so they
// agree to the bit; only the scalar variant (no FMA) differs, within the oracle's tolerance.
TEST(OptimizerCrossVariantTest, Avx2AndAvx512AgreeBitwise) {
    if (!isa_supported(Isa::kAvx512)) {
        GTEST_SKIP() << "needs AVX-512 and AVX2 (detected: " << cpu_features().to_string() << ")";
    }
    const std::size_t numel = kChunkNumel + 77;
    const auto avx2 = make_kernel(Isa::kAvx2, 2);
    const auto avx512 = make_kernel(Isa::kAvx512, 2);
    for (const OptimizerKind kind : kAllKinds) {
        for (const Dtype grad_dtype : kAllGradDtypes) {
            SCOPED_TRACE(str_cat(optimizer_kind_name(kind), " ", dtype_name(grad_dtype)));
            const StepInputs in = make_inputs(numel, zinf::test::seed() + 53);
            const OptimizerParams params = default_params(kind, 9);
            const StepOutputs a = run_step(avx2, params, in, grad_dtype, Dtype::kBf16, true);
            const StepOutputs b = run_step(avx512, params, in, grad_dtype, Dtype::kBf16, true);
            EXPECT_EQ(0, std::memcmp(a.params.data(), b.params.data(), numel * sizeof(float)));
            EXPECT_EQ(0, std::memcmp(a.exp_avg.data(), b.exp_avg.data(), numel * sizeof(float)));
            EXPECT_EQ(0,
                      std::memcmp(a.exp_avg_sq.data(), b.exp_avg_sq.data(), numel * sizeof(float)));
            EXPECT_EQ(a.copy, b.copy);
        }
    }
}

TEST(OptimizerParamsTest, FromConfigMapsDeepSpeedTypes) {
    config::OptimizerConfig c;
    c.type = config::OptimizerType::kAdam;
    c.adam_w_mode = true;
    EXPECT_EQ(OptimizerParams::from_config(c).kind, OptimizerKind::kAdamW);
    c.adam_w_mode = false;
    EXPECT_EQ(OptimizerParams::from_config(c).kind, OptimizerKind::kAdam);
    c.type = config::OptimizerType::kLion;
    c.lr = 3e-4;
    c.beta2 = 0.99;
    const OptimizerParams p = OptimizerParams::from_config(c);
    EXPECT_EQ(p.kind, OptimizerKind::kLion);
    EXPECT_EQ(p.lr, 3e-4);
    EXPECT_EQ(p.beta2, 0.99);
    EXPECT_EQ(p.step, 1u);
    EXPECT_TRUE(validate(p).is_ok());
}

}  // namespace
}  // namespace zinf::kernels
