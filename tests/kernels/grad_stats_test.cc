// OptimizerKernel::grad_stats: inf/NaN detection and the sum of squares, in the documented
// summation order (so bitwise for any thread count), for every variant and gradient dtype.
#include <gtest/gtest.h>
#include <oneapi/tbb/global_control.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cast.h"
#include "kernels/optimizer.h"
#include "tests/support/test_seed.h"

namespace zinf::kernels {
namespace {

constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};

std::string isa_param_name(const ::testing::TestParamInfo<Isa>& param_info) {
    return std::string(isa_name(param_info.param));
}

// The documented order (kernels/README.md): within each chunk, element j (counted from the
// chunk's start) goes to lane j % lanes, each lane adds in element order from +0, the lanes are
// added in lane order; chunk sums are added in chunk order.
double emulated_sum(const std::vector<float>& values, int lanes) {
    double total = 0.0;
    for (std::size_t begin = 0; begin < values.size(); begin += kChunkNumel) {
        const std::size_t end = std::min(values.size(), begin + kChunkNumel);
        std::vector<double> lane(static_cast<std::size_t>(lanes), 0.0);
        for (std::size_t i = begin; i < end; ++i) {
            const double x = values[i];
            lane[(i - begin) % static_cast<std::size_t>(lanes)] += x * x;
        }
        double chunk = 0.0;
        for (const double l : lane) chunk += l;
        total += chunk;
    }
    return total;
}

class GradStatsTest : public ::testing::TestWithParam<Isa> {
protected:
    void SetUp() override {
        if (!isa_supported(GetParam())) {
            GTEST_SKIP() << "this CPU lacks the " << isa_name(GetParam())
                         << " variant (detected: " << cpu_features().to_string() << ")";
        }
    }
    OptimizerKernel kernel(int threads) const {
        return OptimizerKernel::create(GetParam(), threads).value();
    }
};

std::vector<float> random_grads(std::size_t numel, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> e(-12.0, 4.0);
    std::bernoulli_distribution negative(0.5);
    std::vector<float> v(numel);
    for (auto& x : v) {
        x = static_cast<float>(std::pow(10.0, e(rng)));
        if (negative(rng)) x = -x;
    }
    return v;
}

TEST_P(GradStatsTest, SumFollowsTheDocumentedOrderForEveryDtype) {
    const auto k = kernel(2);
    for (const std::size_t numel :
         {std::size_t{0}, std::size_t{1}, std::size_t{15}, 3 * kChunkNumel + 9}) {
        const std::vector<float> fp32 = random_grads(numel, zinf::test::seed() + numel);
        std::vector<std::uint16_t> bf16(numel), fp16(numel);
        std::vector<float> bf16_values(numel), fp16_values(numel);
        for (std::size_t i = 0; i < numel; ++i) {
            bf16[i] = float_to_bf16(fp32[i]);
            fp16[i] = float_to_fp16(fp32[i]);
            bf16_values[i] = bf16_to_float(bf16[i]);
            fp16_values[i] = fp16_to_float(fp16[i]);
        }
        const GradStats a = k.grad_stats(GradView::fp32(fp32));
        const GradStats b = k.grad_stats(GradView::bf16(bf16));
        const GradStats c = k.grad_stats(GradView::fp16(fp16));
        EXPECT_FALSE(a.has_inf_nan);
        EXPECT_FALSE(b.has_inf_nan);
        EXPECT_FALSE(c.has_inf_nan);
        EXPECT_EQ(a.sum_squares, emulated_sum(fp32, k.sum_lanes())) << numel;
        EXPECT_EQ(b.sum_squares, emulated_sum(bf16_values, k.sum_lanes())) << numel;
        EXPECT_EQ(c.sum_squares, emulated_sum(fp16_values, k.sum_lanes())) << numel;
    }
}

TEST_P(GradStatsTest, BitwiseIdenticalForThreadCounts1And2And7) {
    tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 8);
    const std::vector<float> g = random_grads(9 * kChunkNumel + 3, zinf::test::seed() + 3);
    const double one = kernel(1).grad_stats(GradView::fp32(g)).sum_squares;
    EXPECT_EQ(kernel(2).grad_stats(GradView::fp32(g)).sum_squares, one);
    EXPECT_EQ(kernel(7).grad_stats(GradView::fp32(g)).sum_squares, one);
}

TEST_P(GradStatsTest, ReportsInfAndNanAnywhere) {
    const auto k = kernel(2);
    const std::size_t numel = 2 * kChunkNumel + 5;
    const float specials[] = {std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(), bits_float(0xff800001u)};
    for (const std::size_t position : {std::size_t{0}, std::size_t{17}, kChunkNumel, numel - 1}) {
        for (const float special : specials) {
            std::vector<float> g(numel, 1.0f);
            g[position] = special;
            const GradStats s = k.grad_stats(GradView::fp32(g));
            EXPECT_TRUE(s.has_inf_nan) << position << " " << special;
            EXPECT_FALSE(std::isfinite(s.sum_squares));
            std::vector<std::uint16_t> h(numel, 0x3c00);
            h[position] = float_to_fp16(special);
            EXPECT_TRUE(k.grad_stats(GradView::fp16(h)).has_inf_nan) << position << " " << special;
            std::vector<std::uint16_t> b(numel, 0x3f80);
            b[position] = float_to_bf16(special);
            EXPECT_TRUE(k.grad_stats(GradView::bf16(b)).has_inf_nan) << position << " " << special;
        }
    }
    // The largest finite values do not overflow the double sum: no false alarm.
    std::vector<float> big(numel, std::numeric_limits<float>::max());
    const GradStats s = k.grad_stats(GradView::fp32(big));
    EXPECT_FALSE(s.has_inf_nan);
    EXPECT_TRUE(std::isfinite(s.sum_squares));
}

INSTANTIATE_TEST_SUITE_P(AllIsas, GradStatsTest, ::testing::ValuesIn(kAllIsas), isa_param_name);

}  // namespace
}  // namespace zinf::kernels
