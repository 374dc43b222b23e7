// CudaCompute against double-precision references, with the semantics of src/base/compute.h:
// every operation over awkward sizes, the dropout mask bitwise against src/base/philox.h, and
// run-to-run determinism of the reductions. Label gpu: skips itself without a GPU.
#include "src/device/cuda_compute.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "src/base/philox.h"
#include "src/device/cuda_device.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/support/test_seed.h"

namespace zinf::device {
namespace {

class CudaComputeTest : public ::testing::Test {
protected:
    void SetUp() override {
        ZINF_SKIP_WITHOUT_CUDA();
        CudaDeviceOptions options;
        options.budget_bytes = std::size_t{512} << 20;
        auto device = CudaDevice::create(options);
        ASSERT_TRUE(device.has_value()) << device.error().to_string();
        device_ = std::move(device).value();
        auto compute = CudaCompute::create(*device_);
        ASSERT_TRUE(compute.has_value()) << compute.error().to_string();
        compute_ = std::move(compute).value();
        rng_.seed(test::seed());
    }
    void TearDown() override {
        for (void* p : allocations_) device_->free(p);
        compute_.reset();
        device_.reset();
    }

    template <typename T>
    T* upload(const std::vector<T>& host) {
        T* ptr = alloc<T>(host.size());
        if (!host.empty()) {
            EXPECT_TRUE(
                device_->copy_to_device(ptr, host.data(), host.size() * sizeof(T), 0).is_ok());
            EXPECT_TRUE(device_->synchronize(0).is_ok());
        }
        return ptr;
    }
    template <typename T>
    T* alloc(std::size_t n) {
        auto p = device_->allocate(std::max<std::size_t>(n * sizeof(T), 1), "test");
        EXPECT_TRUE(p.has_value());
        allocations_.push_back(*p);
        return static_cast<T*>(*p);
    }
    template <typename T>
    std::vector<T> download(const T* ptr, std::size_t n) {
        std::vector<T> host(n);
        if (n > 0) {
            EXPECT_TRUE(device_->copy_to_host(host.data(), ptr, n * sizeof(T), 0).is_ok());
        }
        EXPECT_TRUE(device_->synchronize(0).is_ok());
        return host;
    }
    std::vector<float> randn(std::size_t n, float scale = 1.0f) {
        std::normal_distribution<float> dist(0.0f, scale);
        std::vector<float> v(n);
        for (auto& x : v) x = dist(rng_);
        return v;
    }

    std::unique_ptr<CudaDevice> device_;
    std::unique_ptr<CudaCompute> compute_;
    std::vector<void*> allocations_;
    std::mt19937_64 rng_;
};

TEST_F(CudaComputeTest, GemmAllTransposesStridedMatchesDouble) {
    const std::size_t m = 37, n = 45, k = 130, pad = 3;
    for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
        for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
            SCOPED_TRACE(testing::Message() << int(ta) << int(tb));
            const std::size_t a_rows = ta == Transpose::kNo ? m : k,
                              a_cols = ta == Transpose::kNo ? k : m;
            const std::size_t b_rows = tb == Transpose::kNo ? k : n,
                              b_cols = tb == Transpose::kNo ? n : k;
            const std::size_t lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
            const auto a = randn(a_rows * lda), b = randn(b_rows * ldb), c0 = randn(m * ldc);
            float* da = upload(a);
            float* db = upload(b);
            float* dc = upload(c0);
            ASSERT_TRUE(
                compute_->gemm(ta, tb, m, n, k, 0.5f, da, lda, db, ldb, 2.0f, dc, ldc, 0).is_ok());
            const auto c = download(dc, m * ldc);
            for (std::size_t i = 0; i < m; ++i) {
                for (std::size_t j = 0; j < n; ++j) {
                    double ref = 0, mag = 0;
                    for (std::size_t p = 0; p < k; ++p) {
                        const double av = ta == Transpose::kNo ? a[i * lda + p] : a[p * lda + i];
                        const double bv = tb == Transpose::kNo ? b[p * ldb + j] : b[j * ldb + p];
                        ref += av * bv;
                        mag += std::abs(av * bv);
                    }
                    ref = 0.5 * ref + 2.0 * c0[i * ldc + j];
                    // fp32 accumulation over k terms: k * 2^-24 relative to the sum of |terms|.
                    ASSERT_NEAR(c[i * ldc + j], ref,
                                1e-5 * (mag + std::abs(c0[i * ldc + j])) + 1e-6)
                        << i << "," << j;
                }
                // The padding columns of C are not touched.
                for (std::size_t j = n; j < ldc; ++j) ASSERT_EQ(c[i * ldc + j], c0[i * ldc + j]);
            }
        }
    }
}

TEST_F(CudaComputeTest, GemmBetaZeroIgnoresNaNAndKZeroScales) {
    const std::size_t m = 4, n = 5, k = 3;
    std::vector<float> c0(m * n, std::numeric_limits<float>::quiet_NaN());
    float* da = upload(std::vector<float>(m * k, 1.0f));
    float* db = upload(std::vector<float>(k * n, 2.0f));
    float* dc = upload(c0);
    ASSERT_TRUE(
        compute_->gemm(Transpose::kNo, Transpose::kNo, m, n, k, 1.0f, da, k, db, n, 0.0f, dc, n, 0)
            .is_ok());
    for (float v : download(dc, m * n)) ASSERT_EQ(v, 6.0f);
    ASSERT_TRUE(
        compute_->gemm(Transpose::kNo, Transpose::kNo, m, n, 0, 1.0f, da, 1, db, n, 0.5f, dc, n, 0)
            .is_ok());
    for (float v : download(dc, m * n)) ASSERT_EQ(v, 3.0f);
}

TEST_F(CudaComputeTest, BiasAddAndGrad) {
    for (std::size_t rows : {std::size_t{1}, std::size_t{15}, std::size_t{1027}}) {
        for (std::size_t cols : {std::size_t{1}, std::size_t{33}, std::size_t{300}}) {
            SCOPED_TRACE(testing::Message() << rows << "x" << cols);
            const auto y0 = randn(rows * cols), bias = randn(cols);
            float* dy = upload(y0);
            float* db = upload(bias);
            ASSERT_TRUE(compute_->bias_add(dy, db, rows, cols, 0).is_ok());
            const auto y = download(dy, rows * cols);
            for (std::size_t i = 0; i < rows * cols; ++i) ASSERT_EQ(y[i], y0[i] + bias[i % cols]);
            float* grad = alloc<float>(cols);
            ASSERT_TRUE(compute_->bias_grad(dy, rows, cols, grad, 0).is_ok());
            const auto g = download(grad, cols);
            for (std::size_t c = 0; c < cols; ++c) {
                double ref = 0;
                for (std::size_t r = 0; r < rows; ++r) ref += y[r * cols + c];
                // Summed in double, rounded once to fp32.
                ASSERT_NEAR(g[c], ref, 1e-6 * std::max(1.0, std::abs(ref))) << c;
            }
        }
    }
}

TEST_F(CudaComputeTest, ActivationsMatchDouble) {
    for (std::size_t n : test::awkward_sizes()) {
        SCOPED_TRACE(n);
        auto x = randn(n, 3.0f);
        if (n > 0) x[0] = 0.0f;  // the subgradient at 0 is 0
        const auto dy = randn(n);
        float* dx_in = upload(x);
        float* ddy = upload(dy);
        float* out = alloc<float>(n);
        ASSERT_TRUE(compute_->relu_forward(dx_in, out, n, 0).is_ok());
        auto got = download(out, n);
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], x[i] > 0 ? x[i] : 0.0f);
        ASSERT_TRUE(compute_->relu_backward(dx_in, ddy, out, n, 0).is_ok());
        got = download(out, n);
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], x[i] > 0 ? dy[i] : 0.0f);

        const double k0 = std::sqrt(2.0 / M_PI), k1 = 0.044715;
        ASSERT_TRUE(compute_->gelu_forward(dx_in, out, n, 0).is_ok());
        got = download(out, n);
        for (std::size_t i = 0; i < n; ++i) {
            const double v = x[i];
            const double ref = 0.5 * v * (1.0 + std::tanh(k0 * (v + k1 * v * v * v)));
            // A few fp32 ulps of tanhf and the polynomial, relative to |x|.
            ASSERT_NEAR(got[i], ref, 2e-6 * (1.0 + std::abs(v))) << i << " x " << v;
        }
        ASSERT_TRUE(compute_->gelu_backward(dx_in, ddy, out, n, 0).is_ok());
        got = download(out, n);
        for (std::size_t i = 0; i < n; ++i) {
            const double v = x[i];
            const double t = std::tanh(k0 * (v + k1 * v * v * v));
            const double d = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k0 * (1 + 3 * k1 * v * v);
            ASSERT_NEAR(got[i], dy[i] * d, 1e-5 * (1.0 + std::abs(v)) * std::abs(dy[i]) + 1e-7)
                << i;
        }
    }
}

TEST_F(CudaComputeTest, ScaleAndAxpyAreExactRoundings) {
    for (std::size_t n : test::awkward_sizes()) {
        SCOPED_TRACE(n);
        const auto x = randn(n), y0 = randn(n);
        float* dx = upload(x);
        float* dy = upload(y0);
        ASSERT_TRUE(compute_->axpy(0.3f, dx, dy, n, 0).is_ok());
        auto y = download(dy, n);
        for (std::size_t i = 0; i < n; ++i) {
            const float product = 0.3f * x[i];  // two roundings, as compute.h asks
            ASSERT_EQ(y[i], product + y0[i]) << i;
        }
        ASSERT_TRUE(compute_->scale(dx, n, -1.5f, 0).is_ok());
        y = download(dx, n);
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], x[i] * -1.5f);
    }
}

TEST_F(CudaComputeTest, LayerNormForwardBackwardMatchDouble) {
    for (std::size_t rows : {std::size_t{1}, std::size_t{15}, std::size_t{130}}) {
        for (std::size_t cols : {std::size_t{1}, std::size_t{7}, std::size_t{1027}}) {
            SCOPED_TRACE(testing::Message() << rows << "x" << cols);
            auto x = randn(rows * cols, 2.0f);
            for (auto& v : x) v += 5.0f;  // an offset mean: the two-pass variance must hold
            const auto gamma = randn(cols), beta = randn(cols), dy = randn(rows * cols);
            float* dx_in = upload(x);
            float* dg = upload(gamma);
            float* dbeta = upload(beta);
            float* ddy = upload(dy);
            float* y = alloc<float>(rows * cols);
            float* mean = alloc<float>(rows);
            float* rstd = alloc<float>(rows);
            const float eps = 1e-5f;
            ASSERT_TRUE(
                compute_->layer_norm_forward(dx_in, dg, dbeta, eps, rows, cols, y, mean, rstd, 0)
                    .is_ok());
            const auto got_y = download(y, rows * cols);
            const auto got_mean = download(mean, rows);
            const auto got_rstd = download(rstd, rows);
            float* dx = alloc<float>(rows * cols);
            float* dgamma = alloc<float>(cols);
            float* dbeta_out = alloc<float>(cols);
            ASSERT_TRUE(compute_
                            ->layer_norm_backward(dx_in, dg, mean, rstd, ddy, rows, cols, dx,
                                                  dgamma, dbeta_out, 0)
                            .is_ok());
            const auto got_dx = download(dx, rows * cols);
            const auto got_dgamma = download(dgamma, cols);
            const auto got_dbeta = download(dbeta_out, cols);
            std::vector<double> ref_dgamma(cols, 0.0), ref_dbeta(cols, 0.0);
            for (std::size_t r = 0; r < rows; ++r) {
                const float* xr = x.data() + r * cols;
                double mu = 0, var = 0;
                for (std::size_t c = 0; c < cols; ++c) mu += xr[c];
                mu /= static_cast<double>(cols);
                for (std::size_t c = 0; c < cols; ++c) var += (xr[c] - mu) * (xr[c] - mu);
                var /= static_cast<double>(cols);
                const double rs = 1.0 / std::sqrt(var + eps);
                ASSERT_NEAR(got_mean[r], mu, 1e-6 * std::abs(mu) + 1e-7);
                ASSERT_NEAR(got_rstd[r], rs, 1e-6 * rs);
                double mean_g = 0, mean_gx = 0;
                for (std::size_t c = 0; c < cols; ++c) {
                    const double xhat = (xr[c] - mu) * rs;
                    const double g = static_cast<double>(dy[r * cols + c]) * gamma[c];
                    mean_g += g;
                    mean_gx += g * xhat;
                    ref_dgamma[c] += dy[r * cols + c] * xhat;
                    ref_dbeta[c] += dy[r * cols + c];
                    // y's error: xhat to ~1e-6 relative (fp32 statistics), times gamma.
                    ASSERT_NEAR(got_y[r * cols + c], xhat * gamma[c] + beta[c],
                                5e-6 * (std::abs(xhat * gamma[c]) + std::abs(beta[c])) + 1e-6);
                }
                mean_g /= static_cast<double>(cols);
                mean_gx /= static_cast<double>(cols);
                for (std::size_t c = 0; c < cols; ++c) {
                    const double xhat = (xr[c] - mu) * rs;
                    const double g = static_cast<double>(dy[r * cols + c]) * gamma[c];
                    const double ref = rs * (g - mean_g - xhat * mean_gx);
                    ASSERT_NEAR(
                        got_dx[r * cols + c], ref,
                        1e-5 * rs * (std::abs(g) + std::abs(mean_g) + std::abs(xhat * mean_gx)) +
                            1e-6)
                        << r << "," << c;
                }
            }
            for (std::size_t c = 0; c < cols; ++c) {
                ASSERT_NEAR(
                    got_dgamma[c], ref_dgamma[c],
                    1e-5 * std::sqrt(static_cast<double>(rows)) + 1e-5 * std::abs(ref_dgamma[c]));
                ASSERT_NEAR(got_dbeta[c], ref_dbeta[c],
                            1e-6 * std::max(1.0, std::abs(ref_dbeta[c])) + 1e-6);
            }
            // dx may be null: only the parameter gradients.
            ASSERT_TRUE(compute_
                            ->layer_norm_backward(dx_in, dg, mean, rstd, ddy, rows, cols, nullptr,
                                                  dgamma, dbeta_out, 0)
                            .is_ok());
            EXPECT_EQ(download(dbeta_out, cols), got_dbeta);
        }
    }
}

TEST_F(CudaComputeTest, DropoutMaskIsBitwiseThePhiloxOne) {
    for (std::size_t n : test::awkward_sizes()) {
        for (float p : {0.0f, 0.1f, 0.5f}) {
            SCOPED_TRACE(testing::Message() << n << " p " << p);
            const auto x = randn(n), dy = randn(n);
            float* dx_in = upload(x);
            float* ddy = upload(dy);
            float* y = alloc<float>(n);
            auto* mask = alloc<std::uint8_t>(n);
            const std::uint64_t seed = 0x1234'5678'9abc'def0ull, step = (1ull << 33) + 5;
            ASSERT_TRUE(compute_->dropout_forward(dx_in, y, mask, n, p, seed, step, 0).is_ok());
            const auto got_y = download(y, n);
            const auto got_mask = download(mask, n);
            const std::uint32_t threshold = philox::dropout_threshold(p);
            const float keep_scale = 1.0f / (1.0f - p);
            std::size_t kept = 0;
            for (std::size_t i = 0; i < n; ++i) {
                const bool keep = philox::dropout_keep(seed, step, i, threshold);
                ASSERT_EQ(got_mask[i], keep ? 1 : 0) << i;
                ASSERT_EQ(got_y[i], keep ? x[i] * keep_scale : 0.0f) << i;
                kept += keep;
            }
            if (n > 100000) {
                EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(n), 1.0 - p, 0.005);
            }
            ASSERT_TRUE(compute_->dropout_backward(ddy, mask, y, n, p, 0).is_ok());
            const auto got_dx = download(y, n);
            for (std::size_t i = 0; i < n; ++i)
                ASSERT_EQ(got_dx[i], got_mask[i] ? dy[i] * keep_scale : 0.0f);
        }
    }
}

TEST_F(CudaComputeTest, SoftmaxCrossEntropyAndAccuracyMatchDouble) {
    for (std::size_t rows :
         {std::size_t{1}, std::size_t{15}, std::size_t{256}, std::size_t{140000}}) {
        for (std::size_t classes : {std::size_t{1}, std::size_t{10}, std::size_t{1000}}) {
            if (rows * classes > 20'000'000) continue;
            SCOPED_TRACE(testing::Message() << rows << "x" << classes);
            const auto logits = randn(rows * classes, 4.0f);
            std::vector<std::int32_t> labels(rows);
            std::uniform_int_distribution<std::int32_t> pick(
                0, static_cast<std::int32_t>(classes) - 1);
            for (auto& l : labels) l = pick(rng_);
            float* dl = upload(logits);
            std::int32_t* dlabels = upload(labels);
            float* probs = alloc<float>(rows * classes);
            float* loss = alloc<float>(1);
            ASSERT_TRUE(
                compute_->softmax_cross_entropy_forward(dl, dlabels, rows, classes, probs, loss, 0)
                    .is_ok());
            const auto got_probs = download(probs, rows * classes);
            const float got_loss = download(loss, 1)[0];
            double ref_loss = 0;
            std::uint64_t ref_correct = 0;
            for (std::size_t r = 0; r < rows; ++r) {
                const float* lr = logits.data() + r * classes;
                double mx = lr[0];
                std::size_t best = 0;
                for (std::size_t c = 1; c < classes; ++c) {
                    mx = std::max(mx, static_cast<double>(lr[c]));
                    if (lr[c] > lr[best]) best = c;
                }
                double sum = 0;
                for (std::size_t c = 0; c < classes; ++c) sum += std::exp(lr[c] - mx);
                for (std::size_t c = 0; c < classes; ++c) {
                    ASSERT_NEAR(got_probs[r * classes + c], std::exp(lr[c] - mx) / sum, 1e-6);
                }
                ref_loss += std::log(sum) + mx - lr[labels[r]];
                ref_correct += best == static_cast<std::size_t>(labels[r]);
            }
            ref_loss /= static_cast<double>(rows);
            ASSERT_NEAR(got_loss, ref_loss, 1e-5 * std::max(1.0, ref_loss));

            // The same inputs give bitwise the same loss (a fixed summation order).
            ASSERT_TRUE(
                compute_->softmax_cross_entropy_forward(dl, dlabels, rows, classes, probs, loss, 0)
                    .is_ok());
            ASSERT_EQ(download(loss, 1)[0], got_loss);

            float* dlogits = alloc<float>(rows * classes);
            ASSERT_TRUE(compute_
                            ->softmax_cross_entropy_backward(probs, dlabels, rows, classes, 2.0f,
                                                             dlogits, 0)
                            .is_ok());
            const auto got_d = download(dlogits, rows * classes);
            const float row_scale = 2.0f / static_cast<float>(rows);
            for (std::size_t i = 0; i < rows * classes; ++i) {
                const float target =
                    static_cast<std::size_t>(labels[i / classes]) == i % classes ? 1.0f : 0.0f;
                ASSERT_EQ(got_d[i], (got_probs[i] - target) * row_scale) << i;
            }

            auto* correct = alloc<std::uint64_t>(1);
            ASSERT_TRUE(
                compute_->count_correct(dl, dlabels, rows, classes, correct, false, 0).is_ok());
            ASSERT_TRUE(
                compute_->count_correct(dl, dlabels, rows, classes, correct, true, 0).is_ok());
            EXPECT_EQ(download(correct, 1)[0], 2 * ref_correct);
        }
    }
}

TEST_F(CudaComputeTest, SumSquaresCountsNonFiniteAndIsDeterministic) {
    for (std::size_t n : test::awkward_sizes()) {
        SCOPED_TRACE(n);
        const auto x = randn(n);
        float* dx = upload(x);
        auto* out = alloc<SumSquares>(1);
        ASSERT_TRUE(compute_->sum_squares(dx, n, out, false, 0).is_ok());
        const SumSquares first = download(out, 1)[0];
        double ref = 0;
        for (float v : x) ref += static_cast<double>(v) * v;
        EXPECT_NEAR(first.sum_squares, ref, 1e-12 * std::max(1.0, ref));
        EXPECT_EQ(first.nonfinite_count, 0u);
        ASSERT_TRUE(compute_->sum_squares(dx, n, out, true, 0).is_ok());
        const SumSquares twice = download(out, 1)[0];
        EXPECT_EQ(twice.sum_squares, 2 * first.sum_squares);
        ASSERT_TRUE(compute_->sum_squares(dx, n, out, false, 0).is_ok());
        EXPECT_EQ(download(out, 1)[0].sum_squares, first.sum_squares);  // bitwise, run to run
    }
    std::vector<float> bad = randn(1000);
    bad[3] = std::numeric_limits<float>::infinity();
    bad[999] = std::numeric_limits<float>::quiet_NaN();
    float* dbad = upload(bad);
    auto* out = alloc<SumSquares>(1);
    ASSERT_TRUE(compute_->sum_squares(dbad, bad.size(), out, false, 0).is_ok());
    const SumSquares got = download(out, 1)[0];
    EXPECT_EQ(got.nonfinite_count, 2u);
    EXPECT_FALSE(std::isfinite(got.sum_squares));
}

TEST_F(CudaComputeTest, CastMatchesHostRounding) {
    const std::size_t n = (std::size_t{1} << 20) + 3;
    const auto x = randn(n, 100.0f);
    float* dx = upload(x);
    auto* half = alloc<std::uint16_t>(n);
    ASSERT_TRUE(compute_->cast(dx, DType::kFloat32, half, DType::kFloat16, n, 0).is_ok());
    const auto got = download(half, n);
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], test::ref_float_to_fp16(x[i])) << i;
}

}  // namespace
}  // namespace zinf::device
