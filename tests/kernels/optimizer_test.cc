// kernels/optimizer.h: every variant against the double-precision oracle, bias correction over
// 1000 steps, AMSGrad and bias correction off on every Adam kind, bitwise equality across thread
// counts and offsets, and between SIMD widths.
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
constexpr DType kAllGradDtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

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
    std::vector<float> params, exp_avg, exp_avg_sq, max_exp_avg_sq;
    std::vector<std::uint16_t> copy;
};

// Passes max_exp_avg_sq only with amsgrad, as a caller without AMSGrad would (an empty span).
// The kept moments in the descriptor's order, each the output array of its name.
OptimizerState state_of(StepOutputs& out, const OptimizerParams& params) {
    const OptimizerDescriptor& d = optimizer_descriptor(params.kind);
    OptimizerState state;
    state.params = out.params;
    for (std::size_t i = 0; i < d.kept_moment_count(params.amsgrad); ++i) {
        const std::string_view name = d.moments[i].name;
        state.moments[i] = name == "exp_avg"      ? std::span<float>(out.exp_avg)
                           : name == "exp_avg_sq" ? std::span<float>(out.exp_avg_sq)
                                                  : std::span<float>(out.max_exp_avg_sq);
    }
    return state;
}

StepOutputs run_step(const OptimizerKernel& kernel, const OptimizerParams& params,
                     const StepInputs& in, DType grad_dtype, DType copy_dtype, bool with_copy) {
    StepOutputs out{in.params, in.exp_avg, in.exp_avg_sq, in.max_exp_avg_sq, {}};
    out.copy.assign(in.params.size(), 0xdead);
    ParamCopy copy = ParamCopy::none();
    if (with_copy)
        copy =
            copy_dtype == DType::kBFloat16 ? ParamCopy::bf16(out.copy) : ParamCopy::fp16(out.copy);
    const Status status =
        kernel.step(params, state_of(out, params), in.grad_view(grad_dtype), copy);
    EXPECT_TRUE(status.is_ok()) << status.to_string();
    return out;
}

std::string describe(std::size_t i, const StepInputs& in, DType grad_dtype) {
    return str_cat("element ", i, ": p=", in.params[i], " m=", in.exp_avg[i],
                   " v=", in.exp_avg_sq[i], " v_max=", in.max_exp_avg_sq[i],
                   " g=", in.grad_value(grad_dtype, i));
}

// Checks every output of a step against the oracle; stops after a few failures.
void expect_matches_reference(const OptimizerParams& params, const StepInputs& in,
                              const StepOutputs& out, DType grad_dtype, bool with_copy,
                              DType copy_dtype) {
    int failures = 0;
    const bool uses_exp_avg = params.kind != OptimizerKind::kAdagrad;
    const bool uses_exp_avg_sq = params.kind != OptimizerKind::kLion;
    for (std::size_t i = 0; i < in.params.size() && failures < 5; ++i) {
        const auto r = reference_step(
            params, {in.params[i], in.exp_avg[i], in.exp_avg_sq[i], in.max_exp_avg_sq[i]},
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
        if (params.amsgrad) {
            const bool max_ok = matches(out.max_exp_avg_sq[i], r.max_exp_avg_sq,
                                        r.max_exp_avg_sq_scale, kRelativeTolerance);
            EXPECT_TRUE(max_ok) << describe(i, in, grad_dtype) << ": max_exp_avg_sq "
                                << out.max_exp_avg_sq[i] << " vs " << r.max_exp_avg_sq;
            ok = ok && max_ok;
        } else {
            EXPECT_EQ(float_bits(out.max_exp_avg_sq[i]), float_bits(in.max_exp_avg_sq[i]))
                << "max_exp_avg_sq changed without amsgrad";
        }
        if (with_copy) {
            const std::uint16_t expected = copy_dtype == DType::kBFloat16
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

// Every output of `b` from element `offset` on has the bits of `a`'s.
void expect_bitwise_equal(const StepOutputs& a, const StepOutputs& b, std::size_t offset) {
    const std::size_t n = a.params.size() - offset;
    const auto same = [&](const std::vector<float>& x, const std::vector<float>& y) {
        return std::memcmp(x.data() + offset, y.data() + offset, n * sizeof(float)) == 0;
    };
    EXPECT_TRUE(same(a.params, b.params)) << "params, from offset " << offset;
    EXPECT_TRUE(same(a.exp_avg, b.exp_avg)) << "exp_avg, from offset " << offset;
    EXPECT_TRUE(same(a.exp_avg_sq, b.exp_avg_sq)) << "exp_avg_sq, from offset " << offset;
    EXPECT_TRUE(same(a.max_exp_avg_sq, b.max_exp_avg_sq)) << "max_exp_avg_sq, from " << offset;
    EXPECT_EQ(
        0, std::memcmp(a.copy.data() + offset, b.copy.data() + offset, n * sizeof(std::uint16_t)))
        << "copy, from offset " << offset;
}

void expect_bitwise_across_thread_counts(Isa isa, const OptimizerParams& params, DType grad_dtype,
                                         std::uint64_t seed) {
    // Let oneTBB run more threads than this machine's cores, so that 7 really means 7.
    tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 8);
    const std::size_t numel = 7 * kChunkNumel + 5;
    const StepInputs in = make_inputs(numel, seed);
    std::vector<StepOutputs> results;
    for (const int threads : {1, 2, 7}) {
        const auto kernel = make_kernel(isa, threads);
        ASSERT_EQ(kernel.threads(), threads);
        results.push_back(run_step(kernel, params, in, grad_dtype, DType::kBFloat16, true));
    }
    for (std::size_t r = 1; r < results.size(); ++r) {
        SCOPED_TRACE(str_cat("threads: 1 vs result ", r));
        expect_bitwise_equal(results[0], results[r], 0);
    }
}

// The same values at a different offset fall in different chunks, vectors and tails, and are
// misaligned; each element must still get the same bits.
void expect_bitwise_across_offsets(Isa isa, const OptimizerParams& params, DType grad_dtype,
                                   std::uint64_t seed) {
    const std::size_t numel = 2 * kChunkNumel + 21;
    const StepInputs in = make_inputs(numel, seed);
    const auto kernel = make_kernel(isa, 2);
    const StepOutputs whole = run_step(kernel, params, in, grad_dtype, DType::kFloat16, true);
    for (const std::size_t offset : {std::size_t{1}, std::size_t{5}, kChunkNumel - 3}) {
        StepOutputs part{in.params, in.exp_avg, in.exp_avg_sq, in.max_exp_avg_sq,
                         std::vector<std::uint16_t>(numel)};
        GradView g = in.grad_view(grad_dtype);
        g.data = static_cast<const char*>(g.data) + offset * dtype_size_bytes(grad_dtype);
        g.numel = numel - offset;
        OptimizerState state = state_of(part, params);
        state.params = state.params.subspan(offset);
        for (auto& m : state.moments) {
            if (!m.empty()) m = m.subspan(offset);
        }
        const Status status =
            kernel.step(params, state, g, ParamCopy::fp16(std::span(part.copy).subspan(offset)));
        ASSERT_TRUE(status.is_ok()) << status.to_string();
        expect_bitwise_equal(whole, part, offset);
    }
}

class OptimizerVariantTest
    : public ::testing::TestWithParam<std::tuple<Isa, OptimizerKind, DType>> {
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
    DType grad_dtype_ = DType::kFloat32;
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
            const DType copy_dtype = round % 3 == 1 ? DType::kBFloat16 : DType::kFloat16;
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
    const StepOutputs out = run_step(kernel, params, in, grad_dtype_, DType::kBFloat16, false);
    expect_matches_reference(params, in, out, grad_dtype_, false, DType::kBFloat16);
}

// The kind's default step, and for Adam and AdamW also with amsgrad (bias correction changes only
// the step's constants, not the per-element code).
std::vector<OptimizerParams> code_paths(OptimizerKind kind, std::uint64_t step) {
    std::vector<OptimizerParams> paths{default_params(kind, step)};
    if (kind == OptimizerKind::kAdam || kind == OptimizerKind::kAdamW) {
        paths.push_back(paths[0]);
        paths.back().amsgrad = true;
    }
    return paths;
}

TEST_P(OptimizerVariantTest, BitwiseIdenticalForThreadCounts1And2And7) {
    for (const OptimizerParams& params : code_paths(kind_, 5)) {
        SCOPED_TRACE(str_cat("amsgrad ", params.amsgrad));
        expect_bitwise_across_thread_counts(isa_, params, grad_dtype_, zinf::test::seed() + 29);
    }
}

TEST_P(OptimizerVariantTest, ElementResultsDoNotDependOnOffsetOrChunking) {
    for (const OptimizerParams& params : code_paths(kind_, 2)) {
        SCOPED_TRACE(str_cat("amsgrad ", params.amsgrad));
        expect_bitwise_across_offsets(isa_, params, grad_dtype_, zinf::test::seed() + 31);
    }
}

std::string variant_name(
    const ::testing::TestParamInfo<std::tuple<Isa, OptimizerKind, DType>>& info) {
    return str_cat(isa_name(std::get<0>(info.param)), "_",
                   optimizer_kind_name(std::get<1>(info.param)), "_",
                   dtype_name(std::get<2>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(AllVariants, OptimizerVariantTest,
                         ::testing::Combine(::testing::ValuesIn(kAllIsas),
                                            ::testing::ValuesIn(kAllKinds),
                                            ::testing::ValuesIn(kAllGradDtypes)),
                         variant_name);

// Adam and AdamW with amsgrad on and off and bias correction on and off: the options that change
// the Adam kinds' arithmetic, on every variant and gradient dtype.
using AdamOptions = std::tuple<Isa, OptimizerKind, DType, bool /*amsgrad*/, bool /*bias_corr*/>;

class AdamOptionsTest : public ::testing::TestWithParam<AdamOptions> {
protected:
    void SetUp() override {
        isa_ = std::get<0>(GetParam());
        grad_dtype_ = std::get<2>(GetParam());
        params_ = default_params(std::get<1>(GetParam()), 1);
        params_.amsgrad = std::get<3>(GetParam());
        params_.bias_correction = std::get<4>(GetParam());
        if (!isa_supported(isa_)) {
            GTEST_SKIP() << "this CPU lacks the " << isa_name(isa_)
                         << " variant (detected: " << cpu_features().to_string() << ")";
        }
    }
    Isa isa_ = Isa::kScalar;
    DType grad_dtype_ = DType::kFloat32;
    OptimizerParams params_;
};

// Several steps, each checked against the oracle from the state the kernel left, with fresh
// gradients every step and weight decay on odd steps only (Adam without it takes AdamW's path).
TEST_P(AdamOptionsTest, MatchesReferenceOverStepsOnAwkwardSizes) {
    const auto kernel = make_kernel(isa_, 2);
    std::uint64_t seed = zinf::test::seed() + 59;
    for (const std::size_t numel :
         {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{17}, kChunkNumel + 3}) {
        StepInputs in = make_inputs(numel, ++seed);
        for (std::uint64_t step = 1; step <= 4; ++step) {
            SCOPED_TRACE(str_cat("numel ", numel, ", step ", step));
            OptimizerParams params = params_;
            params.step = step;
            params.weight_decay = step % 2 == 1 ? 0.01 : 0.0;
            const bool with_copy = step % 2 == 0;
            const StepOutputs out =
                run_step(kernel, params, in, grad_dtype_, DType::kBFloat16, with_copy);
            expect_matches_reference(params, in, out, grad_dtype_, with_copy, DType::kBFloat16);
            if (HasFailure()) return;
            // The next step starts from this one's state, with new gradients.
            const StepInputs fresh = make_inputs(numel, ++seed);
            in.params = out.params;
            in.exp_avg = out.exp_avg;
            in.exp_avg_sq = out.exp_avg_sq;
            if (params.amsgrad) in.max_exp_avg_sq = out.max_exp_avg_sq;
            in.grads_fp32 = fresh.grads_fp32;
            in.grads_bf16 = fresh.grads_bf16;
            in.grads_fp16 = fresh.grads_fp16;
        }
    }
}

std::string adam_options_name(const ::testing::TestParamInfo<AdamOptions>& info) {
    return str_cat(
        isa_name(std::get<0>(info.param)), "_", optimizer_kind_name(std::get<1>(info.param)), "_",
        dtype_name(std::get<2>(info.param)), std::get<3>(info.param) ? "_amsgrad" : "_noamsgrad",
        std::get<4>(info.param) ? "_biascorrection" : "_nobiascorrection");
}

INSTANTIATE_TEST_SUITE_P(
    AllVariants, AdamOptionsTest,
    ::testing::Combine(::testing::ValuesIn(kAllIsas),
                       ::testing::Values(OptimizerKind::kAdam, OptimizerKind::kAdamW),
                       ::testing::ValuesIn(kAllGradDtypes), ::testing::Bool(), ::testing::Bool()),
    adam_options_name);

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
    const StepOutputs out = run_step(kernel, params, in, DType::kFloat32, DType::kBFloat16, true);
    expect_matches_reference(params, in, out, DType::kFloat32, true, DType::kBFloat16);
}

// The same size through the new arithmetic: Adam (L2) with amsgrad and without bias correction,
// and AdamW with amsgrad, bias corrected.
TEST_P(OptimizerIsaTest, AmsgradMatchesReferenceOnAMillionElements) {
    const std::size_t numel = (std::size_t{1} << 20) + 3;
    const StepInputs in = make_inputs(numel, zinf::test::seed() + 73);
    const auto kernel = make_kernel(GetParam(), 0);
    for (const OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
        SCOPED_TRACE(optimizer_kind_name(kind));
        OptimizerParams params = default_params(kind, 11);
        params.amsgrad = true;
        params.bias_correction = kind == OptimizerKind::kAdamW;
        const StepOutputs out =
            run_step(kernel, params, in, DType::kBFloat16, DType::kFloat16, true);
        expect_matches_reference(params, in, out, DType::kBFloat16, true, DType::kFloat16);
    }
}

// Runs steps 1..`steps` of `base` from zero moments on the kernel and on the double oracle,
// each with the gradient magnitude(step) * (a steady part + noise), so that the moments are far
// from their start. Errors compound over steps, so they are measured relative to how far the
// parameters have moved: each step moves a parameter by about lr; 1e-4 of the distance
// travelled is allowed. Returns the worst error seen.
double expect_tracks_reference(const OptimizerKernel& kernel, const OptimizerParams& base,
                               std::uint64_t steps, float (*magnitude)(std::uint64_t step)) {
    const std::size_t numel = 1024 + 5;
    std::mt19937_64 rng(zinf::test::seed() + 41);
    StepInputs in = make_inputs(numel, zinf::test::seed() + 43, {false, false});
    std::fill(in.exp_avg.begin(), in.exp_avg.end(), 0.0f);
    std::fill(in.exp_avg_sq.begin(), in.exp_avg_sq.end(), 0.0f);
    std::fill(in.max_exp_avg_sq.begin(), in.max_exp_avg_sq.end(), 0.0f);
    std::vector<test::ReferenceState> ref(numel);
    for (std::size_t i = 0; i < numel; ++i) ref[i] = {in.params[i], 0.0, 0.0, 0.0};
    std::normal_distribution<float> noise(0.0f, 1.0f);
    double worst = 0.0;
    for (std::uint64_t step = 1; step <= steps; ++step) {
        OptimizerParams params = base;
        params.step = step;
        for (std::size_t i = 0; i < numel; ++i) {
            in.grads_fp32[i] =
                magnitude(step) * (0.1f * static_cast<float>(i % 7) - 0.3f + noise(rng));
        }
        OptimizerState state;
        state.params = in.params;
        state.moments = {std::span<float>(in.exp_avg), std::span<float>(in.exp_avg_sq),
                         params.amsgrad ? std::span<float>(in.max_exp_avg_sq) : std::span<float>()};
        const Status status = kernel.step(params, state, in.grad_view(DType::kFloat32));
        EXPECT_TRUE(status.is_ok()) << status.to_string();
        for (std::size_t i = 0; i < numel; ++i) {
            const auto r = reference_step(params, ref[i], in.grads_fp32[i]);
            ref[i] = {r.params, r.exp_avg, r.exp_avg_sq, r.max_exp_avg_sq};
            const double scale = std::fabs(r.params) + params.lr * static_cast<double>(step);
            const double error = std::fabs(in.params[i] - r.params) / scale;
            worst = std::max(worst, error);
            if (step == 1 || step == 2 || step == 10 || step == 100 || step == steps) {
                EXPECT_LE(error, 1e-4) << "step " << step << " element " << i << ": "
                                       << in.params[i] << " vs " << r.params;
                if (error > 1e-4) return worst;
            }
        }
    }
    EXPECT_LE(worst, 1e-4);
    return worst;
}

float unit_magnitude(std::uint64_t) {
    return 1.0f;
}

// Bias correction over 1000 steps: the kernel's trajectory stays on the double-precision one.
TEST_P(OptimizerIsaTest, BiasCorrectionTracksReferenceOver1000Steps) {
    const auto kernel = make_kernel(GetParam(), 2);
    for (const OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kAdam}) {
        SCOPED_TRACE(optimizer_kind_name(kind));
        OptimizerParams params = default_params(kind, 1);
        params.grad_scale = 1.0;
        const double worst = expect_tracks_reference(kernel, params, 1000, unit_magnitude);
        RecordProperty(str_cat("worst_relative_error_", optimizer_kind_name(kind)),
                       std::to_string(worst));
    }
}

// Gradients ten times smaller after step 100, with beta2 = 0.99: exp_avg_sq shrinks for a
// hundred steps while AMSGrad's maximum holds, so the maximum, not exp_avg_sq, sets the step.
TEST_P(OptimizerIsaTest, AmsgradTracksReferenceOver300StepsOfShrinkingGradients) {
    const auto kernel = make_kernel(GetParam(), 2);
    for (const OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kAdam}) {
        for (const bool bias_correction : {true, false}) {
            SCOPED_TRACE(str_cat(optimizer_kind_name(kind), " bias_correction ", bias_correction));
            OptimizerParams params = default_params(kind, 1);
            params.grad_scale = 1.0;
            params.beta2 = 0.99;
            params.amsgrad = true;
            params.bias_correction = bias_correction;
            expect_tracks_reference(kernel, params, 300,
                                    [](std::uint64_t step) { return step <= 100 ? 1.0f : 0.1f; });
        }
    }
}

// A step where exp_avg_sq shrinks (a gradient a hundred times smaller, beta2 = 0.5): with
// amsgrad the denominator keeps the earlier, larger second moment, so the parameter moves less
// than without it, by far more than rounding. A kernel that ignored the flag fails here.
TEST_P(OptimizerIsaTest, AmsgradKeepsTheMaximumWhereExpAvgSqShrinks) {
    const std::size_t numel = 37;  // vectors and a tail
    const auto kernel = make_kernel(GetParam(), 1);
    for (const OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
        for (const bool bias_correction : {true, false}) {
            SCOPED_TRACE(str_cat(optimizer_kind_name(kind), " bias_correction ", bias_correction));
            OptimizerParams params = default_params(kind, 1);
            params.grad_scale = 1.0;
            params.lr = 1e-2;
            params.beta2 = 0.5;
            params.bias_correction = bias_correction;
            std::vector<float> g(numel);
            for (std::size_t i = 0; i < numel; ++i)
                g[i] = (i % 2 == 0 ? 1.0f : -1.0f) * (0.5f + 0.1f * static_cast<float>(i));
            StepOutputs plain{std::vector<float>(numel, 1.0f),
                              std::vector<float>(numel, 0.0f),
                              std::vector<float>(numel, 0.0f),
                              std::vector<float>(numel, 0.0f),
                              {}};
            StepOutputs amsgrad = plain;
            // Step 1 from zero: the maximum is exp_avg_sq itself, so both runs agree bitwise.
            for (StepOutputs* run : {&plain, &amsgrad}) {
                params.amsgrad = run == &amsgrad;
                ASSERT_TRUE(kernel.step(params, state_of(*run, params), GradView::fp32(g)).is_ok());
            }
            EXPECT_EQ(plain.params, amsgrad.params);
            EXPECT_EQ(amsgrad.max_exp_avg_sq, amsgrad.exp_avg_sq);
            EXPECT_EQ(plain.max_exp_avg_sq, std::vector<float>(numel, 0.0f)) << "touched";
            const StepOutputs before = amsgrad;
            // Step 2: the gradient shrinks, and so does exp_avg_sq.
            params.step = 2;
            for (float& x : g) x *= 0.01f;
            for (StepOutputs* run : {&plain, &amsgrad}) {
                params.amsgrad = run == &amsgrad;
                ASSERT_TRUE(kernel.step(params, state_of(*run, params), GradView::fp32(g)).is_ok());
            }
            // exp_avg_sq stays the plain moving average (torch keeps both).
            EXPECT_EQ(amsgrad.exp_avg_sq, plain.exp_avg_sq);
            EXPECT_EQ(amsgrad.max_exp_avg_sq, before.exp_avg_sq) << "the maximum must hold";
            for (std::size_t i = 0; i < numel; ++i) {
                ASSERT_LT(amsgrad.exp_avg_sq[i], before.exp_avg_sq[i]) << i;
                params.amsgrad = true;
                const auto r = reference_step(params,
                                              {before.params[i], before.exp_avg[i],
                                               before.exp_avg_sq[i], before.max_exp_avg_sq[i]},
                                              g[i]);
                EXPECT_TRUE(
                    matches(amsgrad.params[i], r.params, r.params_scale, kRelativeTolerance))
                    << i << ": " << amsgrad.params[i] << " vs " << r.params;
                // Without amsgrad the denominator is sqrt(2) times smaller here: the two steps
                // are about 0.24 lr apart (0.05 lr without bias correction), thousands of ulps.
                const double moved_plain = std::fabs(plain.params[i] - before.params[i]);
                const double moved_amsgrad = std::fabs(amsgrad.params[i] - before.params[i]);
                EXPECT_GT(moved_plain - moved_amsgrad, 0.02 * params.lr)
                    << i << ": amsgrad moved " << moved_amsgrad << ", plain " << moved_plain;
            }
        }
    }
}

// torch.maximum keeps a NaN from either side, so a NaN gradient poisons max_exp_avg_sq for
// good, as it does in PyTorch (grad_stats() is there to skip such steps). Checked explicitly
// because x86's MAXPS alone would drop a NaN held in the old maximum.
TEST_P(OptimizerIsaTest, AmsgradKeepsANaNFromEitherSide) {
    const std::size_t numel = 19;
    const auto kernel = make_kernel(GetParam(), 1);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    OptimizerParams params = default_params(OptimizerKind::kAdamW, 1);
    params.amsgrad = true;
    StepOutputs run{std::vector<float>(numel, 1.0f),
                    std::vector<float>(numel, 0.0f),
                    std::vector<float>(numel, 0.0f),
                    std::vector<float>(numel, 0.0f),
                    {}};
    run.max_exp_avg_sq[0] = nan;   // old maximum NaN (in a vector)
    run.max_exp_avg_sq[17] = nan;  // ... and in the tail
    std::vector<float> g(numel, 0.5f);
    g[1] = nan;  // new exp_avg_sq NaN
    g[18] = nan;
    for (std::uint64_t step = 1; step <= 2; ++step) {
        params.step = step;
        ASSERT_TRUE(kernel.step(params, state_of(run, params), GradView::fp32(g)).is_ok());
        g[1] = g[18] = 0.5f;  // a finite gradient does not heal the maximum
        for (const std::size_t i : {0, 1, 17, 18}) {
            EXPECT_TRUE(std::isnan(run.max_exp_avg_sq[i])) << "step " << step << " element " << i;
            EXPECT_TRUE(std::isnan(run.params[i])) << "step " << step << " element " << i;
        }
        for (const std::size_t i : {2, 16}) {
            EXPECT_TRUE(std::isfinite(run.max_exp_avg_sq[i])) << i;
            EXPECT_TRUE(std::isfinite(run.params[i])) << i;
        }
    }
}

TEST_P(OptimizerIsaTest, AmsgradIsRejectedForAdagradAndLionAndChangesNothing) {
    const auto kernel = make_kernel(GetParam(), 1);
    const StepInputs in = make_inputs(33, zinf::test::seed() + 71, {false, false});
    StepOutputs run{in.params, in.exp_avg, in.exp_avg_sq, in.max_exp_avg_sq, {}};
    for (const OptimizerKind kind : {OptimizerKind::kAdagrad, OptimizerKind::kLion}) {
        OptimizerParams params = default_params(kind, 1);
        params.amsgrad = true;
        const Status status =
            kernel.step(params, state_of(run, params), in.grad_view(DType::kFloat32));
        EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << optimizer_kind_name(kind);
        EXPECT_NE(status.message().find("optimizer amsgrad"), std::string::npos)
            << status.message();
        EXPECT_EQ(validate(params).code(), StatusCode::kInvalidArgument);
    }
    EXPECT_EQ(run.params, in.params);
    EXPECT_EQ(run.exp_avg, in.exp_avg);
    EXPECT_EQ(run.exp_avg_sq, in.exp_avg_sq);
    EXPECT_EQ(run.max_exp_avg_sq, in.max_exp_avg_sq);
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
        const Status status = kernel.step(params, {p, m, v}, in.grad_view(DType::kFloat32));
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
        const bool adam = kind == OptimizerKind::kAdam || kind == OptimizerKind::kAdamW;
        for (const DType grad_dtype : kAllGradDtypes) {
            // Adam kinds: every combination of amsgrad, bias correction and torch rounding.
            for (int options = 0; options < (adam ? 8 : 1); ++options) {
                OptimizerParams params = default_params(kind, 9);
                params.amsgrad = (options & 1) != 0;
                params.bias_correction = (options & 2) == 0;
                params.torch_rounding = (options & 4) != 0;
                SCOPED_TRACE(str_cat(optimizer_kind_name(kind), " ", dtype_name(grad_dtype),
                                     " amsgrad ", params.amsgrad, " bias_correction ",
                                     params.bias_correction, " torch_rounding ",
                                     params.torch_rounding));
                const StepInputs in = make_inputs(numel, zinf::test::seed() + 53);
                const StepOutputs a =
                    run_step(avx2, params, in, grad_dtype, DType::kBFloat16, true);
                const StepOutputs b =
                    run_step(avx512, params, in, grad_dtype, DType::kBFloat16, true);
                expect_bitwise_equal(a, b, 0);
            }
        }
    }
}

// torch.optim.Adam / AdamW's CPU operations (torch 1.13), one element in fp32: what
// torch_rounding promises bit for bit on CPUs whose torch kernels fuse multiply-adds.
struct TorchElement {
    float p, m, v, v_max;
};
TorchElement torch_adam_element(const OptimizerParams& o, float p, float m, float v, float v_max,
                                float g) {
    const bool adamw = o.kind == OptimizerKind::kAdamW;
    g = g * static_cast<float>(o.grad_scale);
    if (!adamw && o.weight_decay != 0) g = std::fma(p, static_cast<float>(o.weight_decay), g);
    if (adamw) p = p * static_cast<float>(1.0 - o.lr * o.weight_decay);
    m = std::fma(g, static_cast<float>(1.0 - o.beta1), m * static_cast<float>(o.beta1));
    v = std::fma(static_cast<float>(1.0 - o.beta2) * g, g, v * static_cast<float>(o.beta2));
    const double step = static_cast<double>(o.step);
    const double bc1 = o.bias_correction ? 1.0 - std::pow(o.beta1, step) : 1.0;
    const double bc2 = o.bias_correction ? 1.0 - std::pow(o.beta2, step) : 1.0;
    float second = v;
    if (o.amsgrad) {
        v_max = std::isnan(v_max) ? v_max : (std::isnan(v) ? v : std::max(v_max, v));
        second = v_max;
    }
    const float denom =
        std::sqrt(second) / static_cast<float>(std::sqrt(bc2)) + static_cast<float>(o.eps);
    p = p + (static_cast<float>(-o.lr / bc1) * m) / denom;
    return {p, m, v, v_max};
}

TEST(OptimizerTorchRoundingTest, EqualsTorchsOperationsBitForBit) {
    std::vector<Isa> isas;
    for (const Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
        if (isa_supported(isa)) isas.push_back(isa);
    }
    if (isas.empty()) GTEST_SKIP() << "needs AVX2 or AVX-512 (torch fuses only there)";
    const std::size_t numel = kChunkNumel + 77;
    for (const Isa isa : isas) {
        const auto kernel = make_kernel(isa, 2);
        for (const OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
            for (int options = 0; options < 4; ++options) {
                OptimizerParams params = default_params(kind, 7);
                params.amsgrad = (options & 1) != 0;
                params.bias_correction = (options & 2) == 0;
                params.torch_rounding = true;
                SCOPED_TRACE(str_cat(isa_name(isa), " ", optimizer_kind_name(kind), " amsgrad ",
                                     params.amsgrad, " bias_correction ", params.bias_correction));
                const StepInputs in = make_inputs(numel, zinf::test::seed() + 61);
                const StepOutputs out =
                    run_step(kernel, params, in, DType::kFloat32, DType::kBFloat16, false);
                std::size_t mismatches = 0;
                for (std::size_t i = 0; i < numel; ++i) {
                    const TorchElement t =
                        torch_adam_element(params, in.params[i], in.exp_avg[i], in.exp_avg_sq[i],
                                           in.max_exp_avg_sq[i], in.grads_fp32[i]);
                    const bool same = std::memcmp(&t.p, &out.params[i], 4) == 0 &&
                                      std::memcmp(&t.m, &out.exp_avg[i], 4) == 0 &&
                                      std::memcmp(&t.v, &out.exp_avg_sq[i], 4) == 0;
                    if (!same && ++mismatches <= 3) {
                        ADD_FAILURE()
                            << describe(i, in, DType::kFloat32) << ": torch p " << t.p << " m "
                            << t.m << " v " << t.v << ", kernel p " << out.params[i] << " m "
                            << out.exp_avg[i] << " v " << out.exp_avg_sq[i];
                    }
                }
                EXPECT_EQ(mismatches, 0u);
                // The option changes the bits: the kernel's own order differs somewhere.
                OptimizerParams own = params;
                own.torch_rounding = false;
                const StepOutputs mine =
                    run_step(kernel, own, in, DType::kFloat32, DType::kBFloat16, false);
                EXPECT_NE(std::memcmp(mine.params.data(), out.params.data(), numel * 4), 0);
            }
        }
    }
}

TEST(OptimizerTorchRoundingTest, OnlyAdamAndAdamWHaveIt) {
    for (const OptimizerKind kind : {OptimizerKind::kAdagrad, OptimizerKind::kLion}) {
        OptimizerParams params = default_params(kind, 1);
        params.torch_rounding = true;
        const Status status = validate(params);
        EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
        EXPECT_NE(status.message().find("torch_rounding"), std::string::npos);
    }
}

}  // namespace
}  // namespace zinf::kernels
