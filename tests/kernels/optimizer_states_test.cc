// kernels/optimizer.h's step over compressed moments (StoredState, bf16 and int8) and the codes of
// kernels/state_codec.h: every variant against a double-precision oracle of the same scheme
// (within one int8 code or one bf16 ulp), bitwise equality across variants, thread counts, runs
// and splits at block boundaries, and stochastic rounding without bias.
#include <gtest/gtest.h>
#include <oneapi/tbb/global_control.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/optimizer.h"
#include "kernels/state_codec.h"
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
constexpr StateDType kCompressed[] = {StateDType::kBf16, StateDType::kInt8};

// ---- The codes on their own ----

// The grid of int8 magnitude codes in double, extended below code 1 (where codes clamp to 0):
// point c is 2^e * (1 + m / 8) for c + K = 8 * (e + 127) + m, K = 1016 - code_max, so point
// code_max is 1 and every octave holds eight points.
double oracle_grid(int c, int code_max) {
    const int biased = c + 1016 - code_max;
    const int octave = biased >= 0 ? biased / 8 : -((-biased + 7) / 8);
    return std::ldexp(1.0 + static_cast<double>(biased - 8 * octave) / 8.0, octave - 127);
}

// The value of int8 magnitude code c in double: the definition the kernels round to fp32.
double oracle_ratio(int c, int code_max) {
    return c == 0 ? 0.0 : oracle_grid(c, code_max);
}

// The grid point at or below r > 0 (r below 1.0 * 2^4).
int oracle_floor(double r, int code_max) {
    int c = code_max + 8 * (std::ilogb(r) + 1);
    while (oracle_grid(c, code_max) > r) --c;
    while (oracle_grid(c + 1, code_max) <= r) ++c;
    return c;
}

// The code nearest in value to ratio r >= 0 (ties up): the nearest grid point, clamped to
// [0, code_max].
int oracle_code(double r, int code_max) {
    if (!(r > 0.0)) return 0;
    const int low = oracle_floor(r, code_max);
    const double below = oracle_grid(low, code_max);
    const double above = oracle_grid(low + 1, code_max);
    return std::clamp(r - below >= above - r ? low + 1 : low, 0, code_max);
}

TEST(StateCodecTest, Int8CodesDecodeToTheirDoubleValuesAndEncodeBackToThemselves) {
    for (const int code_max : {kSignedCodeMax, kUnsignedCodeMax}) {
        for (int c = 1; c <= code_max; ++c) {
            const double exact = oracle_ratio(c, code_max);
            const float ratio = code_ratio(c, code_max);
            EXPECT_LE(std::fabs(ratio - exact), exact * 0x1p-24) << "code " << c;
            EXPECT_EQ(encode_ratio(ratio, code_max), c) << "code " << c << " of " << code_max;
        }
        EXPECT_EQ(encode_ratio(0.0f, code_max), 0);
        EXPECT_EQ(encode_ratio(1.0000001f, code_max), code_max);
    }
    EXPECT_EQ(code_ratio(kSignedCodeMax, kSignedCodeMax), 1.0f);
    EXPECT_EQ(code_ratio(1, kSignedCodeMax), 1.25f * 0x1p-16f);
    EXPECT_EQ(code_ratio(1, kUnsignedCodeMax), 1.25f * 0x1p-32f);
}

TEST(StateCodecTest, Int8EncodesTheNearestCodeOrANeighbourAtAThreshold) {
    std::mt19937_64 rng(zinf::test::seed());
    std::uniform_real_distribution<double> exponent(-40.0, 0.0);
    for (const int code_max : {kSignedCodeMax, kUnsignedCodeMax}) {
        for (int i = 0; i < 20000; ++i) {
            const auto r = static_cast<float>(std::exp2(exponent(rng)));
            const int expected = oracle_code(r, code_max);
            const int got = encode_ratio(r, code_max);
            ASSERT_LE(std::abs(got - expected), 1) << "r=" << r << " code_max=" << code_max;
            // Off by one only where r is within fp32 rounding of the threshold between them.
            if (got != expected) {
                const double mid =
                    0.5 * (oracle_ratio(got, code_max) + oracle_ratio(expected, code_max));
                EXPECT_LE(std::fabs(r - mid), mid * 0x1p-22) << "r=" << r;
            }
        }
    }
}

TEST(StateCodecTest, Int8SignedKeepsTheSignAndUnsignedDropsIt) {
    const float scale = 3.0f;
    const float inverse = int8_inverse_scale(scale);
    const std::uint8_t negative = encode_int8(-1.5f, inverse, false);
    EXPECT_LT(static_cast<std::int8_t>(negative), 0);
    EXPECT_NEAR(decode_int8(negative, scale, false), -1.5, 1.5 * 0.0625);
    EXPECT_NEAR(decode_int8(encode_int8(1.5f, inverse, true), scale, true), 1.5, 1.5 * 0.0625);
    EXPECT_EQ(decode_int8(0, scale, false), 0.0f);
    EXPECT_EQ(int8_inverse_scale(0.0f), 0.0f);
    EXPECT_EQ(encode_int8(0.0f, int8_inverse_scale(0.0f), true), 0);
}

// The step's int8 rounding: over all 2^16 random numbers the mean decoded ratio is r's, to the
// 2^-16 of a code step that the four random bits left out cost; both neighbours occur.
TEST(StateCodecTest, Int8StochasticRoundingIsUnbiasedOverEveryRandomNumber) {
    for (const int code_max : {kSignedCodeMax, kUnsignedCodeMax}) {
        for (const float r : {0.7071f, 0.5f + 0x1p-20f, 0.123456f, 0.99999994f, 3.3e-4f}) {
            double sum = 0.0;
            int codes[2] = {256, -1};
            for (std::uint32_t u = 0; u < 65536; ++u) {
                const int c = encode_ratio_stochastic(r, code_max, u);
                codes[0] = std::min(codes[0], c);
                codes[1] = std::max(codes[1], c);
                sum += c == 0 ? 0.0 : code_ratio(c, code_max);
            }
            const double step = oracle_ratio(codes[1], code_max) - oracle_ratio(codes[0], code_max);
            EXPECT_EQ(codes[1] - codes[0], 1) << "r=" << r << " code_max=" << code_max;
            EXPECT_LE(std::fabs(sum / 65536.0 - r), step * 0x1p-16 + r * 0x1p-30)
                << "r=" << r << " code_max=" << code_max;
        }
    }
}

// E[result] = x exactly: summed over all 2^16 random numbers, the decoded results are 2^16 x.
TEST(StateCodecTest, Bf16StochasticRoundingIsExactlyUnbiasedOverEveryRandomNumber) {
    for (const float x : {1.0f + 0x1p-10f, -3.14159f, 1e-3f, 0x1.234568p-140f, 12345.678f}) {
        double sum = 0.0;
        int up = 0;
        for (std::uint32_t r = 0; r < 65536; ++r) {
            const std::uint16_t h = float_to_bf16_stochastic(x, r);
            sum += bf16_to_float(h);
            up += h != static_cast<std::uint16_t>(float_bits(x) >> 16) ? 1 : 0;
        }
        EXPECT_EQ(sum, 65536.0 * static_cast<double>(x)) << "x=" << x;
        EXPECT_EQ(up, static_cast<int>(float_bits(x) & 0xffffu)) << "x=" << x;
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16_stochastic(nan, 0xffff))));
}

// ---- The step ----

OptimizerKernel make_kernel(Isa isa, int threads) {
    auto kernel = OptimizerKernel::create(isa, threads);
    EXPECT_TRUE(kernel.has_value()) << kernel.status().to_string();
    return std::move(kernel).value();
}

OptimizerParams params_for(OptimizerKind kind, bool amsgrad, std::uint64_t step) {
    OptimizerParams p;
    p.kind = kind;
    p.step = step;
    p.lr = 1e-3;
    p.beta2 = kind == OptimizerKind::kLion ? 0.99 : 0.999;
    p.weight_decay = 0.01;
    p.grad_scale = 0.5;
    p.amsgrad = amsgrad;
    return p;
}

// The fp32 input array of moment `name`.
const std::vector<float>& input_moment(const StepInputs& in, std::string_view name) {
    if (name == "exp_avg") return in.exp_avg;
    if (name == "exp_avg_sq") return in.exp_avg_sq;
    return in.max_exp_avg_sq;
}

// One compressed state: the master parameters, the moments as stored, their scales, a copy.
struct Stored {
    StateDType dtype = StateDType::kBf16;
    std::uint64_t first_index = 0;
    std::uint64_t seed = 0;
    std::size_t kept = 0;
    std::vector<float> params;
    std::vector<std::byte> moments[kMaxMoments];
    std::vector<float> scales[kMaxMoments];
    std::vector<std::uint16_t> copy;

    StoredState view(std::size_t offset = 0, std::size_t count = SIZE_MAX) {
        count = std::min(count, params.size() - offset);
        const std::size_t width = state_element_size_bytes(dtype);
        StoredState s;
        s.params = std::span(params).subspan(offset, count);
        s.dtype = dtype;
        s.first_index = first_index + offset;
        s.rounding_seed = seed;
        for (std::size_t i = 0; i < kept; ++i) {
            s.moments[i] = std::span(moments[i]).subspan(offset * width, count * width);
            if (dtype == StateDType::kInt8) {
                s.scales[i] = std::span(scales[i]).subspan(offset / kStateBlockNumel,
                                                           state_scale_count(dtype, count));
            }
        }
        return s;
    }
    bool operator==(const Stored& o) const {
        for (std::size_t i = 0; i < kMaxMoments; ++i) {
            if (moments[i] != o.moments[i]) return false;
            // Bitwise (NaN scales too); memcmp is not given the null data of an empty vector.
            if (scales[i].size() != o.scales[i].size()) return false;
            if (!scales[i].empty() &&
                std::memcmp(scales[i].data(), o.scales[i].data(), scales[i].size() * 4) != 0)
                return false;
        }
        return std::memcmp(params.data(), o.params.data(), params.size() * 4) == 0 &&
               copy == o.copy;
    }
};

// The moments of `in` encoded as `dtype` (round to nearest), as a checkpoint would load them.
Stored encode(const StepInputs& in, const OptimizerParams& p, StateDType dtype,
              std::uint64_t first_index = 0) {
    const OptimizerDescriptor& d = optimizer_descriptor(p.kind);
    Stored s;
    s.dtype = dtype;
    s.first_index = first_index;
    s.seed = 0x5eed;
    s.kept = d.kept_moment_count(p.amsgrad);
    s.params = in.params;
    s.copy.assign(in.params.size(), 0xdead);
    for (std::size_t i = 0; i < s.kept; ++i) {
        const std::vector<float>& values = input_moment(in, d.moments[i].name);
        s.moments[i].resize(values.size() * state_element_size_bytes(dtype));
        s.scales[i].resize(state_scale_count(dtype, values.size()));
        encode_moment(dtype, d.moments[i].non_negative, values, s.moments[i], s.scales[i]);
    }
    return s;
}

std::vector<float> decoded(const Stored& s, const OptimizerParams& p, std::size_t i) {
    std::vector<float> values(s.params.size());
    decode_moment(s.dtype, optimizer_descriptor(p.kind).moments[i].non_negative, s.moments[i],
                  s.scales[i], values);
    return values;
}

void run(const OptimizerKernel& kernel, const OptimizerParams& p, Stored& s, GradView grads) {
    const Status status = kernel.step(p, s.view(), grads, ParamCopy::bf16(s.copy));
    ASSERT_TRUE(status.is_ok()) << status.to_string();
}

// The inputs of the compressed tests: awkward magnitudes and zeros, no inf or NaN (a non-finite
// value turns its int8 block non-finite, by design).
// Gradients stay below fp16's largest value, so that every gradient dtype is finite.
StepInputs finite_inputs(std::size_t numel, std::uint64_t seed) {
    StepInputs in = make_inputs(numel, seed, test::InputMix{true, false});
    for (std::size_t i = 0; i < numel; ++i) {
        float& g = in.grads_fp32[i];
        if (std::fabs(g) > 60000.0f) g = std::copysign(60000.0f, g);
        in.grads_bf16[i] = float_to_bf16(g);
        in.grads_fp16[i] = float_to_fp16(g);
    }
    return in;
}

// One fp32 bf16 ulp at the magnitude of y (the denormal spacing below 2^-126).
double bf16_ulp(double y) {
    if (y == 0.0) return 0x1p-133;
    return std::ldexp(1.0, std::max(std::ilogb(y), -126) - 7);
}

struct OracleMoment {
    std::vector<double> value, scale;  // new value and its error scale, per element
};

// The oracle's new moments and the kernel's params checked, from `before`'s decoded state.
std::vector<OracleMoment> check_params_and_step_oracle(const OptimizerParams& p,
                                                       const Stored& before, const Stored& after,
                                                       const StepInputs& in, DType grad_dtype) {
    const OptimizerDescriptor& d = optimizer_descriptor(p.kind);
    std::vector<std::vector<float>> old_moments;
    for (std::size_t i = 0; i < before.kept; ++i) old_moments.push_back(decoded(before, p, i));
    std::vector<OracleMoment> out(before.kept);
    int failures = 0;
    for (std::size_t e = 0; e < before.params.size(); ++e) {
        test::ReferenceState st{before.params[e], 0, 0, 0};
        for (std::size_t i = 0; i < before.kept; ++i) {
            const std::string_view name = d.moments[i].name;
            (name == "exp_avg"      ? st.exp_avg
             : name == "exp_avg_sq" ? st.exp_avg_sq
                                    : st.max_exp_avg_sq) = old_moments[i][e];
        }
        const auto r = reference_step(p, st, in.grad_value(grad_dtype, e));
        if (failures < 5 &&
            !matches(after.params[e], r.params, r.params_scale, kRelativeTolerance)) {
            ++failures;
            ADD_FAILURE() << "element " << e << ": params " << after.params[e] << " vs "
                          << r.params;
        }
        for (std::size_t i = 0; i < before.kept; ++i) {
            const std::string_view name = d.moments[i].name;
            const bool m = name == "exp_avg", v = name == "exp_avg_sq";
            out[i].value.push_back(m ? r.exp_avg : v ? r.exp_avg_sq : r.max_exp_avg_sq);
            out[i].scale.push_back(m   ? r.exp_avg_scale
                                   : v ? r.exp_avg_sq_scale
                                       : r.max_exp_avg_sq_scale);
        }
    }
    return out;
}

// The stochastic code of ratio r >= 0 in double (encode_ratio_stochastic's scheme): between the
// grid points below and above r, the upper where r - below >= (above - below) * (1 - u) (the
// random bits added to the dropped ones carry), clamped to [0, code_max].
int oracle_stochastic_code(double r, int code_max, double u) {
    if (!(r < 1.0)) return code_max;
    if (!(r > 0.0)) return 0;
    const int low = oracle_floor(r, code_max);
    const double below = oracle_grid(low, code_max);
    const double above = oracle_grid(low + 1, code_max);
    return std::clamp(r - below >= (above - below) * (1.0 - u) ? low + 1 : low, 0, code_max);
}

// The signed stochastic code of `value` at block scale `scale` with u.
int oracle_signed_stochastic_code(double value, double scale, bool non_negative, double u) {
    const int code_max = non_negative ? kUnsignedCodeMax : kSignedCodeMax;
    const int c = scale > 0.0 ? oracle_stochastic_code(std::fabs(value) / scale, code_max, u) : 0;
    return value < 0.0 && !non_negative ? -c : c;
}

// Moment i's u of element e: its 16 bits of the element's rounding word, over 2^16.
double oracle_unit_random(const Stored& s, const OptimizerParams& p, std::size_t i, std::size_t e) {
    const std::uint64_t key = rounding_key(s.seed, static_cast<int>(i / 2), p.step);
    const std::uint32_t word = rounding_word(key, s.first_index + e) >> (16 * (i % 2));
    return static_cast<double>(word & 0xffffu) * 0x1p-16;
}

void expect_int8_moment_matches(const Stored& after, const OptimizerParams& p, std::size_t i,
                                bool non_negative, const OracleMoment& o) {
    int failures = 0;
    for (std::size_t b = 0; b * kStateBlockNumel < o.value.size(); ++b) {
        const std::size_t begin = b * kStateBlockNumel;
        const std::size_t end = std::min(o.value.size(), begin + kStateBlockNumel);
        double scale = 0.0, tolerance = 0.0;
        for (std::size_t e = begin; e < end; ++e) {
            scale = std::max(scale, std::fabs(o.value[e]));
            tolerance = std::max(tolerance, kRelativeTolerance * o.scale[e]);
        }
        EXPECT_LE(std::fabs(after.scales[i][b] - scale), tolerance)
            << "moment " << i << " block " << b;
        if (static_cast<float>(scale) == 0.0f) {
            // The whole block is below fp32's smallest value (a gradient near 1e-40 squared): the
            // step's fp32 arithmetic holds zeros there, as an fp32 state would, and so must the
            // codes (the double oracle's value has no fp32 counterpart to round).
            EXPECT_EQ(after.scales[i][b], 0.0f) << "moment " << i << " block " << b;
            for (std::size_t e = begin; e < end; ++e) {
                EXPECT_EQ(static_cast<int>(after.moments[i][e]), 0)
                    << "moment " << i << " element " << e;
            }
            continue;
        }
        for (std::size_t e = begin; e < end && failures < 5; ++e) {
            const auto code = static_cast<std::uint8_t>(after.moments[i][e]);
            const int got = non_negative ? code : static_cast<std::int8_t>(code);
            // The codes of value -+ t bound those the fp32 step may reach (the code is monotone
            // in the value for a given u), and one more either way for the scale's own tolerance.
            const double t = kRelativeTolerance * o.scale[e];
            const double u = oracle_unit_random(after, p, i, e);
            const int lo =
                oracle_signed_stochastic_code(o.value[e] - t, scale, non_negative, u) - 1;
            const int hi =
                oracle_signed_stochastic_code(o.value[e] + t, scale, non_negative, u) + 1;
            if (got < lo || got > hi) {
                ++failures;
                ADD_FAILURE() << "moment " << i << " element " << e << ": code " << got
                              << ", oracle "
                              << oracle_signed_stochastic_code(o.value[e], scale, non_negative, u)
                              << " (value " << o.value[e] << ", u " << u << ", scale " << scale
                              << ")";
            }
        }
    }
}

void expect_bf16_moment_matches(const Stored& after, const OptimizerParams& p, std::size_t i,
                                const OracleMoment& o) {
    const std::vector<float> got = decoded(after, p, i);
    int failures = 0;
    for (std::size_t e = 0; e < got.size() && failures < 5; ++e) {
        const double allowed = kRelativeTolerance * o.scale[e] +
                               bf16_ulp(std::max(std::fabs(o.value[e]), std::fabs(double{got[e]})));
        if (std::fabs(got[e] - o.value[e]) > allowed) {
            ++failures;
            ADD_FAILURE() << "moment " << i << " element " << e << ": " << got[e] << " vs "
                          << o.value[e];
        }
    }
}

void expect_matches_oracle(const OptimizerParams& p, const Stored& before, const Stored& after,
                           const StepInputs& in, DType grad_dtype) {
    const OptimizerDescriptor& d = optimizer_descriptor(p.kind);
    const auto oracle = check_params_and_step_oracle(p, before, after, in, grad_dtype);
    for (std::size_t i = 0; i < before.kept; ++i) {
        SCOPED_TRACE(str_cat("moment ", d.moments[i].name));
        if (before.dtype == StateDType::kInt8) {
            expect_int8_moment_matches(after, p, i, d.moments[i].non_negative, oracle[i]);
        } else {
            expect_bf16_moment_matches(after, p, i, oracle[i]);
        }
    }
    for (std::size_t e = 0; e < after.params.size(); ++e) {
        ASSERT_EQ(after.copy[e], float_to_bf16(after.params[e])) << "copy of element " << e;
    }
}

class CompressedStepTest : public ::testing::TestWithParam<std::tuple<Isa, StateDType>> {
protected:
    void SetUp() override {
        isa_ = std::get<0>(GetParam());
        dtype_ = std::get<1>(GetParam());
        if (!isa_supported(isa_)) {
            GTEST_SKIP() << "this CPU lacks the " << isa_name(isa_)
                         << " variant (detected: " << cpu_features().to_string() << ")";
        }
    }
    Isa isa_ = Isa::kScalar;
    StateDType dtype_ = StateDType::kBf16;
};

struct KindCase {
    OptimizerKind kind;
    bool amsgrad;
};
constexpr KindCase kKindCases[] = {{OptimizerKind::kAdam, false},    {OptimizerKind::kAdamW, false},
                                   {OptimizerKind::kAdamW, true},    {OptimizerKind::kAdam, true},
                                   {OptimizerKind::kAdagrad, false}, {OptimizerKind::kLion, false}};

TEST_P(CompressedStepTest, MatchesTheOracleWithinOneCodeOrUlpOverTwoSteps) {
    const auto kernel = make_kernel(isa_, 2);
    const std::uint64_t seed = zinf::test::seed();
    for (const KindCase& k : kKindCases) {
        for (const DType grad_dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
            for (const std::size_t numel :
                 {std::size_t{1}, std::size_t{17}, kStateBlockNumel + 3, kChunkNumel + 2053}) {
                SCOPED_TRACE(str_cat(optimizer_kind_name(k.kind), k.amsgrad ? " amsgrad" : "",
                                     " grads ", dtype_name(grad_dtype), " numel ", numel, " seed ",
                                     seed));
                const StepInputs in = finite_inputs(numel, seed + numel);
                Stored state = encode(in, params_for(k.kind, k.amsgrad, 1), dtype_, 2048 * 5);
                for (std::uint64_t step = 1; step <= 2; ++step) {
                    const OptimizerParams p = params_for(k.kind, k.amsgrad, step);
                    const Stored before = state;
                    run(kernel, p, state, in.grad_view(grad_dtype));
                    expect_matches_oracle(p, before, state, in, grad_dtype);
                    if (HasFailure()) return;
                }
            }
        }
    }
}

TEST_P(CompressedStepTest, BitwiseIdenticalForThreadCounts1And2And7AndRunToRun) {
    tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 8);
    const StepInputs in =
        finite_inputs(7 * kChunkNumel + 3 * kStateBlockNumel + 5, zinf::test::seed());
    const OptimizerParams p = params_for(OptimizerKind::kAdamW, true, 3);
    const Stored start = encode(in, p, dtype_);
    std::vector<Stored> results;
    for (const int threads : {1, 2, 7, 7}) {
        Stored s = start;
        run(make_kernel(isa_, threads), p, s, in.grad_view(DType::kBFloat16));
        results.push_back(std::move(s));
    }
    EXPECT_FALSE(results[0] == start) << "the step changed nothing";
    EXPECT_TRUE(results[0] == results[1]) << "1 vs 2 threads";
    EXPECT_TRUE(results[0] == results[2]) << "1 vs 7 threads";
    EXPECT_TRUE(results[2] == results[3]) << "7 threads, run to run";
}

// N ranks (or sub-groups) cut at block boundaries give one rank's bits.
TEST_P(CompressedStepTest, SplitsAtBlockBoundariesGiveTheWholeSpansBits) {
    const StepInputs in = finite_inputs(3 * kChunkNumel + 77, zinf::test::seed());
    const OptimizerParams p = params_for(OptimizerKind::kAdam, false, 7);
    const auto kernel = make_kernel(isa_, 2);
    Stored whole = encode(in, p, dtype_, 64 * kStateBlockNumel);
    Stored parts = whole;
    run(kernel, p, whole, in.grad_view(DType::kFloat32));
    const std::size_t cuts[] = {0, kStateBlockNumel, 9 * kStateBlockNumel, in.params.size()};
    for (std::size_t c = 0; c + 1 < std::size(cuts); ++c) {
        const std::size_t count = cuts[c + 1] - cuts[c];
        GradView g = in.grad_view(DType::kFloat32);
        g.data = in.grads_fp32.data() + cuts[c];
        g.numel = count;
        const Status status =
            kernel.step(p, parts.view(cuts[c], count), g,
                        ParamCopy::bf16(std::span(parts.copy).subspan(cuts[c], count)));
        ASSERT_TRUE(status.is_ok()) << status.to_string();
    }
    EXPECT_TRUE(whole == parts);
}

TEST_P(CompressedStepTest, RoundingDependsOnSeedAndIndex) {
    const StepInputs in = finite_inputs(kChunkNumel, zinf::test::seed());
    const OptimizerParams p = params_for(OptimizerKind::kAdamW, false, 5);
    const auto kernel = make_kernel(isa_, 1);
    Stored a = encode(in, p, dtype_);
    Stored b = a;
    b.seed ^= 1;
    Stored c = a;
    c.first_index += kStateBlockNumel;
    run(kernel, p, a, in.grad_view(DType::kFloat32));
    run(kernel, p, b, in.grad_view(DType::kFloat32));
    run(kernel, p, c, in.grad_view(DType::kFloat32));
    EXPECT_FALSE(a == b) << "another rounding seed";
    EXPECT_FALSE(a == c) << "another global index";
}

INSTANTIATE_TEST_SUITE_P(AllVariants, CompressedStepTest,
                         ::testing::Combine(::testing::ValuesIn(kAllIsas),
                                            ::testing::ValuesIn(kCompressed)),
                         [](const auto& param_info) {
                             return str_cat(isa_name(std::get<0>(param_info.param)), "_",
                                            state_dtype_name(std::get<1>(param_info.param)));
                         });

// Scalar (fused), AVX2 and AVX-512 store the same bits for every kind, dtype and gradient.
TEST(CompressedCrossVariantTest, ScalarAvx2AndAvx512AgreeBitwise) {
    std::vector<Isa> isas;
    for (const Isa isa : kAllIsas) {
        if (isa_supported(isa)) isas.push_back(isa);
    }
    if (isas.size() < 2) GTEST_SKIP() << "only one variant on this CPU";
    const StepInputs in = finite_inputs(2 * kChunkNumel + 2048 + 13, zinf::test::seed());
    for (const StateDType dtype : kCompressed) {
        for (const KindCase& k : kKindCases) {
            for (const DType grad_dtype : {DType::kFloat32, DType::kFloat16}) {
                const OptimizerParams p = params_for(k.kind, k.amsgrad, 11);
                SCOPED_TRACE(str_cat(state_dtype_name(dtype), " ", optimizer_kind_name(k.kind),
                                     k.amsgrad ? " amsgrad " : " ", dtype_name(grad_dtype)));
                std::vector<Stored> results;
                for (const Isa isa : isas) {
                    Stored s = encode(in, p, dtype);
                    run(make_kernel(isa, 2), p, s, in.grad_view(grad_dtype));
                    results.push_back(std::move(s));
                }
                for (std::size_t r = 1; r < results.size(); ++r) {
                    EXPECT_TRUE(results[0] == results[r])
                        << isa_name(isas[0]) << " vs " << isa_name(isas[r]);
                }
            }
        }
    }
}

// With beta1 = beta2 = 0 the new moments are exactly g and fl(g * g), so every stored element
// is the scalar definition's rounding of them with the definition's word: rounding_word(
// rounding_key(seed, pair, step), global index), low 16 bits for exp_avg, high for exp_avg_sq.
// The span crosses global index 2^32, where the vector code's run keys change, in the middle of
// a chunk, and ends in a partial vector.
TEST(CompressedRoundingTest, EveryVariantRoundsWithTheDefinitionsWordsAcrossIndex2To32) {
    const std::size_t numel = 2 * kChunkNumel + 2048 + 13;
    const std::uint64_t first_index = (std::uint64_t{1} << 32) - kChunkNumel - 2048;
    const StepInputs in = finite_inputs(numel, zinf::test::seed());
    OptimizerParams p = params_for(OptimizerKind::kAdamW, false, 3);
    p.beta1 = 0.0;
    p.beta2 = 0.0;
    p.grad_scale = 1.0;
    const std::uint64_t keys[2] = {rounding_key(0x5eed, 0, p.step), 0};
    for (const Isa isa : kAllIsas) {
        if (!isa_supported(isa)) continue;
        for (const StateDType dtype : kCompressed) {
            SCOPED_TRACE(str_cat(isa_name(isa), " ", state_dtype_name(dtype)));
            Stored s = encode(in, p, dtype, first_index);
            ASSERT_EQ(s.seed, 0x5eedu);
            run(make_kernel(isa, 2), p, s, in.grad_view(DType::kFloat32));
            int failures = 0;
            for (std::size_t e = 0; e < numel && failures < 5; ++e) {
                const std::uint32_t word = rounding_word(keys[0], first_index + e);
                const float g = in.grads_fp32[e];
                // (The sign of a zero moment depends on the old moment's: 0 * m + -0.)
                if (g == 0.0f) continue;
                const float moments[2] = {g, g * g};
                for (std::size_t i = 0; i < 2; ++i) {
                    const std::uint32_t random16 = (word >> (16 * i)) & 0xffffu;
                    if (dtype == StateDType::kBf16) {
                        std::uint16_t got;
                        std::memcpy(&got, s.moments[i].data() + 2 * e, 2);
                        const std::uint16_t want = float_to_bf16_stochastic(moments[i], random16);
                        if (got != want) {
                            ++failures;
                            ADD_FAILURE() << "bf16 moment " << i << " element " << e << ": " << got
                                          << " vs " << want << " (" << moments[i] << ")";
                        }
                        continue;
                    }
                    const std::size_t block = e / kStateBlockNumel;
                    float scale = 0.0f;
                    for (std::size_t j = block * kStateBlockNumel;
                         j < std::min(numel, (block + 1) * kStateBlockNumel); ++j) {
                        const float g_j = in.grads_fp32[j];
                        scale = std::max(scale, std::fabs(i == 0 ? g_j : g_j * g_j));
                    }
                    ASSERT_EQ(s.scales[i][block], scale) << "moment " << i << " block " << block;
                    const auto got = static_cast<std::uint8_t>(s.moments[i][e]);
                    const std::uint8_t want = encode_int8_stochastic(
                        moments[i], int8_inverse_scale(scale), i == 1, random16);
                    if (got != want) {
                        ++failures;
                        ADD_FAILURE() << "int8 moment " << i << " element " << e << ": code "
                                      << int{got} << ", definition " << int{want};
                    }
                }
            }
        }
    }
}

// Equal bits, except that any two NaNs match (payloads may differ between std::fma and FMA).
bool same_or_both_nan(float a, float b) {
    return float_bits(a) == float_bits(b) || (std::isnan(a) && std::isnan(b));
}

bool agree_up_to_nan_payloads(const Stored& a, const Stored& b) {
    for (std::size_t e = 0; e < a.params.size(); ++e) {
        if (!same_or_both_nan(a.params[e], b.params[e])) return false;
    }
    for (std::size_t i = 0; i < a.kept; ++i) {
        if (a.dtype == StateDType::kInt8) {
            // Codes carry no payload; the scale of a NaN block is the one quiet NaN.
            if (a.moments[i] != b.moments[i]) return false;
            if (std::memcmp(a.scales[i].data(), b.scales[i].data(), a.scales[i].size() * 4) != 0)
                return false;
            continue;
        }
        for (std::size_t e = 0; e < a.params.size(); ++e) {
            std::uint16_t x, y;
            std::memcpy(&x, a.moments[i].data() + 2 * e, 2);
            std::memcpy(&y, b.moments[i].data() + 2 * e, 2);
            if (!same_or_both_nan(bf16_to_float(x), bf16_to_float(y))) return false;
        }
    }
    return true;
}

// Every int8 byte, as a signed and as an unsigned code, decodes alike in every variant (the
// vector decodes build the ratio from permuted tables and exponent bits): stored moments that
// run through all 256 bytes, under scales from tiny to huge, give the same step everywhere.
TEST(CompressedCrossVariantTest, Int8EveryCodeDecodesAlikeAcrossVariants) {
    std::vector<Isa> isas;
    for (const Isa isa : kAllIsas) {
        if (isa_supported(isa)) isas.push_back(isa);
    }
    if (isas.size() < 2) GTEST_SKIP() << "only one variant on this CPU";
    const StepInputs in = finite_inputs(4 * kStateBlockNumel, zinf::test::seed());
    const float scales[] = {1.0f, 3e-5f, 1e-30f, 2e30f};
    for (const KindCase& k :
         {KindCase{OptimizerKind::kAdamW, false}, KindCase{OptimizerKind::kAdam, true}}) {
        const OptimizerParams p = params_for(k.kind, k.amsgrad, 4);
        SCOPED_TRACE(str_cat(optimizer_kind_name(k.kind), k.amsgrad ? " amsgrad" : ""));
        Stored base = encode(in, p, StateDType::kInt8);
        for (std::size_t i = 0; i < base.kept; ++i) {
            for (std::size_t e = 0; e < base.moments[i].size(); ++e) {
                base.moments[i][e] = static_cast<std::byte>((e * (2 * i + 1)) % 256);
            }
            for (std::size_t b = 0; b < base.scales[i].size(); ++b) {
                base.scales[i][b] = scales[b % std::size(scales)];
            }
        }
        std::vector<Stored> results;
        for (const Isa isa : isas) {
            Stored s = base;
            run(make_kernel(isa, 2), p, s, in.grad_view(DType::kFloat32));
            results.push_back(std::move(s));
        }
        for (std::size_t r = 1; r < results.size(); ++r) {
            EXPECT_TRUE(agree_up_to_nan_payloads(results[0], results[r]))
                << isa_name(isas[0]) << " vs " << isa_name(isas[r]);
        }
    }
}

// Blocks of non-finite and extreme gradients (a NaN with a payload, infinities, overflowing
// squares, denormals only, zeros only, -0) take the same codes, scales and roundings in every
// variant: the vectorised codes (exponent bits, tables, integer maxima) match state_codec.h's
// scalar ones outside the finite range the oracle tests cover too.
TEST(CompressedCrossVariantTest, NonFiniteAndExtremeBlocksAgreeAcrossVariants) {
    std::vector<Isa> isas;
    for (const Isa isa : kAllIsas) {
        if (isa_supported(isa)) isas.push_back(isa);
    }
    if (isas.size() < 2) GTEST_SKIP() << "only one variant on this CPU";
    StepInputs in = finite_inputs(8 * kStateBlockNumel + 29, zinf::test::seed());
    const float inf = std::numeric_limits<float>::infinity();
    const float specials[] = {bits_float(0xffc12345u), inf, -inf, 3e38f, 1e-42f, 0.0f, -0.0f};
    for (std::size_t k = 0; k < std::size(specials); ++k) {
        const std::size_t block = k + 1;  // block 0 stays ordinary
        for (std::size_t j = 0; j < kStateBlockNumel; ++j) {
            const std::size_t e = block * kStateBlockNumel + j;
            // NaN and infinities at a few places; the others fill their block.
            const bool fill = specials[k] == 0.0f || std::fabs(specials[k]) < 1e-30f;
            if (fill || j % 97 == 5) in.grads_fp32[e] = specials[k];
            if (fill) in.exp_avg[e] = in.exp_avg_sq[e] = in.max_exp_avg_sq[e] = 0.0f;
        }
    }
    for (const StateDType dtype : kCompressed) {
        for (const KindCase& k : kKindCases) {
            const OptimizerParams p = params_for(k.kind, k.amsgrad, 3);
            SCOPED_TRACE(str_cat(state_dtype_name(dtype), " ", optimizer_kind_name(k.kind),
                                 k.amsgrad ? " amsgrad" : ""));
            std::vector<Stored> results;
            for (const Isa isa : isas) {
                Stored s = encode(in, p, dtype);
                run(make_kernel(isa, 2), p, s, in.grad_view(DType::kFloat32));
                results.push_back(std::move(s));
            }
            for (std::size_t r = 1; r < results.size(); ++r) {
                EXPECT_TRUE(agree_up_to_nan_payloads(results[0], results[r]))
                    << isa_name(isas[0]) << " vs " << isa_name(isas[r]);
            }
        }
    }
}

// 2^18 elements whose new exp_avg lies 0.3 ulp above a bf16 value: the mean of the stored
// values is that fp32 value within 4 standard errors (round to nearest would miss by 0.3 ulp),
// and a different step rounds a different set of elements up.
TEST(CompressedRoundingTest, Bf16StochasticRoundingIsUnbiasedOverManyElements) {
    constexpr std::size_t kNumel = std::size_t{1} << 18;
    const OptimizerParams p = params_for(OptimizerKind::kAdamW, false, 1);
    const float m0 = 1.0f;
    const float target = 1.0f + 0.3f * 0x1p-7f;  // 0.3 of a bf16 ulp above 1
    // m = fma(beta1, m0, (1 - beta1) * g): pick g so that m is close to target in fp32.
    const auto one_minus_beta1 = static_cast<float>(1.0 - p.beta1);
    const float g = (target - static_cast<float>(p.beta1) * m0) / one_minus_beta1 / 0.5f;
    const float m_new = std::fma(static_cast<float>(p.beta1), m0, one_minus_beta1 * (g * 0.5f));
    const double low = bf16_to_float(static_cast<std::uint16_t>(float_bits(m_new) >> 16));
    const double fraction = (m_new - low) / 0x1p-7;
    ASSERT_GT(fraction, 0.2);
    ASSERT_LT(fraction, 0.4);
    StepInputs in = finite_inputs(kNumel, 1);
    std::fill(in.exp_avg.begin(), in.exp_avg.end(), m0);
    std::fill(in.grads_fp32.begin(), in.grads_fp32.end(), g);
    std::vector<std::vector<std::byte>> first_moments;
    for (const Isa isa : kAllIsas) {
        if (!isa_supported(isa)) continue;
        for (const std::uint64_t step : {1, 2}) {
            Stored s =
                encode(in, params_for(OptimizerKind::kAdamW, false, step), StateDType::kBf16);
            run(make_kernel(isa, 2), params_for(OptimizerKind::kAdamW, false, step), s,
                in.grad_view(DType::kFloat32));
            const std::vector<float> m = decoded(s, p, 0);
            double sum = 0.0;
            for (const float x : m) sum += x;
            const double mean_error_ulps = (sum / static_cast<double>(kNumel) - m_new) / 0x1p-7;
            // One element's error has a standard deviation of at most 0.5 ulp.
            EXPECT_LE(std::fabs(mean_error_ulps),
                      4.0 * 0.5 / std::sqrt(static_cast<double>(kNumel)))
                << isa_name(isa) << " step " << step << ": mean error " << mean_error_ulps
                << " ulp";
            if (step == 1) first_moments.push_back(s.moments[0]);
            if (step == 2) {
                EXPECT_NE(s.moments[0], first_moments.back()) << "step ignored";
            }
        }
    }
}

// exp_avg_sq decaying by beta2 = 0.99 a step (zero gradients) while its block's largest element
// holds at 1: a 1 % change is below half a code (about 4.5 %), so nearest rounding would keep
// every value where it started; the dithered encode follows the exact decay on average (300
// steps: 0.99^300 = 0.049 of the start).
TEST(CompressedRoundingTest, Int8SecondMomentsDecayUnderTheDitheredEncode) {
    constexpr std::size_t kNumel = 4 * kStateBlockNumel;
    constexpr int kSteps = 300;
    constexpr float kStart = 0.0245f;
    StepInputs in = finite_inputs(kNumel, 3);
    for (std::size_t e = 0; e < kNumel; ++e) {
        const bool largest = e % kStateBlockNumel == 0;
        in.exp_avg[e] = 0.0f;
        in.exp_avg_sq[e] = largest ? 1.0f : kStart;
        in.grads_fp32[e] = largest ? 1.0f : 0.0f;
    }
    for (const Isa isa : kAllIsas) {
        if (!isa_supported(isa)) continue;
        OptimizerParams p = params_for(OptimizerKind::kAdamW, false, 1);
        p.beta2 = 0.99;
        p.grad_scale = 1.0;
        Stored s = encode(in, p, StateDType::kInt8);
        const auto kernel = make_kernel(isa, 2);
        for (int step = 1; step <= kSteps; ++step) {
            p.step = static_cast<std::uint64_t>(step);
            run(kernel, p, s, in.grad_view(DType::kFloat32));
        }
        const std::vector<float> v = decoded(s, p, 1);
        double sum = 0.0;
        for (std::size_t e = 0; e < kNumel; ++e) {
            if (e % kStateBlockNumel != 0) sum += v[e];
        }
        const double mean = sum / static_cast<double>(kNumel - kNumel / kStateBlockNumel);
        const double exact = kStart * std::pow(0.99, kSteps);
        EXPECT_NEAR(mean, exact, 0.05 * exact) << isa_name(isa);
        EXPECT_GT(v[0], 0.9f) << isa_name(isa) << ": the block's largest value";
    }
}

TEST(CompressedStepFp32Test, AnFp32StoredStateIsTheFp32StepBitForBit) {
    const StepInputs in = make_inputs(kChunkNumel + 9, zinf::test::seed());
    const OptimizerParams p = params_for(OptimizerKind::kAdamW, true, 2);
    const auto kernel = make_kernel(Isa::kScalar, 2);
    std::vector<float> params = in.params, m = in.exp_avg, v = in.exp_avg_sq,
                       vmax = in.max_exp_avg_sq;
    OptimizerState state{params,
                         {std::span<float>(m), std::span<float>(v), std::span<float>(vmax)}};
    ASSERT_TRUE(kernel.step(p, state, in.grad_view(DType::kFloat32)).is_ok());
    Stored s = encode(in, p, StateDType::kFp32);
    run(kernel, p, s, in.grad_view(DType::kFloat32));
    EXPECT_EQ(0, std::memcmp(params.data(), s.params.data(), params.size() * 4));
    EXPECT_EQ(0, std::memcmp(m.data(), s.moments[0].data(), m.size() * 4));
    EXPECT_EQ(0, std::memcmp(v.data(), s.moments[1].data(), v.size() * 4));
    EXPECT_EQ(0, std::memcmp(vmax.data(), s.moments[2].data(), vmax.size() * 4));
}

}  // namespace
}  // namespace zinf::kernels
