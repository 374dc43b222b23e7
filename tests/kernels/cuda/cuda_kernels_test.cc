// The CUDA kernels that CudaCompute does not cover (casts of every pair, flatten/unflatten, the
// Adam step, 16-bit GEMM) against double-precision or exact host references. Label gpu: each
// test skips itself when no CUDA device is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cuda/adam.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/flatten.h"
#include "kernels/cuda/gemm.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/support/test_seed.h"

namespace zinf::kernels::cuda {
namespace {

using test::DeviceArray;

std::vector<float> random_floats(std::size_t n, std::mt19937_64& rng, float scale = 1.0f) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

// Finite values of every magnitude, ties, overflow candidates and the specials.
std::vector<float> cast_inputs(std::size_t n, std::mt19937_64& rng) {
    std::vector<float> v(n);
    std::uniform_int_distribution<std::uint32_t> bits_dist;
    for (auto& x : v) {
        std::uint32_t bits = bits_dist(rng);
        std::memcpy(&x, &bits, 4);
    }
    const float specials[] = {0.0f,
                              -0.0f,
                              1.0f,
                              -1.0f,
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::max(),
                              65504.0f,
                              65520.0f,
                              1e-8f,
                              std::numeric_limits<float>::denorm_min(),
                              1.00390625f /* bf16 tie */};
    for (std::size_t i = 0; i < n && i < std::size(specials); ++i) v[i] = specials[i];
    return v;
}

TEST(CudaCastTest, Fp32ToBf16AndFp16AreBitExact) {
    ZINF_SKIP_WITHOUT_CUDA();
    std::mt19937_64 rng(test::seed());
    for (std::size_t n : test::awkward_sizes()) {
        SCOPED_TRACE(n);
        const std::vector<float> host = cast_inputs(n, rng);
        DeviceArray<float> src(host);
        DeviceArray<std::uint16_t> bf16(n);
        DeviceArray<std::uint16_t> fp16(n);
        ASSERT_TRUE(
            cast(src.get(), DType::kFloat32, bf16.get(), DType::kBFloat16, n, nullptr).is_ok());
        ASSERT_TRUE(
            cast(src.get(), DType::kFloat32, fp16.get(), DType::kFloat16, n, nullptr).is_ok());
        const auto got_bf16 = bf16.download();
        const auto got_fp16 = fp16.download();
        for (std::size_t i = 0; i < n; ++i) {
            if (std::isnan(host[i])) {
                EXPECT_TRUE(std::isnan(test::ref_bf16_to_float(got_bf16[i]))) << i;
                EXPECT_TRUE(std::isnan(test::ref_fp16_to_float(got_fp16[i]))) << i;
                continue;
            }
            ASSERT_EQ(got_bf16[i], test::ref_float_to_bf16(host[i])) << i << " value " << host[i];
            ASSERT_EQ(got_fp16[i], test::ref_float_to_fp16(host[i])) << i << " value " << host[i];
        }
    }
}

TEST(CudaCastTest, WideningIsExactAndRoundTrips) {
    ZINF_SKIP_WITHOUT_CUDA();
    // Every 16-bit pattern once: widening must be exact, and narrowing back must give it again.
    const std::size_t n = 65536;
    std::vector<std::uint16_t> patterns(n);
    for (std::size_t i = 0; i < n; ++i) patterns[i] = static_cast<std::uint16_t>(i);
    DeviceArray<std::uint16_t> src(patterns);
    DeviceArray<float> wide(n);
    DeviceArray<std::uint16_t> back(n);
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
        SCOPED_TRACE(dtype_name(dtype));
        ASSERT_TRUE(cast(src.get(), dtype, wide.get(), DType::kFloat32, n, nullptr).is_ok());
        ASSERT_TRUE(cast(wide.get(), DType::kFloat32, back.get(), dtype, n, nullptr).is_ok());
        const auto got_wide = wide.download();
        const auto got_back = back.download();
        for (std::size_t i = 0; i < n; ++i) {
            const float expected = dtype == DType::kBFloat16 ? test::ref_bf16_to_float(patterns[i])
                                                             : test::ref_fp16_to_float(patterns[i]);
            if (std::isnan(expected)) {
                EXPECT_TRUE(std::isnan(got_wide[i])) << i;
                continue;
            }
            ASSERT_EQ(std::memcmp(&got_wide[i], &expected, 4), 0) << i;
            ASSERT_EQ(got_back[i], patterns[i]) << i;
        }
    }
}

TEST(CudaCastTest, Bf16ToFp16RoundsOnce) {
    ZINF_SKIP_WITHOUT_CUDA();
    const std::size_t n = 65536;
    std::vector<std::uint16_t> patterns(n);
    for (std::size_t i = 0; i < n; ++i) patterns[i] = static_cast<std::uint16_t>(i);
    DeviceArray<std::uint16_t> src(patterns);
    DeviceArray<std::uint16_t> dst(n);
    ASSERT_TRUE(cast(src.get(), DType::kBFloat16, dst.get(), DType::kFloat16, n, nullptr).is_ok());
    const auto got = dst.download();
    for (std::size_t i = 0; i < n; ++i) {
        const float value = test::ref_bf16_to_float(patterns[i]);
        if (std::isnan(value)) continue;
        ASSERT_EQ(got[i], test::ref_float_to_fp16(value)) << i;
    }
}

TEST(CudaFlattenTest, FlattenThenUnflattenRestoresEveryTensor) {
    ZINF_SKIP_WITHOUT_CUDA();
    std::mt19937_64 rng(test::seed());
    // 40 segments (two launches of 32 and 8), awkward sizes, one empty, padding at the end.
    std::vector<std::size_t> sizes;
    for (int s = 0; s < 40; ++s)
        sizes.push_back(test::awkward_sizes()[static_cast<std::size_t>(s) % 3] +
                        static_cast<std::size_t>(s));
    sizes[5] = 0;
    sizes[17] = (std::size_t{1} << 20) + 3;
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        SCOPED_TRACE(dtype_name(dtype));
        const std::size_t elem = dtype_size_bytes(dtype);
        std::vector<std::unique_ptr<DeviceArray<std::uint8_t>>> tensors;
        std::vector<std::vector<std::uint8_t>> host;
        std::vector<FlatSegment> segments;
        std::size_t offset = 0;
        for (std::size_t size : sizes) {
            std::vector<std::uint8_t> bytes(size * elem);
            for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
            tensors.push_back(std::make_unique<DeviceArray<std::uint8_t>>(bytes));
            host.push_back(bytes);
            segments.push_back({tensors.back()->get(), offset, size});
            offset += size;
        }
        const std::size_t flat_numel = offset + 7;  // padding no segment covers
        DeviceArray<std::uint8_t> flat(std::vector<std::uint8_t>(flat_numel * elem, 0xAB));
        ASSERT_TRUE(flatten(segments, flat.get(), flat_numel, dtype, nullptr).is_ok());
        const auto flat_host = flat.download();
        for (std::size_t s = 0; s < sizes.size(); ++s) {
            ASSERT_EQ(std::memcmp(flat_host.data() + segments[s].offset_numel * elem,
                                  host[s].data(), host[s].size()),
                      0)
                << "segment " << s;
        }
        for (std::size_t i = offset * elem; i < flat_numel * elem; ++i)
            ASSERT_EQ(flat_host[i], 0xAB);
        // Clear the tensors, unflatten, compare.
        for (auto& t : tensors) {
            if (t->size() > 0) {
                ASSERT_EQ(cudaMemset(t->get(), 0, t->size()), cudaSuccess);
            }
        }
        ASSERT_TRUE(unflatten(flat.get(), flat_numel, segments, dtype, nullptr).is_ok());
        for (std::size_t s = 0; s < sizes.size(); ++s) {
            ASSERT_EQ(tensors[s]->download(), host[s]) << "segment " << s;
        }
    }
}

// Double-precision reference of one step (PyTorch's Adam/AdamW).
void reference_adam(std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m,
                    std::vector<double>& v, const AdamStepParams& s) {
    const double b1 = s.beta1;
    const double b2 = s.beta2;
    const double bias1 = 1.0 - std::pow(b1, static_cast<double>(s.step));
    const double bias2 = 1.0 - std::pow(b2, static_cast<double>(s.step));
    for (std::size_t i = 0; i < p.size(); ++i) {
        double grad = g[i] * s.grad_scale;
        if (!s.adam_w_mode) grad += static_cast<double>(s.weight_decay) * p[i];
        m[i] = b1 * m[i] + (1.0 - b1) * grad;
        v[i] = b2 * v[i] + (1.0 - b2) * grad * grad;
        const double denom = std::sqrt(v[i]) / std::sqrt(bias2) + s.eps;
        if (s.adam_w_mode) p[i] *= 1.0 - static_cast<double>(s.lr) * s.weight_decay;
        p[i] -= static_cast<double>(s.lr) / bias1 * m[i] / denom;
    }
}

TEST(CudaAdamTest, MatchesDoubleReferenceOverThreeSteps) {
    ZINF_SKIP_WITHOUT_CUDA();
    std::mt19937_64 rng(test::seed());
    for (bool adam_w : {true, false}) {
        for (std::size_t n : test::awkward_sizes()) {
            SCOPED_TRACE(testing::Message() << "adam_w " << adam_w << " n " << n);
            std::vector<float> p = random_floats(n, rng);
            DeviceArray<float> params(p);
            DeviceArray<float> m(std::vector<float>(n, 0.0f));
            DeviceArray<float> v(std::vector<float>(n, 0.0f));
            DeviceArray<std::uint16_t> copy(n);
            std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0);
            AdamStepParams s;
            s.lr = 1e-2f;
            s.weight_decay = 0.1f;
            s.adam_w_mode = adam_w;
            s.grad_scale = 0.5f;
            for (std::int64_t step = 1; step <= 3; ++step) {
                s.step = step;
                const std::vector<float> g = random_floats(n, rng);
                DeviceArray<float> grads(g);
                ASSERT_TRUE(adam_step(params.get(), grads.get(), DType::kFloat32, m.get(), v.get(),
                                      n, s, copy.get(), DType::kBFloat16, nullptr)
                                .is_ok());
                reference_adam(rp, std::vector<double>(g.begin(), g.end()), rm, rv, s);
            }
            const auto got = params.download();
            const auto got_copy = copy.download();
            // fp32 arithmetic against double over three steps: each update is at most lr-sized,
            // so an absolute 2e-6 plus a relative 1e-5 covers the rounding of p, m, v and sqrt.
            for (std::size_t i = 0; i < n; ++i) {
                ASSERT_NEAR(got[i], rp[i], 2e-6 + 1e-5 * std::abs(rp[i])) << i;
                ASSERT_EQ(got_copy[i], test::ref_float_to_bf16(got[i])) << i;
            }
        }
    }
}

TEST(CudaAdamTest, Bf16GradientsAreWidenedExactly) {
    ZINF_SKIP_WITHOUT_CUDA();
    std::mt19937_64 rng(test::seed());
    const std::size_t n = 4099;
    std::vector<float> p = random_floats(n, rng);
    std::vector<float> g = random_floats(n, rng);
    std::vector<std::uint16_t> g16(n);
    for (std::size_t i = 0; i < n; ++i) {
        g16[i] = test::ref_float_to_bf16(g[i]);
        g[i] = test::ref_bf16_to_float(g16[i]);
    }
    DeviceArray<float> params(p), m(std::vector<float>(n, 0.0f)), v(std::vector<float>(n, 0.0f));
    DeviceArray<std::uint16_t> grads(g16);
    AdamStepParams s;
    ASSERT_TRUE(adam_step(params.get(), grads.get(), DType::kBFloat16, m.get(), v.get(), n, s,
                          nullptr, DType::kFloat32, nullptr)
                    .is_ok());
    std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0);
    reference_adam(rp, std::vector<double>(g.begin(), g.end()), rm, rv, s);
    const auto got = params.download();
    for (std::size_t i = 0; i < n; ++i)
        ASSERT_NEAR(got[i], rp[i], 2e-6 + 1e-5 * std::abs(rp[i])) << i;
}

TEST(CudaGemmTest, Bf16InputsWithFp32OutputMatchReference) {
    ZINF_SKIP_WITHOUT_CUDA();
    std::mt19937_64 rng(test::seed());
    auto handle = CublasHandle::create();
    ASSERT_TRUE(handle.has_value()) << handle.error().to_string();
    const std::size_t m = 67, n = 33, k = 129;
    std::vector<float> a = random_floats(m * k, rng), b = random_floats(k * n, rng);
    std::vector<std::uint16_t> a16(a.size()), b16(b.size());
    for (std::size_t i = 0; i < a.size(); ++i) a16[i] = test::ref_float_to_bf16(a[i]);
    for (std::size_t i = 0; i < b.size(); ++i) b16[i] = test::ref_float_to_bf16(b[i]);
    DeviceArray<std::uint16_t> da(a16), db(b16);
    DeviceArray<float> dc(m * n);
    // C = A B^T with B stored n x k: the Linear forward y = x W^T.
    ASSERT_TRUE(gemm(*handle, nullptr, Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, da.get(), k,
                     db.get(), k, DType::kBFloat16, 0.0f, dc.get(), n, DType::kFloat32)
                    .is_ok());
    const auto got = dc.download();
    for (std::size_t i = 0; i < m; ++i) {
        for (std::size_t j = 0; j < n; ++j) {
            double ref = 0, mag = 0;
            for (std::size_t p = 0; p < k; ++p) {
                const double prod = static_cast<double>(test::ref_bf16_to_float(a16[i * k + p])) *
                                    test::ref_bf16_to_float(b16[j * k + p]);
                ref += prod;
                mag += std::abs(prod);
            }
            // Exact bf16 products, fp32 accumulation: error below k * 2^-24 * sum |a b|.
            ASSERT_NEAR(got[i * n + j], ref, 1e-5 * mag + 1e-6) << i << "," << j;
        }
    }
}

TEST(CudaGemmTest, RejectsMismatchedOutputType) {
    ZINF_SKIP_WITHOUT_CUDA();
    auto handle = CublasHandle::create();
    ASSERT_TRUE(handle.has_value());
    DeviceArray<std::uint16_t> x(4);
    const Status s = gemm(*handle, nullptr, Transpose::kNo, Transpose::kNo, 2, 2, 1, 1.0f, x.get(),
                          1, x.get(), 2, DType::kBFloat16, 0.0f, x.get(), 2, DType::kFloat16);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
}

TEST(CudaProbeTest, ReportsNoDeviceWithTheCudaErrorString) {
    const Status s = probe_device();
    if (s.is_ok()) GTEST_SKIP() << "a CUDA device is present; the no-device message is not shown";
    EXPECT_EQ(s.code(), StatusCode::kCuda);
    EXPECT_EQ(s.message().rfind("no CUDA device: ", 0), 0u) << s.message();
}

}  // namespace
}  // namespace zinf::kernels::cuda
