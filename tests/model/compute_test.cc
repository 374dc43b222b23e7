// CpuCompute against double-precision references (forward values, and backward against finite
// differences of the double forward), bitwise determinism across thread counts, the Philox
// dropout masks and the casts. Doubles as the start of the Compute conformance suite.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cast.h"
#include "src/base/philox.h"
#include "src/device/cpu_compute.h"
#include "src/device/cpu_device.h"
#include "src/device/cpu_math.h"
#include "tests/support/test_seed.h"

namespace zinf::device {
namespace {

std::unique_ptr<CpuCompute> make_compute(int threads) {
    auto compute = CpuCompute::create(nullptr, CpuComputeOptions{threads});
    ZINF_ASSERT_MSG(compute.has_value(), compute.status().to_string());
    return std::move(compute).value();
}

std::vector<float> random_vector(std::size_t n, std::uint64_t salt, float lo = -1.0f,
                                 float hi = 1.0f) {
    std::mt19937_64 rng(test::seed() ^ (salt * 0x9E3779B97F4A7C15ull));
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

template <typename T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// ---- Philox ------------------------------------------------------------------------------

// Known-answer vectors of Random123 (kat_vectors: philox4x32 with 10 rounds).
TEST(Philox, MatchesRandom123KnownAnswers) {
    const auto zero = philox::philox4x32_10({{0, 0, 0, 0}}, {{0, 0}});
    EXPECT_EQ(zero.v[0], 0x6627e8d5u);
    EXPECT_EQ(zero.v[1], 0xe169c58du);
    EXPECT_EQ(zero.v[2], 0xbc57ac4cu);
    EXPECT_EQ(zero.v[3], 0x9b00dbd8u);
    const auto ones = philox::philox4x32_10({{~0u, ~0u, ~0u, ~0u}}, {{~0u, ~0u}});
    EXPECT_EQ(ones.v[0], 0x408f276du);
    EXPECT_EQ(ones.v[1], 0x41c83b0eu);
    EXPECT_EQ(ones.v[2], 0xa20bc7c6u);
    EXPECT_EQ(ones.v[3], 0x6d5451fdu);
    const auto pi = philox::philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
                                          {{0xa4093822u, 0x299f31d0u}});
    EXPECT_EQ(pi.v[0], 0xd16cfe09u);
    EXPECT_EQ(pi.v[1], 0x94fdccebu);
    EXPECT_EQ(pi.v[2], 0x5001e420u);
    EXPECT_EQ(pi.v[3], 0x24126ea1u);
}

// ---- GEMM --------------------------------------------------------------------------------

struct GemmCase {
    std::size_t m, n, k;
};

TEST(CpuCompute, GemmMatchesDoubleReferenceForAllTransposes) {
    auto compute = make_compute(2);
    const GemmCase cases[] = {{1, 1, 1},    {0, 5, 3},     {3, 0, 4},      {3, 5, 0},
                              {15, 17, 13}, {65, 257, 31}, {130, 300, 70}, {64, 256, 1}};
    std::uint64_t salt = 1;
    for (const GemmCase& gc : cases) {
        for (int ta = 0; ta < 2; ++ta) {
            for (int tb = 0; tb < 2; ++tb) {
                const std::size_t pad = 3;  // leading dimensions larger than the minimum
                const std::size_t a_rows = ta ? gc.k : gc.m, a_cols = ta ? gc.m : gc.k;
                const std::size_t b_rows = tb ? gc.n : gc.k, b_cols = tb ? gc.k : gc.n;
                const std::size_t lda = a_cols + pad, ldb = b_cols + pad, ldc = gc.n + pad;
                auto a = random_vector(std::max<std::size_t>(1, a_rows * lda), salt++);
                auto b = random_vector(std::max<std::size_t>(1, b_rows * ldb), salt++);
                auto c = random_vector(std::max<std::size_t>(1, gc.m * ldc), salt++);
                const auto c0 = c;
                const float alpha = 0.75f, beta = gc.k % 2 == 0 ? 0.0f : -0.5f;
                if (beta == 0.0f && !c.empty()) c[0] = std::numeric_limits<float>::quiet_NaN();
                ASSERT_TRUE(compute->gemm(
                    ta ? Transpose::kYes : Transpose::kNo, tb ? Transpose::kYes : Transpose::kNo,
                    gc.m, gc.n, gc.k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc, 0));
                for (std::size_t i = 0; i < gc.m; ++i) {
                    for (std::size_t j = 0; j < gc.n; ++j) {
                        double sum = 0, magnitude = 0;
                        for (std::size_t p = 0; p < gc.k; ++p) {
                            const double av = ta ? a[p * lda + i] : a[i * lda + p];
                            const double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
                            sum += av * bv;
                            magnitude += std::fabs(av * bv);
                        }
                        const double ref =
                            alpha * sum + (beta == 0.0f ? 0.0 : beta * c0[i * ldc + j]);
                        const double tol = 1e-5 * (magnitude + std::fabs(c0[i * ldc + j])) + 1e-7;
                        ASSERT_NEAR(c[i * ldc + j], ref, tol)
                            << "m " << gc.m << " n " << gc.n << " k " << gc.k << " ta " << ta
                            << " tb " << tb << " at " << i << "," << j;
                    }
                    // The padding of C is never written.
                    for (std::size_t j = gc.n; j < ldc; ++j) {
                        if (i * ldc + j == 0) continue;
                        ASSERT_EQ(c[i * ldc + j], c0[i * ldc + j]);
                    }
                }
            }
        }
    }
}

// ---- Bias, activations -------------------------------------------------------------------

TEST(CpuCompute, BiasAddAndBiasGradMatchReference) {
    auto compute = make_compute(2);
    for (const auto& [rows, cols] :
         {std::pair<std::size_t, std::size_t>{1, 1}, {7, 300}, {129, 513}, {5000, 3}}) {
        auto y = random_vector(rows * cols, 10);
        const auto y0 = y;
        const auto bias = random_vector(cols, 11);
        ASSERT_TRUE(compute->bias_add(y.data(), bias.data(), rows, cols, 0));
        for (std::size_t r = 0; r < rows; ++r) {
            for (std::size_t c = 0; c < cols; ++c) {
                ASSERT_EQ(y[r * cols + c], y0[r * cols + c] + bias[c]);
            }
        }
        std::vector<float> grad(cols);
        ASSERT_TRUE(compute->bias_grad(y0.data(), rows, cols, grad.data(), 0));
        for (std::size_t c = 0; c < cols; ++c) {
            double sum = 0;
            for (std::size_t r = 0; r < rows; ++r) sum += y0[r * cols + c];
            ASSERT_EQ(grad[c], static_cast<float>(sum)) << "column " << c;
        }
    }
}

double gelu_ref(double x) {
    const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + std::tanh(u));
}

TEST(CpuCompute, ActivationsMatchReferenceAndFiniteDifferences) {
    auto compute = make_compute(2);
    const std::size_t n = 40000;  // several tiles
    auto x = random_vector(n, 20, -6.0f, 6.0f);
    x[0] = 0.0f;
    const auto dy = random_vector(n, 21);
    std::vector<float> y(n), dx(n);

    ASSERT_TRUE(compute->relu_forward(x.data(), y.data(), n, 0));
    ASSERT_TRUE(compute->relu_backward(x.data(), dy.data(), dx.data(), n, 0));
    for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(y[i], x[i] > 0 ? x[i] : 0.0f);
        ASSERT_EQ(dx[i], x[i] > 0 ? dy[i] : 0.0f);
    }

    ASSERT_TRUE(compute->gelu_forward(x.data(), y.data(), n, 0));
    ASSERT_TRUE(compute->gelu_backward(x.data(), dy.data(), dx.data(), n, 0));
    for (std::size_t i = 0; i < n; ++i) {
        const double xd = x[i];
        ASSERT_NEAR(y[i], gelu_ref(xd), 1e-6 * (1 + std::fabs(xd)));
        const double h = 1e-5;
        const double derivative = (gelu_ref(xd + h) - gelu_ref(xd - h)) / (2 * h);
        ASSERT_NEAR(dx[i], dy[i] * derivative, 2e-6) << "x " << xd;
    }

    // In place: y may equal x, dx may equal dy.
    auto inplace = x;
    ASSERT_TRUE(compute->gelu_forward(inplace.data(), inplace.data(), n, 0));
    ASSERT_TRUE(compute->gelu_forward(x.data(), y.data(), n, 0));
    EXPECT_TRUE(bitwise_equal(inplace, y));
}

// ---- LayerNorm ---------------------------------------------------------------------------

// Loss = sum(w * layer_norm(x)), in double.
double layer_norm_objective(const std::vector<double>& x, const std::vector<double>& gamma,
                            const std::vector<double>& beta, const std::vector<double>& w,
                            std::size_t rows, std::size_t cols, double eps) {
    double total = 0;
    for (std::size_t r = 0; r < rows; ++r) {
        double mean = 0;
        for (std::size_t c = 0; c < cols; ++c) mean += x[r * cols + c];
        mean /= static_cast<double>(cols);
        double var = 0;
        for (std::size_t c = 0; c < cols; ++c) var += std::pow(x[r * cols + c] - mean, 2);
        var /= static_cast<double>(cols);
        const double rstd = 1 / std::sqrt(var + eps);
        for (std::size_t c = 0; c < cols; ++c) {
            total += w[r * cols + c] * ((x[r * cols + c] - mean) * rstd * gamma[c] + beta[c]);
        }
    }
    return total;
}

TEST(CpuCompute, LayerNormForwardAndBackwardMatchFiniteDifferences) {
    auto compute = make_compute(2);
    const std::size_t rows = 5, cols = 37;
    const float eps = 1e-5f;
    const auto x = random_vector(rows * cols, 30, -2.0f, 3.0f);
    const auto gamma = random_vector(cols, 31, 0.5f, 1.5f);
    const auto beta = random_vector(cols, 32);
    const auto w = random_vector(rows * cols, 33);
    std::vector<float> y(rows * cols), mean(rows), rstd(rows);
    ASSERT_TRUE(compute->layer_norm_forward(x.data(), gamma.data(), beta.data(), eps, rows, cols,
                                            y.data(), mean.data(), rstd.data(), 0));
    std::vector<float> dx(rows * cols), dgamma(cols), dbeta(cols);
    ASSERT_TRUE(compute->layer_norm_backward(x.data(), gamma.data(), mean.data(), rstd.data(),
                                             w.data(), rows, cols, dx.data(), dgamma.data(),
                                             dbeta.data(), 0));

    std::vector<double> xd(x.begin(), x.end()), gd(gamma.begin(), gamma.end()),
        bd(beta.begin(), beta.end()), wd(w.begin(), w.end());
    // Forward: y matches the double formula.
    for (std::size_t r = 0; r < rows; ++r) {
        std::vector<double> unit(rows * cols, 0.0);
        for (std::size_t c = 0; c < cols; ++c) {
            std::fill(unit.begin(), unit.end(), 0.0);
            unit[r * cols + c] = 1.0;
            const double ref = layer_norm_objective(xd, gd, bd, unit, rows, cols, eps);
            ASSERT_NEAR(y[r * cols + c], ref, 1e-5);
        }
    }
    const double h = 1e-6;
    auto fd = [&](std::vector<double>& v, std::size_t i) {
        const double saved = v[i];
        v[i] = saved + h;
        const double plus = layer_norm_objective(xd, gd, bd, wd, rows, cols, eps);
        v[i] = saved - h;
        const double minus = layer_norm_objective(xd, gd, bd, wd, rows, cols, eps);
        v[i] = saved;
        return (plus - minus) / (2 * h);
    };
    for (std::size_t i = 0; i < rows * cols; ++i) ASSERT_NEAR(dx[i], fd(xd, i), 1e-4) << i;
    for (std::size_t c = 0; c < cols; ++c) {
        ASSERT_NEAR(dgamma[c], fd(gd, c), 1e-4) << c;
        ASSERT_NEAR(dbeta[c], fd(bd, c), 1e-4) << c;
    }
    // dx may be skipped; the parameter gradients are the same.
    std::vector<float> dgamma2(cols), dbeta2(cols);
    ASSERT_TRUE(compute->layer_norm_backward(x.data(), gamma.data(), mean.data(), rstd.data(),
                                             w.data(), rows, cols, nullptr, dgamma2.data(),
                                             dbeta2.data(), 0));
    EXPECT_TRUE(bitwise_equal(dgamma, dgamma2));
    EXPECT_TRUE(bitwise_equal(dbeta, dbeta2));
}

// ---- Softmax cross-entropy ---------------------------------------------------------------

double cross_entropy_ref(const std::vector<double>& logits, const std::vector<std::int32_t>& labels,
                         std::size_t rows, std::size_t classes) {
    double total = 0;
    for (std::size_t r = 0; r < rows; ++r) {
        double max_logit = logits[r * classes];
        for (std::size_t c = 1; c < classes; ++c)
            max_logit = std::max(max_logit, logits[r * classes + c]);
        double sum = 0;
        for (std::size_t c = 0; c < classes; ++c)
            sum += std::exp(logits[r * classes + c] - max_logit);
        total += std::log(sum) + max_logit - logits[r * classes + labels[r]];
    }
    return total / static_cast<double>(rows);
}

TEST(CpuCompute, SoftmaxCrossEntropyMatchesFiniteDifferences) {
    auto compute = make_compute(2);
    const std::size_t rows = 6, classes = 11;
    auto logits = random_vector(rows * classes, 40, -4.0f, 4.0f);
    logits[3] = 60.0f;  // a large logit: the max shift keeps exp finite
    std::vector<std::int32_t> labels(rows);
    for (std::size_t r = 0; r < rows; ++r) labels[r] = static_cast<std::int32_t>((r * 7) % classes);
    std::vector<float> probs(rows * classes), dlogits(rows * classes);
    float loss = 0;
    ASSERT_TRUE(compute->softmax_cross_entropy_forward(logits.data(), labels.data(), rows, classes,
                                                       probs.data(), &loss, 0));
    std::vector<double> ld(logits.begin(), logits.end());
    EXPECT_NEAR(loss, cross_entropy_ref(ld, labels, rows, classes), 1e-5);
    for (std::size_t r = 0; r < rows; ++r) {
        double sum = 0;
        for (std::size_t c = 0; c < classes; ++c) sum += probs[r * classes + c];
        EXPECT_NEAR(sum, 1.0, 1e-6);
    }
    const float grad_scale = 4.0f;
    ASSERT_TRUE(compute->softmax_cross_entropy_backward(probs.data(), labels.data(), rows, classes,
                                                        grad_scale, dlogits.data(), 0));
    const double h = 1e-6;
    for (std::size_t i = 0; i < rows * classes; ++i) {
        const double saved = ld[i];
        ld[i] = saved + h;
        const double plus = cross_entropy_ref(ld, labels, rows, classes);
        ld[i] = saved - h;
        const double minus = cross_entropy_ref(ld, labels, rows, classes);
        ld[i] = saved;
        ASSERT_NEAR(dlogits[i], grad_scale * (plus - minus) / (2 * h), 1e-5) << i;
    }
}

TEST(CpuCompute, CountCorrectTakesTheFirstMaximum) {
    auto compute = make_compute(2);
    const std::vector<float> logits = {1, 3, 3,   // tie: index 1 wins
                                       5, 0, 0,   //
                                       0, 0, 9};  //
    const std::vector<std::int32_t> labels = {1, 1, 2};
    std::uint64_t correct = 100;
    ASSERT_TRUE(compute->count_correct(logits.data(), labels.data(), 3, 3, &correct, false, 0));
    EXPECT_EQ(correct, 2u);
    ASSERT_TRUE(compute->count_correct(logits.data(), labels.data(), 3, 3, &correct, true, 0));
    EXPECT_EQ(correct, 4u);
}

// ---- The vectorisable exp and tanh -----------------------------------------------------------

TEST(CpuMath, ExpAndTanhMatchDoublePrecision) {
    double worst_exp = 0, worst_tanh = 0;
    for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
        const double want = std::exp(static_cast<double>(x));
        worst_exp = std::max(worst_exp, std::fabs(cpu_math::exp(x) - want) / want);
    }
    for (float u = -12.0f; u <= 12.0f; u += 0.00071f) {
        worst_tanh =
            std::max(worst_tanh, std::fabs(cpu_math::tanh(u) - std::tanh(static_cast<double>(u))));
    }
    std::printf("cpu_math: exp relative error <= %.2e, tanh absolute error <= %.2e\n", worst_exp,
                worst_tanh);
    EXPECT_LE(worst_exp, 2.5e-7);  // 2 ulp of fp32
    EXPECT_LE(worst_tanh, 2.5e-7);
    EXPECT_EQ(cpu_math::exp(0.0f), 1.0f);
    EXPECT_EQ(cpu_math::tanh(20.0f), 1.0f);
    EXPECT_EQ(cpu_math::tanh(-20.0f), -1.0f);
    EXPECT_GT(cpu_math::exp(-1000.0f), 0.0f);  // clamped, never a denormal or NaN
    EXPECT_LT(cpu_math::exp(-1000.0f), 1e-37f);
}

// ---- Embeddings and causal softmax (the GPT model) ------------------------------------------

TEST(CpuCompute, EmbeddingForwardAddsPositionsAndBackwardScattersInRowOrder) {
    for (int threads : {1, 2}) {
        auto compute = make_compute(threads);
        const std::size_t vocab = 7, period = 3, cols = 300, rows = 12;  // 300: two column tiles
        const auto table = random_vector(vocab * cols, 60);
        const auto positions = random_vector(period * cols, 61);
        std::vector<std::int32_t> tokens(rows);
        for (std::size_t r = 0; r < rows; ++r)
            tokens[r] = static_cast<std::int32_t>((r * 5) % vocab);
        tokens[4] = tokens[7] = 6;  // a repeated token: its gradient rows add up
        std::vector<float> y(rows * cols);
        ASSERT_TRUE(compute->embedding_forward(tokens.data(), table.data(), positions.data(), rows,
                                               period, cols, vocab, y.data(), 0));
        for (std::size_t r = 0; r < rows; ++r) {
            for (std::size_t c = 0; c < cols; ++c) {
                ASSERT_EQ(y[r * cols + c], table[static_cast<std::size_t>(tokens[r]) * cols + c] +
                                               positions[(r % period) * cols + c]);
            }
        }
        const auto dy = random_vector(rows * cols, 62);
        // The table gradient is added to what is there (a tied weight's other share); the
        // positions' is overwritten (NaN before: must vanish).
        std::vector<float> grad_table(vocab * cols, 0.5f);
        std::vector<float> grad_pos(period * cols, std::numeric_limits<float>::quiet_NaN());
        ASSERT_TRUE(compute->embedding_backward(tokens.data(), dy.data(), rows, period, cols, vocab,
                                                grad_table.data(), grad_pos.data(), 0));
        std::vector<float> want_table(vocab * cols, 0.5f), want_pos(period * cols, 0.0f);
        for (std::size_t r = 0; r < rows; ++r) {
            for (std::size_t c = 0; c < cols; ++c) {
                want_table[static_cast<std::size_t>(tokens[r]) * cols + c] += dy[r * cols + c];
                want_pos[(r % period) * cols + c] += dy[r * cols + c];
            }
        }
        EXPECT_TRUE(bitwise_equal(grad_table, want_table)) << threads << " threads";
        EXPECT_TRUE(bitwise_equal(grad_pos, want_pos)) << threads << " threads";
    }
}

// sum over i, j <= i of w[i, j] * causal_softmax(s)[i, j], in double.
double weighted_causal_softmax(const std::vector<double>& s, const std::vector<double>& w,
                               std::size_t n, std::size_t ld) {
    double total = 0;
    for (std::size_t i = 0; i < n; ++i) {
        double mx = s[i * ld];
        for (std::size_t j = 1; j <= i; ++j) mx = std::max(mx, s[i * ld + j]);
        double sum = 0;
        for (std::size_t j = 0; j <= i; ++j) sum += std::exp(s[i * ld + j] - mx);
        for (std::size_t j = 0; j <= i; ++j)
            total += w[i * n + j] * std::exp(s[i * ld + j] - mx) / sum;
    }
    return total;
}

TEST(CpuCompute, CausalSoftmaxMatchesDoubleReferenceAndFiniteDifferences) {
    auto compute = make_compute(2);
    const std::size_t n = 37, ld = 41;  // more rows than one tile; a padded row stride
    auto s = random_vector(n * ld, 63, -3.0f, 3.0f);
    s[5 * ld + 2] = 80.0f;  // a large score: the max shift keeps exp finite
    const std::vector<double> sd(s.begin(), s.end());
    std::vector<float> p = s;
    ASSERT_TRUE(compute->causal_softmax_forward(p.data(), n, ld, 0));
    for (std::size_t i = 0; i < n; ++i) {
        double mx = sd[i * ld];
        for (std::size_t j = 1; j <= i; ++j) mx = std::max(mx, sd[i * ld + j]);
        double sum = 0;
        for (std::size_t j = 0; j <= i; ++j) sum += std::exp(sd[i * ld + j] - mx);
        for (std::size_t j = 0; j < n; ++j) {
            const double want = j <= i ? std::exp(sd[i * ld + j] - mx) / sum : 0.0;
            ASSERT_NEAR(p[i * ld + j], want, 1e-6 * std::max(1.0, want)) << i << "," << j;
            if (j > i) {
                ASSERT_EQ(p[i * ld + j], 0.0f);  // masked exactly
            }
        }
        // The padding beyond n is not touched.
        for (std::size_t j = n; j < ld; ++j) ASSERT_EQ(p[i * ld + j], s[i * ld + j]);
    }
    // Backward: with dp = w, ds = d(sum w p)/ds.
    const auto wf = random_vector(n * n, 64);
    std::vector<float> dp(n * ld, 7.0f);
    for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t j = 0; j < n; ++j) dp[i * ld + j] = wf[i * n + j];
    }
    ASSERT_TRUE(compute->causal_softmax_backward(p.data(), dp.data(), n, ld, 0));
    const std::vector<double> w(wf.begin(), wf.end());
    std::vector<double> probe = sd;
    const double h = 1e-6;
    for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t j = 0; j < n; ++j) {
            const std::size_t at = i * ld + j;
            probe[at] = sd[at] + h;
            const double plus = weighted_causal_softmax(probe, w, n, ld);
            probe[at] = sd[at] - h;
            const double minus = weighted_causal_softmax(probe, w, n, ld);
            probe[at] = sd[at];
            ASSERT_NEAR(dp[at], (plus - minus) / (2 * h), 2e-6) << i << "," << j;
        }
    }
}

// ---- Dropout -----------------------------------------------------------------------------

TEST(CpuCompute, DropoutMaskIsThePhiloxMaskAndReproducible) {
    auto compute = make_compute(2);
    const std::size_t n = 100003;
    const float p = 0.3f;
    const auto x = random_vector(n, 50);
    std::vector<float> y(n), y2(n), dx(n);
    std::vector<std::uint8_t> mask(n), mask2(n), mask3(n);
    ASSERT_TRUE(compute->dropout_forward(x.data(), y.data(), mask.data(), n, p, 42, 7, 0));
    ASSERT_TRUE(compute->dropout_forward(x.data(), y2.data(), mask2.data(), n, p, 42, 7, 0));
    EXPECT_TRUE(bitwise_equal(mask, mask2));
    EXPECT_TRUE(bitwise_equal(y, y2));
    const std::uint32_t threshold = philox::dropout_threshold(p);
    const float keep_scale = 1.0f / (1.0f - p);
    std::size_t kept = 0;
    for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(mask[i] != 0, philox::dropout_keep(42, 7, i, threshold)) << i;
        ASSERT_EQ(y[i], mask[i] ? x[i] * keep_scale : 0.0f);
        kept += mask[i];
    }
    EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 0.01);
    // Another step or seed draws another mask.
    ASSERT_TRUE(compute->dropout_forward(x.data(), y2.data(), mask3.data(), n, p, 42, 8, 0));
    EXPECT_FALSE(bitwise_equal(mask, mask3));
    ASSERT_TRUE(compute->dropout_forward(x.data(), y2.data(), mask3.data(), n, p, 43, 7, 0));
    EXPECT_FALSE(bitwise_equal(mask, mask3));
    // Backward applies the same mask and scale.
    const auto dy = random_vector(n, 51);
    ASSERT_TRUE(compute->dropout_backward(dy.data(), mask.data(), dx.data(), n, p, 0));
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(dx[i], mask[i] ? dy[i] * keep_scale : 0.0f);
    // p = 0 keeps everything unscaled.
    ASSERT_TRUE(compute->dropout_forward(x.data(), y2.data(), mask3.data(), n, 0.0f, 1, 1, 0));
    EXPECT_TRUE(bitwise_equal(x, y2));
}

// ---- Vector operations, casts, sums ------------------------------------------------------

TEST(CpuCompute, ScaleAndAxpyRoundOncePerOperation) {
    auto compute = make_compute(2);
    const std::size_t n = 33333;
    auto x = random_vector(n, 60);
    auto y = random_vector(n, 61);
    const auto x0 = x, y0 = y;
    ASSERT_TRUE(compute->axpy(0.37f, x.data(), y.data(), n, 0));
    ASSERT_TRUE(compute->scale(x.data(), n, -1.25f, 0));
    for (std::size_t i = 0; i < n; ++i) {
        const float product = 0.37f * x0[i];
        ASSERT_EQ(y[i], y0[i] + product);
        ASSERT_EQ(x[i], x0[i] * -1.25f);
    }
}

TEST(CpuCompute, CastsRoundToNearestEvenAndMatchTheKernelDefinition) {
    auto compute = make_compute(2);
    auto bits = [](std::uint32_t b) { return kernels::bits_float(b); };
    const std::vector<float> special = {
        1.0f,
        -2.5f,
        0.0f,
        -0.0f,
        bits(0x3F808000u),  // halfway between two bf16 values, even below: rounds down
        bits(0x3F818000u),  // halfway, even above: rounds up
        std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN(),
        65504.0f,
        65520.0f,
        1e-7f,
        3e38f};
    std::vector<std::uint16_t> bf16(special.size()), fp16(special.size());
    ASSERT_TRUE(compute->cast(special.data(), DType::kFloat32, bf16.data(), DType::kBFloat16,
                              special.size(), 0));
    ASSERT_TRUE(compute->cast(special.data(), DType::kFloat32, fp16.data(), DType::kFloat16,
                              special.size(), 0));
    EXPECT_EQ(bf16[0], 0x3F80u);
    EXPECT_EQ(bf16[4], 0x3F80u);
    EXPECT_EQ(bf16[5], 0x3F82u);
    EXPECT_EQ(bf16[6], 0x7F80u);
    EXPECT_EQ(bf16[8] & 0x7F80u, 0x7F80u);
    EXPECT_NE(bf16[8] & 0x007Fu, 0u);  // NaN stays NaN
    EXPECT_EQ(fp16[0], 0x3C00u);
    EXPECT_EQ(fp16[9], 0x7BFFu);   // 65504, the largest fp16
    EXPECT_EQ(fp16[10], 0x7C00u);  // 65520 rounds to infinity
    EXPECT_EQ(fp16[12], 0x7C00u);
    EXPECT_EQ(fp16[11], 0x0002u);  // 1e-7 is about 1.68 x 2^-24: denormal 2

    // Random data over many tiles: identical to the scalar definition; widening is exact.
    const std::size_t n = 70001;
    auto x = random_vector(n, 70, -70000.0f, 70000.0f);
    for (std::size_t i = 0; i < n; i += 7) x[i] *= 1e-9f;
    std::vector<std::uint16_t> b(n), h(n);
    std::vector<float> back(n);
    ASSERT_TRUE(compute->cast(x.data(), DType::kFloat32, b.data(), DType::kBFloat16, n, 0));
    ASSERT_TRUE(compute->cast(x.data(), DType::kFloat32, h.data(), DType::kFloat16, n, 0));
    for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(b[i], kernels::float_to_bf16(x[i]));
        ASSERT_EQ(h[i], kernels::float_to_fp16(x[i]));
    }
    ASSERT_TRUE(compute->cast(b.data(), DType::kBFloat16, back.data(), DType::kFloat32, n, 0));
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], kernels::bf16_to_float(b[i]));
    ASSERT_TRUE(compute->cast(h.data(), DType::kFloat16, back.data(), DType::kFloat32, n, 0));
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], kernels::fp16_to_float(h[i]));
    // bf16 -> fp16 goes through the exact fp32 value.
    std::vector<std::uint16_t> h2(n);
    ASSERT_TRUE(compute->cast(b.data(), DType::kBFloat16, h2.data(), DType::kFloat16, n, 0));
    for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(h2[i], kernels::float_to_fp16(kernels::bf16_to_float(b[i])));
    }
}

TEST(CpuCompute, SumSquaresCountsNonFiniteAndAccumulates) {
    auto compute = make_compute(2);
    const std::size_t n = 300007;
    auto x = random_vector(n, 80);
    double ref = 0;
    for (const float v : x) ref += static_cast<double>(v) * v;
    SumSquares out;
    ASSERT_TRUE(compute->sum_squares(x.data(), n, &out, false, 0));
    EXPECT_NEAR(out.sum_squares, ref, 1e-9 * ref);
    EXPECT_EQ(out.nonfinite_count, 0u);
    ASSERT_TRUE(compute->sum_squares(x.data(), n, &out, true, 0));
    EXPECT_NEAR(out.sum_squares, 2 * ref, 2e-9 * ref);
    x[5] = std::numeric_limits<float>::infinity();
    x[n - 1] = std::numeric_limits<float>::quiet_NaN();
    ASSERT_TRUE(compute->sum_squares(x.data(), n, &out, false, 0));
    EXPECT_EQ(out.nonfinite_count, 2u);
    EXPECT_TRUE(std::isnan(out.sum_squares));
    ASSERT_TRUE(compute->sum_squares(x.data(), 0, &out, false, 0));
    EXPECT_EQ(out.sum_squares, 0.0);
}

// ---- Determinism -------------------------------------------------------------------------

// Every output of every reduction-bearing operation, for one thread count.
struct Outputs {
    std::vector<float> gemm, bias_grad, ln_y, ln_dx, ln_dgamma, softmax_probs, dropout_y;
    float loss = 0;
    SumSquares sums;
};

Outputs run_all(CpuCompute& compute) {
    Outputs out;
    const std::size_t m = 130, n = 1030, k = 200;
    const auto a = random_vector(m * k, 90), b = random_vector(k * n, 91);
    out.gemm.resize(m * n);
    ZINF_ASSERT(compute.gemm(Transpose::kNo, Transpose::kNo, m, n, k, 1.0f, a.data(), k, b.data(),
                             n, 0.0f, out.gemm.data(), n, 0));
    out.bias_grad.resize(n);
    ZINF_ASSERT(compute.bias_grad(out.gemm.data(), m, n, out.bias_grad.data(), 0));
    const auto gamma = random_vector(n, 92), beta = random_vector(n, 93);
    out.ln_y.resize(m * n);
    std::vector<float> mean(m), rstd(m);
    ZINF_ASSERT(compute.layer_norm_forward(out.gemm.data(), gamma.data(), beta.data(), 1e-5f, m, n,
                                           out.ln_y.data(), mean.data(), rstd.data(), 0));
    out.ln_dx.resize(m * n);
    out.ln_dgamma.resize(2 * n);
    ZINF_ASSERT(compute.layer_norm_backward(out.gemm.data(), gamma.data(), mean.data(), rstd.data(),
                                            out.ln_y.data(), m, n, out.ln_dx.data(),
                                            out.ln_dgamma.data(), out.ln_dgamma.data() + n, 0));
    const std::size_t rows = 9000, classes = 10;  // crosses the reduction batches
    const auto logits = random_vector(rows * classes, 94, -5.0f, 5.0f);
    std::vector<std::int32_t> labels(rows);
    for (std::size_t r = 0; r < rows; ++r) labels[r] = static_cast<std::int32_t>(r % classes);
    out.softmax_probs.resize(rows * classes);
    ZINF_ASSERT(compute.softmax_cross_entropy_forward(logits.data(), labels.data(), rows, classes,
                                                      out.softmax_probs.data(), &out.loss, 0));
    const std::size_t big = (std::size_t{1} << 22) + 12345;  // crosses the sum batches
    const auto x = random_vector(big, 95);
    ZINF_ASSERT(compute.sum_squares(x.data(), big, &out.sums, false, 0));
    out.dropout_y.resize(big);
    std::vector<std::uint8_t> mask(big);
    ZINF_ASSERT(
        compute.dropout_forward(x.data(), out.dropout_y.data(), mask.data(), big, 0.1f, 5, 6, 0));
    return out;
}

TEST(CpuCompute, ResultsAreBitwiseIdenticalForEveryThreadCount) {
    // Let oneTBB run more threads than this machine has cores, so that every count is real.
    tbb::global_control parallelism(tbb::global_control::max_allowed_parallelism, 8);
    auto reference_compute = make_compute(1);
    const Outputs reference = run_all(*reference_compute);
    for (const int threads : {2, 3, 8}) {
        auto compute = make_compute(threads);
        const Outputs out = run_all(*compute);
        EXPECT_TRUE(bitwise_equal(out.gemm, reference.gemm)) << threads;
        EXPECT_TRUE(bitwise_equal(out.bias_grad, reference.bias_grad)) << threads;
        EXPECT_TRUE(bitwise_equal(out.ln_y, reference.ln_y)) << threads;
        EXPECT_TRUE(bitwise_equal(out.ln_dx, reference.ln_dx)) << threads;
        EXPECT_TRUE(bitwise_equal(out.ln_dgamma, reference.ln_dgamma)) << threads;
        EXPECT_TRUE(bitwise_equal(out.softmax_probs, reference.softmax_probs)) << threads;
        EXPECT_TRUE(bitwise_equal(out.dropout_y, reference.dropout_y)) << threads;
        EXPECT_EQ(std::memcmp(&out.loss, &reference.loss, sizeof(float)), 0) << threads;
        EXPECT_EQ(std::memcmp(&out.sums.sum_squares, &reference.sums.sum_squares, sizeof(double)),
                  0)
            << threads;
    }
}

// ---- With a CpuDevice --------------------------------------------------------------------

TEST(CpuCompute, OrdersAfterCopiesOnTheDeviceStream) {
    auto device = CpuDevice::create(CpuDeviceOptions{});
    ASSERT_TRUE(device.has_value()) << device.status().to_string();
    auto compute = CpuCompute::create(device->get(), CpuComputeOptions{2});
    ASSERT_TRUE(compute.has_value()) << compute.status().to_string();
    const std::size_t n = 1 << 20;
    auto stream = (*device)->create_stream();
    ASSERT_TRUE(stream.has_value());
    auto memory = (*device)->allocate(n * sizeof(float), "test");
    ASSERT_TRUE(memory.has_value());
    auto* x = static_cast<float*>(*memory);
    const auto host = random_vector(n, 100);
    std::vector<float> result(n);
    // The copy is queued on the worker; relu must see its result, and the copy back must see
    // relu's.
    ASSERT_TRUE((*device)->copy_to_device(x, host.data(), n * sizeof(float), *stream));
    ASSERT_TRUE((*compute)->relu_forward(x, x, n, *stream));
    ASSERT_TRUE((*device)->copy_to_host(result.data(), x, n * sizeof(float), *stream));
    ASSERT_TRUE((*device)->synchronize(*stream));
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(result[i], std::max(host[i], 0.0f));
    (*device)->free(x);
}

TEST(CpuCompute, RejectsBadOptions) {
    auto compute = CpuCompute::create(nullptr, CpuComputeOptions{-1});
    ASSERT_FALSE(compute.has_value());
    EXPECT_EQ(compute.error().code(), StatusCode::kInvalidArgument);
    auto ok = CpuCompute::create(nullptr, CpuComputeOptions{0});
    ASSERT_TRUE(ok.has_value());
    EXPECT_GE((*ok)->threads(), 1);
    EXPECT_NE((*ok)->name().find("openblas"), std::string_view::npos);
}

}  // namespace
}  // namespace zinf::device
