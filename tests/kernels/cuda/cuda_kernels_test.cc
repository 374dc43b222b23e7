// The CUDA kernels that CudaCompute does not cover (casts of every pair, flatten/unflatten, the
// Adam step, 16-bit GEMM) against the CPU kernels (bitwise: casts with NaN bits included, Adam
// with any NaN matching any NaN) or double-precision references. Label gpu: each test skips itself
// when no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cast.h"
#include "kernels/cuda/adam.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/flatten.h"
#include "kernels/cuda/gemm.h"
#include "kernels/optimizer.h"
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
                              -std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::signaling_NaN(),
                              std::bit_cast<float>(0xff812345u) /* NaN, payload */,
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
        // The CPU casts are the definition, NaN signs and payloads included.
        for (std::size_t i = 0; i < n; ++i) {
            ASSERT_EQ(got_bf16[i], kernels::float_to_bf16(host[i]))
                << i << " value " << host[i] << " bits " << std::hex
                << kernels::float_bits(host[i]);
            ASSERT_EQ(got_fp16[i], kernels::float_to_fp16(host[i]))
                << i << " value " << host[i] << " bits " << std::hex
                << kernels::float_bits(host[i]);
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
        // As the CPU casts do it, NaNs included (they come back quiet, payload kept).
        for (std::size_t i = 0; i < n; ++i) {
            const bool bf16 = dtype == DType::kBFloat16;
            const float expected =
                bf16 ? kernels::bf16_to_float(patterns[i]) : kernels::fp16_to_float(patterns[i]);
            ASSERT_EQ(kernels::float_bits(got_wide[i]), kernels::float_bits(expected)) << i;
            const std::uint16_t expected_back =
                bf16 ? kernels::float_to_bf16(expected) : kernels::float_to_fp16(expected);
            ASSERT_EQ(got_back[i], expected_back) << i;
            if (!std::isnan(expected)) {
                ASSERT_EQ(got_back[i], patterns[i]) << i;
            }
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
        ASSERT_EQ(got[i], kernels::float_to_fp16(kernels::bf16_to_float(patterns[i]))) << i;
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

// Double-precision reference of one step (PyTorch's Adam/AdamW, bias_correction and amsgrad as
// in torch.optim; `v_max` is used only with amsgrad).
void reference_adam(std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m,
                    std::vector<double>& v, std::vector<double>& v_max, const AdamStepParams& s) {
    const double b1 = s.beta1;
    const double b2 = s.beta2;
    const double bias1 = s.bias_correction ? 1.0 - std::pow(b1, static_cast<double>(s.step)) : 1.0;
    const double bias2 = s.bias_correction ? 1.0 - std::pow(b2, static_cast<double>(s.step)) : 1.0;
    for (std::size_t i = 0; i < p.size(); ++i) {
        double grad = g[i] * s.grad_scale;
        if (!s.adam_w_mode) grad += static_cast<double>(s.weight_decay) * p[i];
        m[i] = b1 * m[i] + (1.0 - b1) * grad;
        v[i] = b2 * v[i] + (1.0 - b2) * grad * grad;
        if (s.amsgrad) v_max[i] = std::max(v_max[i], v[i]);
        const double denom = std::sqrt(s.amsgrad ? v_max[i] : v[i]) / std::sqrt(bias2) + s.eps;
        if (s.adam_w_mode) p[i] *= 1.0 - static_cast<double>(s.lr) * s.weight_decay;
        p[i] -= static_cast<double>(s.lr) / bias1 * m[i] / denom;
    }
}

TEST(CudaAdamTest, MatchesDoubleReferenceOverThreeSteps) {
    ZINF_SKIP_WITHOUT_CUDA();
    std::mt19937_64 rng(test::seed());
    struct Mode {
        bool adam_w;
        bool amsgrad;
        bool bias_correction;
    };
    // Not Adam (L2) without bias correction: where the L2 term cancels the gradient, its first
    // steps are too ill-conditioned for this plain tolerance (the CPU oracle, with per-element
    // error scales, covers it; BitwiseTheCpuOptimizer ties the GPU to the CPU there).
    const Mode modes[] = {
        {true, false, true}, {false, false, true}, {true, true, true},
        {false, true, true}, {true, true, false},
    };
    for (const Mode& mode : modes) {
        const bool adam_w = mode.adam_w;
        const bool amsgrad = mode.amsgrad;
        for (std::size_t n : test::awkward_sizes()) {
            SCOPED_TRACE(testing::Message()
                         << "adam_w " << adam_w << " amsgrad " << amsgrad << " bias_correction "
                         << mode.bias_correction << " n " << n);
            std::vector<float> p = random_floats(n, rng);
            DeviceArray<float> params(p);
            DeviceArray<float> m(std::vector<float>(n, 0.0f));
            DeviceArray<float> v(std::vector<float>(n, 0.0f));
            DeviceArray<float> v_max(std::vector<float>(n, 0.0f));
            DeviceArray<std::uint16_t> copy(n);
            std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0), rv_max(n, 0.0);
            AdamStepParams s;
            s.lr = 1e-2;
            s.weight_decay = 0.1;
            s.adam_w_mode = adam_w;
            s.grad_scale = 0.5;
            s.amsgrad = amsgrad;
            s.bias_correction = mode.bias_correction;
            for (std::int64_t step = 1; step <= 3; ++step) {
                s.step = step;
                // Shrinking gradients, so that AMSGrad's maximum differs from exp_avg_sq.
                const std::vector<float> g =
                    random_floats(n, rng, 1.0f / static_cast<float>(step * step));
                DeviceArray<float> grads(g);
                ASSERT_TRUE(adam_step(params.get(), grads.get(), DType::kFloat32, m.get(), v.get(),
                                      v_max.get(), n, s, copy.get(), DType::kBFloat16, nullptr)
                                .is_ok());
                reference_adam(rp, std::vector<double>(g.begin(), g.end()), rm, rv, rv_max, s);
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
    ASSERT_TRUE(adam_step(params.get(), grads.get(), DType::kBFloat16, m.get(), v.get(), nullptr, n,
                          s, nullptr, DType::kFloat32, nullptr)
                    .is_ok());
    std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0), rv_max;
    reference_adam(rp, std::vector<double>(g.begin(), g.end()), rm, rv, rv_max, s);
    const auto got = params.download();
    for (std::size_t i = 0; i < n; ++i)
        ASSERT_NEAR(got[i], rp[i], 2e-6 + 1e-5 * std::abs(rp[i])) << i;
}

// The GPU step and the CPU optimizer's fused-multiply-add variants (kernels::OptimizerKernel,
// AVX-512 or AVX2: the ones the engine uses; the scalar variant rounds products separately and
// differs in the last bits) are bitwise the same over three steps, for every gradient dtype and
// copy, in both modes, with and without weight decay, amsgrad and bias correction, with an
// infinite and a NaN parameter and a NaN maximum, over a size that takes the grid more than one
// pass.
TEST(CudaAdamTest, BitwiseTheCpuOptimizer) {
    ZINF_SKIP_WITHOUT_CUDA();
    std::mt19937_64 rng(test::seed());
    const kernels::Isa isa = kernels::isa_supported(kernels::Isa::kAvx512) ? kernels::Isa::kAvx512
                             : kernels::isa_supported(kernels::Isa::kAvx2) ? kernels::Isa::kAvx2
                                                                           : kernels::Isa::kScalar;
    if (isa == kernels::Isa::kScalar) GTEST_SKIP() << "this CPU has no FMA variant (AVX2)";
    auto cpu = kernels::OptimizerKernel::create(isa, 1);
    ASSERT_TRUE(cpu.has_value()) << cpu.error().to_string();
    struct Case {
        DType grad;
        DType copy;  // kFloat32: no copy
        bool adam_w;
        double weight_decay;
        bool amsgrad = false;
        bool bias_correction = true;
    };
    const Case cases[] = {
        {DType::kFloat32, DType::kFloat32, true, 0.01},
        {DType::kFloat32, DType::kBFloat16, false, 0.1},
        {DType::kBFloat16, DType::kBFloat16, true, 0.0},
        {DType::kBFloat16, DType::kFloat32, false, 0.0},
        {DType::kFloat16, DType::kFloat16, false, 0.1},
        {DType::kFloat16, DType::kFloat32, true, 0.1},
        {DType::kFloat32, DType::kBFloat16, true, 0.01, true, true},
        {DType::kBFloat16, DType::kFloat32, false, 0.1, true, false},
        {DType::kFloat16, DType::kFloat16, false, 0.0, true, true},
        {DType::kFloat32, DType::kFloat32, true, 0.0, false, false},
        {DType::kBFloat16, DType::kFloat16, false, 0.1, false, false},
    };
    for (const std::size_t n : {std::size_t{1}, std::size_t{4099}, (std::size_t{3} << 21) + 5}) {
        for (const Case& c : cases) {
            SCOPED_TRACE(testing::Message()
                         << "n " << n << " grad " << dtype_name(c.grad) << " copy "
                         << dtype_name(c.copy) << " adam_w " << c.adam_w << " wd " << c.weight_decay
                         << " amsgrad " << c.amsgrad << " bias_correction " << c.bias_correction);
            std::vector<float> p = random_floats(n, rng), m(n, 0.0f), v(n, 0.0f);
            // The maximum starts about where exp_avg_sq lands after step 1 (1e-3 g^2 with
            // gradients of scale 0.25), so either side of max() is taken somewhere.
            std::vector<float> v_max = random_floats(n, rng, 0.25f * 0.0316f);
            for (float& x : v_max) x *= x;
            if (n > 2) {
                p[0] = std::numeric_limits<float>::infinity();
                p[1] = std::numeric_limits<float>::quiet_NaN();
                v_max[2] = std::numeric_limits<float>::quiet_NaN();  // kept: torch.maximum's rule
            }
            DeviceArray<float> dp(p), dm(m), dv(v), dv_max(v_max);
            DeviceArray<std::uint16_t> dcopy(c.copy == DType::kFloat32 ? 0 : n);
            std::vector<std::uint16_t> cpu_copy(c.copy == DType::kFloat32 ? 0 : n);
            for (std::int64_t step = 1; step <= 3; ++step) {
                const std::vector<float> g32 = random_floats(n, rng);
                AdamStepParams gp;
                gp.lr = 3e-3;
                gp.beta1 = 0.9;
                gp.beta2 = 0.999;
                gp.eps = 1e-8;
                gp.weight_decay = c.weight_decay;
                gp.adam_w_mode = c.adam_w;
                gp.step = step;
                gp.grad_scale = 0.25;
                gp.amsgrad = c.amsgrad;
                gp.bias_correction = c.bias_correction;
                kernels::OptimizerParams op;
                op.kind = c.adam_w ? kernels::OptimizerKind::kAdamW : kernels::OptimizerKind::kAdam;
                op.step = static_cast<std::uint64_t>(step);
                op.lr = gp.lr;
                op.beta1 = gp.beta1;
                op.beta2 = gp.beta2;
                op.eps = gp.eps;
                op.weight_decay = gp.weight_decay;
                op.grad_scale = gp.grad_scale;
                op.amsgrad = gp.amsgrad;
                op.bias_correction = gp.bias_correction;
                const kernels::OptimizerState state{p, m, v, v_max};
                const kernels::ParamCopy copy =
                    c.copy == DType::kBFloat16  ? kernels::ParamCopy::bf16(cpu_copy)
                    : c.copy == DType::kFloat16 ? kernels::ParamCopy::fp16(cpu_copy)
                                                : kernels::ParamCopy::none();
                if (c.grad == DType::kFloat32) {
                    DeviceArray<float> dg(g32);
                    ASSERT_TRUE(adam_step(dp.get(), dg.get(), c.grad, dm.get(), dv.get(),
                                          dv_max.get(), n, gp,
                                          c.copy == DType::kFloat32 ? nullptr : dcopy.get(), c.copy,
                                          nullptr)
                                    .is_ok());
                    ASSERT_TRUE(cpu->step(op, state, kernels::GradView::fp32(g32), copy).is_ok());
                } else {
                    std::vector<std::uint16_t> g16(n);
                    for (std::size_t i = 0; i < n; ++i) {
                        g16[i] = c.grad == DType::kBFloat16 ? kernels::float_to_bf16(g32[i])
                                                            : kernels::float_to_fp16(g32[i]);
                    }
                    DeviceArray<std::uint16_t> dg(g16);
                    ASSERT_TRUE(adam_step(dp.get(), dg.get(), c.grad, dm.get(), dv.get(),
                                          dv_max.get(), n, gp,
                                          c.copy == DType::kFloat32 ? nullptr : dcopy.get(), c.copy,
                                          nullptr)
                                    .is_ok());
                    const kernels::GradView view = c.grad == DType::kBFloat16
                                                       ? kernels::GradView::bf16(g16)
                                                       : kernels::GradView::fp16(g16);
                    ASSERT_TRUE(cpu->step(op, state, view, copy).is_ok());
                }
            }
            // Bitwise, except that a NaN matches any NaN: the GPU makes and propagates one
            // canonical NaN where x86 keeps the operand's (p[1], and p[0] under L2: inf / inf).
            auto expect_same = [&](const std::vector<float>& gpu, const std::vector<float>& ref,
                                   const char* what) {
                for (std::size_t i = 0; i < n; ++i) {
                    if (std::isnan(gpu[i]) && std::isnan(ref[i])) continue;
                    ASSERT_EQ(kernels::float_bits(gpu[i]), kernels::float_bits(ref[i]))
                        << what << " differ first at " << i << ": gpu " << gpu[i] << ", cpu "
                        << ref[i];
                }
            };
            const auto gpu_p = dp.download(), gpu_m = dm.download(), gpu_v = dv.download();
            expect_same(gpu_p, p, "params");
            expect_same(gpu_m, m, "exp_avg");
            expect_same(gpu_v, v, "exp_avg_sq");
            expect_same(dv_max.download(), v_max, "max_exp_avg_sq");  // untouched without amsgrad
            if (c.copy != DType::kFloat32) {
                const auto gpu_copy = dcopy.download();
                std::vector<float> gw(n), cw(n);
                for (std::size_t i = 0; i < n; ++i) {
                    const bool bf16 = c.copy == DType::kBFloat16;
                    gw[i] = bf16 ? kernels::bf16_to_float(gpu_copy[i])
                                 : kernels::fp16_to_float(gpu_copy[i]);
                    cw[i] = bf16 ? kernels::bf16_to_float(cpu_copy[i])
                                 : kernels::fp16_to_float(cpu_copy[i]);
                }
                expect_same(gw, cw, "16-bit copy");
            }
            if (n > 2 && c.adam_w) {
                // An infinite parameter stays infinite and leaves its moments finite.
                EXPECT_TRUE(std::isinf(gpu_p[0]));
                EXPECT_TRUE(std::isfinite(gpu_m[0]) && std::isfinite(gpu_v[0]));
            }
        }
    }
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
