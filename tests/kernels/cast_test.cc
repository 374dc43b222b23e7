// kernels/cast.h: bf16 and fp16 conversions against independent oracles on edge values and
// around every rounding boundary, and every SIMD variant bitwise against the scalar functions.
#include "kernels/cast.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace zinf::kernels {
namespace {

constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};

std::string isa_param_name(const ::testing::TestParamInfo<Isa>& param_info) {
    return std::string(isa_name(param_info.param));
}

// bf16 oracle, written as the definition reads: keep the top 16 bits, round up when the
// dropped half is above one half, or exactly one half with an odd kept part.
std::uint16_t bf16_oracle(float value) {
    const std::uint32_t bits = float_bits(value);
    if (std::isnan(value)) return 0;  // callers check NaN separately
    const std::uint32_t kept = bits >> 16;
    const std::uint32_t dropped = bits & 0xffffu;
    const bool up = dropped > 0x8000u || (dropped == 0x8000u && (kept & 1u) != 0);
    return static_cast<std::uint16_t>(kept + (up ? 1 : 0));
}

// The value of an fp16 pattern, by the IEEE 754 formula.
double fp16_value_oracle(std::uint16_t h) {
    const int sign = (h & 0x8000) != 0 ? -1 : 1;
    const int exponent = (h >> 10) & 0x1f;
    const int mantissa = h & 0x3ff;
    if (exponent == 0x1f)
        return mantissa == 0 ? sign * std::numeric_limits<double>::infinity() : std::nan("");
    if (exponent == 0) return sign * std::ldexp(mantissa, -24);
    return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// fp16 oracle: the nearest finite fp16 value by search, ties to the even pattern; from 65520
// (halfway between the largest fp16 and the next power of two) up, infinity.
std::uint16_t fp16_oracle(float value) {
    static const std::vector<double> positives = [] {
        std::vector<double> v;
        for (std::uint32_t h = 0; h <= 0x7bff; ++h)
            v.push_back(fp16_value_oracle(static_cast<std::uint16_t>(h)));
        return v;
    }();
    const double x = std::fabs(static_cast<double>(value));
    const std::uint16_t sign = std::signbit(value) ? 0x8000 : 0;
    if (x >= 65520.0) return sign | 0x7c00;
    if (x >= 65504.0) return sign | 0x7bff;  // below the tie: the largest finite value
    const auto it = std::lower_bound(positives.begin(), positives.end(), x);
    const auto hi = static_cast<std::uint16_t>(it - positives.begin());
    if (positives[hi] == x || hi == 0) return sign | hi;
    const auto lo = static_cast<std::uint16_t>(hi - 1);
    const double d_lo = x - positives[lo];
    const double d_hi = positives[hi] - x;
    if (d_lo < d_hi) return sign | lo;
    if (d_hi < d_lo) return sign | hi;
    return sign | ((lo & 1) == 0 ? lo : hi);
}

// fp32 values around every rounding boundary of both formats: each pattern of the top bits
// with low bits just below, at and above the halfway point.
std::vector<float> boundary_values(int kept_bits) {
    const int dropped_bits = 32 - kept_bits;
    const std::uint32_t half = 1u << (dropped_bits - 1);
    const std::uint32_t lows[] = {0, 1, half - 1, half, half + 1, (1u << dropped_bits) - 1};
    std::vector<float> values;
    values.reserve((std::size_t{1} << kept_bits) * 6);
    for (std::uint32_t top = 0; top < (1u << kept_bits); ++top) {
        for (const std::uint32_t low : lows)
            values.push_back(bits_float((top << dropped_bits) | low));
    }
    return values;
}

TEST(CastTest, Bf16EdgeValues) {
    EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
    EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
    EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
    EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
    EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
    EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80)
        << "rounds up into infinity";
    EXPECT_EQ(float_to_bf16(bits_float(0x3f808000u)), 0x3f80) << "tie to even (down)";
    EXPECT_EQ(float_to_bf16(bits_float(0x3f818000u)), 0x3f82) << "tie to even (up)";
    EXPECT_EQ(float_to_bf16(bits_float(0x00000001u)), 0x0000) << "smallest denormal rounds to zero";
    EXPECT_EQ(float_to_bf16(bits_float(0x00018000u)), 0x0002)
        << "denormal tie to even, not flushed";
    EXPECT_EQ(float_to_bf16(bits_float(0x007fffffu)), 0x0080)
        << "largest denormal rounds to FLT_MIN";
    // NaNs stay NaN, keep their sign and come out quiet, even with only low payload bits set
    // (adding the rounding bias to those would carry into infinity).
    for (const std::uint32_t nan :
         {0x7f800001u, 0x7fbfffffu, 0x7fc00000u, 0xff800001u, 0xffffffffu}) {
        const std::uint16_t b = float_to_bf16(bits_float(nan));
        EXPECT_TRUE(std::isnan(bf16_to_float(b))) << std::hex << nan;
        EXPECT_EQ(b & 0x8000, (nan >> 16) & 0x8000) << std::hex << nan;
        EXPECT_NE(b & 0x0040, 0) << "quiet bit, " << std::hex << nan;
    }
}

TEST(CastTest, Bf16MatchesOracleAtEveryRoundingBoundary) {
    for (const float x : boundary_values(16)) {
        if (std::isnan(x)) continue;
        ASSERT_EQ(float_to_bf16(x), bf16_oracle(x)) << std::hex << float_bits(x);
    }
    for (std::uint32_t h = 0; h <= 0xffff; ++h) {
        ASSERT_EQ(float_bits(bf16_to_float(static_cast<std::uint16_t>(h))), h << 16);
    }
}

TEST(CastTest, Fp16EdgeValues) {
    EXPECT_EQ(float_to_fp16(0.0f), 0x0000);
    EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
    EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
    EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff) << "largest finite";
    EXPECT_EQ(float_to_fp16(65519.996f), 0x7bff) << "just below the overflow tie";
    EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00) << "the tie overflows to infinity (even)";
    EXPECT_EQ(float_to_fp16(1e10f), 0x7c00);
    EXPECT_EQ(float_to_fp16(-1e10f), 0xfc00);
    EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -14)), 0x0400) << "smallest normal";
    EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)), 0x0001) << "smallest denormal";
    EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000)
        << "half the smallest denormal: tie to even";
    EXPECT_EQ(float_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
    EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)), 0x0002)
        << "1.5 denormal units: tie to even (up)";
    EXPECT_EQ(float_to_fp16(std::ldexp(1023.5f, -24)), 0x0400)
        << "rounds up from denormal to normal";
    EXPECT_EQ(float_to_fp16(bits_float(0x00000001u)), 0x0000) << "fp32 denormal";
    EXPECT_EQ(float_to_fp16(std::numeric_limits<float>::infinity()), 0x7c00);
    EXPECT_EQ(float_to_fp16(bits_float(0x7fc00000u)), 0x7e00) << "quiet NaN";
    EXPECT_EQ(float_to_fp16(bits_float(0xff800001u)), 0xfe00) << "signalling NaN is quietened";
    EXPECT_EQ(float_to_fp16(bits_float(0x7fbfe000u)), 0x7fff) << "payload's top bits kept";
    EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));
    EXPECT_EQ(fp16_to_float(0x03ff), std::ldexp(1023.0f, -24));
    EXPECT_EQ(fp16_to_float(0xfc00), -std::numeric_limits<float>::infinity());
    EXPECT_EQ(float_bits(fp16_to_float(0x7c01)), 0x7fc02000u)
        << "signalling NaN is quietened, as F16C does";
    EXPECT_EQ(float_bits(fp16_to_float(0xfe00)), 0xffc00000u);
}

TEST(CastTest, Fp16MatchesOracleAtEveryRoundingBoundary) {
    for (const float x : boundary_values(19)) {
        if (std::isnan(x)) continue;
        ASSERT_EQ(float_to_fp16(x), fp16_oracle(x)) << std::hex << float_bits(x) << " = " << x;
    }
    for (std::uint32_t h = 0; h <= 0xffff; ++h) {
        const double expected = fp16_value_oracle(static_cast<std::uint16_t>(h));
        const float actual = fp16_to_float(static_cast<std::uint16_t>(h));
        if (std::isnan(expected)) {
            ASSERT_TRUE(std::isnan(actual)) << std::hex << h;
        } else {
            ASSERT_EQ(static_cast<double>(actual), expected) << std::hex << h;
            ASSERT_EQ(std::signbit(actual), (h & 0x8000) != 0) << std::hex << h;
            ASSERT_EQ(float_to_fp16(actual), h) << "round trip " << std::hex << h;
        }
    }
}

class CastVariantTest : public ::testing::TestWithParam<Isa> {
protected:
    void SetUp() override {
        if (!isa_supported(GetParam())) {
            GTEST_SKIP() << "this CPU lacks the " << isa_name(GetParam())
                         << " variant (detected: " << cpu_features().to_string() << ")";
        }
    }
};

// The SIMD variants (F16C's VCVTPS2PH for fp16, integer rounding for bf16) give exactly the
// scalar functions' bits, NaN payloads included, at every size (tails too).
TEST_P(CastVariantTest, MatchesScalarFunctionsBitwise) {
    for (const int kept_bits : {16, 19}) {
        const std::vector<float> src = boundary_values(kept_bits);
        for (const DType dtype : {DType::kBFloat16, DType::kFloat16}) {
            std::vector<std::uint16_t> dst(src.size());
            cast_from_fp32(GetParam(), src, dst, dtype);
            for (std::size_t i = 0; i < src.size(); ++i) {
                const std::uint16_t expected =
                    dtype == DType::kBFloat16 ? float_to_bf16(src[i]) : float_to_fp16(src[i]);
                ASSERT_EQ(dst[i], expected)
                    << dtype_name(dtype) << " of " << std::hex << float_bits(src[i]);
            }
        }
    }
    std::vector<std::uint16_t> all(65536);
    for (std::size_t h = 0; h < all.size(); ++h) all[h] = static_cast<std::uint16_t>(h);
    for (const DType dtype : {DType::kBFloat16, DType::kFloat16}) {
        std::vector<float> dst(all.size());
        cast_to_fp32(GetParam(), all, dtype, dst);
        for (std::size_t h = 0; h < all.size(); ++h) {
            const float expected =
                dtype == DType::kBFloat16 ? bf16_to_float(all[h]) : fp16_to_float(all[h]);
            ASSERT_EQ(float_bits(dst[h]), float_bits(expected))
                << dtype_name(dtype) << " " << std::hex << h;
        }
    }
}

TEST_P(CastVariantTest, TailsWriteOnlyTheirElements) {
    for (const std::size_t numel : {0, 1, 7, 15, 16, 17, 33}) {
        std::vector<float> src(numel + 1, 1.5f);
        std::vector<std::uint16_t> dst(numel + 1, 0xbeef);
        cast_from_fp32(GetParam(), std::span(src).first(numel), std::span(dst).first(numel),
                       DType::kFloat16);
        for (std::size_t i = 0; i < numel; ++i) ASSERT_EQ(dst[i], 0x3e00);
        EXPECT_EQ(dst[numel], 0xbeef) << "wrote past the end at numel " << numel;
        std::vector<float> back(numel + 1, -7.0f);
        cast_to_fp32(GetParam(), std::span<const std::uint16_t>(dst).first(numel), DType::kFloat16,
                     std::span(back).first(numel));
        for (std::size_t i = 0; i < numel; ++i) ASSERT_EQ(back[i], 1.5f);
        EXPECT_EQ(back[numel], -7.0f) << "wrote past the end at numel " << numel;
    }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, CastVariantTest, ::testing::ValuesIn(kAllIsas), isa_param_name);

}  // namespace
}  // namespace zinf::kernels
