// kernels/cpu_features.h: the ISA override (ZINF_CPU_ISA, cpu_optimizer.isa) resolves as
// documented, refuses variants the CPU lacks, and really selects the variant it names.
#include "kernels/cpu_features.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/optimizer.h"

namespace zinf::kernels {
namespace {

constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};

std::string isa_param_name(const ::testing::TestParamInfo<Isa>& param_info) {
    return std::string(isa_name(param_info.param));
}

// Sets ZINF_CPU_ISA for one scope and restores what was there.
class ScopedIsaEnv {
public:
    explicit ScopedIsaEnv(const char* value) {
        if (const char* old = std::getenv(kIsaEnvVariable)) old_ = old;
        had_old_ = std::getenv(kIsaEnvVariable) != nullptr;
        if (value != nullptr) {
            ::setenv(kIsaEnvVariable, value, 1);
        } else {
            ::unsetenv(kIsaEnvVariable);
        }
    }
    ~ScopedIsaEnv() {
        if (had_old_) {
            ::setenv(kIsaEnvVariable, old_.c_str(), 1);
        } else {
            ::unsetenv(kIsaEnvVariable);
        }
    }
    ScopedIsaEnv(const ScopedIsaEnv&) = delete;
    ScopedIsaEnv& operator=(const ScopedIsaEnv&) = delete;

private:
    std::string old_;
    bool had_old_ = false;
};

TEST(CpuFeaturesTest, DetectionIsConsistent) {
    const CpuFeatures& f = cpu_features();
    EXPECT_TRUE(isa_supported(Isa::kScalar));
    if (f.avx512f) {
        EXPECT_TRUE(f.avx) << "AVX-512 reported without AVX";
    }
    EXPECT_TRUE(isa_supported(best_isa()));
    for (const Isa isa : kAllIsas) {
        if (isa_supported(isa)) {
            EXPECT_GE(static_cast<int>(best_isa()), static_cast<int>(isa));
        }
    }
    EXPECT_FALSE(f.to_string().empty());
    std::printf("[zinf test] cpu features: %s; best variant %s\n", f.to_string().c_str(),
                std::string(isa_name(best_isa())).c_str());
}

TEST(CpuFeaturesTest, SupportNeedsEveryFeatureOfTheVariant) {
    CpuFeatures f;
    f.avx = f.avx2 = f.fma = f.f16c = true;
    EXPECT_TRUE(isa_supported(Isa::kAvx2, f));
    EXPECT_FALSE(isa_supported(Isa::kAvx512, f));
    f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = true;
    EXPECT_TRUE(isa_supported(Isa::kAvx512, f));
    f.avx512bw = false;
    EXPECT_FALSE(isa_supported(Isa::kAvx512, f));
    f.avx512bw = true;
    f.f16c = false;
    EXPECT_FALSE(isa_supported(Isa::kAvx2, f));
    EXPECT_FALSE(isa_supported(Isa::kAvx512, f));
    EXPECT_TRUE(isa_supported(Isa::kScalar, CpuFeatures{}));
}

TEST(CpuFeaturesTest, ResolvePrecedence) {
    EXPECT_EQ(resolve_isa("auto", nullptr).value(), best_isa());
    EXPECT_EQ(resolve_isa("scalar", nullptr).value(), Isa::kScalar);
    EXPECT_EQ(resolve_isa("auto", "scalar").value(), Isa::kScalar) << "the environment wins";
    EXPECT_EQ(resolve_isa(isa_name(best_isa()), "scalar").value(), Isa::kScalar)
        << "the environment wins";
    EXPECT_EQ(resolve_isa("scalar", "auto").value(), Isa::kScalar)
        << "ZINF_CPU_ISA=auto defers to the config";
    EXPECT_EQ(resolve_isa("scalar", "").value(), Isa::kScalar)
        << "an empty ZINF_CPU_ISA defers to the config";
}

TEST(CpuFeaturesTest, UnknownNamesAreInvalid) {
    const auto from_config = resolve_isa("avx3", nullptr);
    ASSERT_FALSE(from_config.has_value());
    EXPECT_EQ(from_config.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(from_config.error().message().find("cpu_optimizer.isa"), std::string::npos);
    EXPECT_NE(from_config.error().message().find("avx3"), std::string::npos);
    const auto from_env = resolve_isa("auto", "AVX2");
    ASSERT_FALSE(from_env.has_value());
    EXPECT_EQ(from_env.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(from_env.error().message().find("ZINF_CPU_ISA"), std::string::npos);
}

TEST(CpuFeaturesTest, MissingVariantIsAnErrorNotAFallback) {
    int missing = 0;
    for (const Isa isa : kAllIsas) {
        if (isa_supported(isa)) continue;
        ++missing;
        const auto from_env = resolve_isa("auto", std::string(isa_name(isa)).c_str());
        ASSERT_FALSE(from_env.has_value());
        EXPECT_EQ(from_env.error().code(), StatusCode::kNotSupported);
        EXPECT_NE(from_env.error().message().find("ZINF_CPU_ISA"), std::string::npos);
        const auto from_config = resolve_isa(isa_name(isa), nullptr);
        ASSERT_FALSE(from_config.has_value());
        EXPECT_EQ(from_config.error().code(), StatusCode::kNotSupported);
        const auto kernel = OptimizerKernel::create(isa, 1);
        ASSERT_FALSE(kernel.has_value());
        EXPECT_EQ(kernel.error().code(), StatusCode::kNotSupported);
        ScopedIsaEnv env(std::string(isa_name(isa)).c_str());
        const auto from_both = OptimizerKernel::create("auto", 0);
        ASSERT_FALSE(from_both.has_value());
        EXPECT_EQ(from_both.error().code(), StatusCode::kNotSupported);
    }
    if (missing == 0) GTEST_SKIP() << "this CPU has every variant; nothing is missing to refuse";
}

// Input whose sum of squares depends on how many lanes the variant keeps: 2^27 first, then
// ones. One lane loses every +1 against 2^54; 8 or 16 lanes keep n/8 or n/16 of them apart.
std::vector<float> lane_fingerprint_input() {
    std::vector<float> v(kChunkNumel, 1.0f);
    v[0] = 0x1p27f;
    return v;
}

double expected_fingerprint(Isa isa) {
    const double n = static_cast<double>(kChunkNumel);
    switch (isa) {
        case Isa::kScalar:
            return 0x1p54;
        case Isa::kAvx2:
            return 0x1p54 + 7.0 * (n / 8.0);
        case Isa::kAvx512:
            return 0x1p54 + 15.0 * (n / 16.0);
    }
    return 0;
}

class IsaOverrideTest : public ::testing::TestWithParam<Isa> {};

// Forces each variant through ZINF_CPU_ISA and checks, by behaviour, that it is the one that
// runs: the fingerprint differs for every variant, so a silent fallback fails here.
TEST_P(IsaOverrideTest, EnvironmentReallySelectsTheVariant) {
    const Isa isa = GetParam();
    if (!isa_supported(isa))
        GTEST_SKIP() << "this CPU lacks " << isa_name(isa)
                     << " (detected: " << cpu_features().to_string() << ")";
    ScopedIsaEnv env(std::string(isa_name(isa)).c_str());
    auto kernel = OptimizerKernel::create("auto", 1);  // "auto": the environment decides
    ASSERT_TRUE(kernel.has_value()) << kernel.status().to_string();
    EXPECT_EQ(kernel->isa(), isa);
    const std::vector<float> g = lane_fingerprint_input();
    const double sum = kernel->grad_stats(GradView::fp32(g)).sum_squares;
    EXPECT_EQ(sum, expected_fingerprint(isa)) << "ran a different variant than " << isa_name(isa);
    for (const Isa other : kAllIsas) {
        if (other != isa) {
            EXPECT_NE(sum, expected_fingerprint(other));
        }
    }
}

TEST_P(IsaOverrideTest, ConfigKeySelectsTheVariant) {
    const Isa isa = GetParam();
    if (!isa_supported(isa)) GTEST_SKIP() << "this CPU lacks " << isa_name(isa);
    ScopedIsaEnv env(nullptr);
    auto kernel = OptimizerKernel::create(isa_name(isa), 2);
    ASSERT_TRUE(kernel.has_value()) << kernel.status().to_string();
    EXPECT_EQ(kernel->isa(), isa);
    EXPECT_EQ(kernel->threads(), 2);
    const std::vector<float> g = lane_fingerprint_input();
    EXPECT_EQ(kernel->grad_stats(GradView::fp32(g)).sum_squares, expected_fingerprint(isa));
}

// The step itself: the scalar variant rounds a*b+c twice, the SIMD variants once, so on random
// data their bits differ somewhere; equal bits would mean one ran the other's code.
TEST(IsaOverrideStepTest, ScalarAndSimdStepsDifferInTheLastBits) {
    if (!isa_supported(Isa::kAvx2))
        GTEST_SKIP() << "needs AVX2 (detected: " << cpu_features().to_string() << ")";
    const std::size_t numel = 4096;
    std::vector<float> g(numel);
    for (std::size_t i = 0; i < numel; ++i) g[i] = std::sin(static_cast<float>(i)) * 0.37f;
    std::vector<std::vector<float>> results;
    for (const char* name : {"scalar", "avx2"}) {
        ScopedIsaEnv env(name);
        auto kernel = OptimizerKernel::create("auto", 0);
        ASSERT_TRUE(kernel.has_value());
        std::vector<float> p(numel, 0.5f), m(numel, 0.01f), v(numel, 0.002f);
        OptimizerParams o;
        o.step = 3;
        ASSERT_TRUE(kernel->step(o, {p, m, v}, GradView::fp32(g)).is_ok());
        results.push_back(p);
        results.back().insert(results.back().end(), m.begin(), m.end());
        results.back().insert(results.back().end(), v.begin(), v.end());
    }
    EXPECT_NE(results[0], results[1]);
}

INSTANTIATE_TEST_SUITE_P(AllIsas, IsaOverrideTest, ::testing::ValuesIn(kAllIsas), isa_param_name);

}  // namespace
}  // namespace zinf::kernels
