// CpuCompute: OpenBLAS GEMM over fixed tiles and oneTBB-parallel elementwise, row and column
// operations with fixed-order reductions.
#include "src/device/cpu_compute.h"

#include <cblas.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>

#include "kernels/cast.h"
#include "kernels/cpu_features.h"
#include "src/base/dtype.h"
#include "src/base/log.h"
#include "src/base/philox.h"
#include "src/device/cpu_math.h"

namespace zinf::device {
namespace {

constexpr std::size_t ceil_div(std::size_t a, std::size_t b) noexcept {
    return (a + b - 1) / b;
}

// Rows per tile of the row-wise operations (LayerNorm, softmax, argmax).
constexpr std::size_t kRowTileRows = 16;
// Tiles whose partial results are held at once by an ordered reduction (on the stack).
constexpr std::size_t kReduceBatchTiles = 256;

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// BLAS takes int sizes; the shapes of one operation stay far below 2^31 in this project.

int blas_int(std::size_t value) {
    ZINF_ASSERT_LE(value, static_cast<std::size_t>(std::numeric_limits<int>::max()));
    return static_cast<int>(value);
}

// The elementwise loops, each built for AVX-512, AVX2 and the baseline and picked at load time
// (GCC's target_clones): the same operations in the same order on every variant, and no FMA
// contraction (ISO mode, -std=c++20, compiles with -ffp-contract=off), so bitwise the same
// results on every x86-64 machine.
#define ZINF_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

ZINF_CLONES void gelu_forward_loop(const float* x, float* y, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
        const float v = x[i];
        const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
        y[i] = 0.5f * v * (1.0f + cpu_math::tanh(u));
    }
}

ZINF_CLONES void gelu_backward_loop(const float* x, const float* dy, float* dx, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
        const float v = x[i];
        const float t = cpu_math::tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
        const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
        dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
    }
}

// y[i] = e^(x[i] - shift).
ZINF_CLONES void exp_shifted_loop(const float* x, float* y, std::size_t n, float shift) {
    for (std::size_t i = 0; i < n; ++i) y[i] = cpu_math::exp(x[i] - shift);
}

}  // namespace

struct CpuCompute::Impl {
    Impl(int threads, kernels::Isa isa_in) : arena(threads), isa(isa_in) {}
    tbb::task_arena arena;
    kernels::Isa isa;  // of the cast kernels
};

Result<std::unique_ptr<CpuCompute>> CpuCompute::create(Device* device,
                                                       const CpuComputeOptions& options) {
    if (options.threads < 0) {
        return Status::invalid_argument(
            str_cat("cpu compute: threads must be >= 0 (0: all cores), got ", options.threads));
    }
    if (device != nullptr && device->kind() != DeviceKind::kCpu) {
        return Status::invalid_argument(
            str_cat("cpu compute: needs a CPU device, got ", device->name()));
    }
    // The casts run the kernels library's SIMD variants, which match its scalar definition
    // bit for bit; ZINF_CPU_ISA overrides the choice as it does for the optimizer.
    ZINF_ASSIGN_OR_RETURN(const kernels::Isa isa, kernels::resolve_isa("auto"));
    int threads = options.threads;
    if (threads == 0) threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    // Process-wide: see the class comment. Each tile is one single-threaded BLAS call.
    openblas_set_num_threads(1);
    const char* core = openblas_get_corename();
    std::string name =
        str_cat("cpu (openblas ", core != nullptr ? core : "?", ", casts ", kernels::isa_name(isa),
                ", ", threads, threads == 1 ? " thread)" : " threads)");
    return std::unique_ptr<CpuCompute>(
        new CpuCompute(device, threads, std::make_unique<Impl>(threads, isa), std::move(name)));
}

CpuCompute::CpuCompute(Device* device, int threads, std::unique_ptr<Impl> impl, std::string name)
    : device_(device), threads_(threads), impl_(std::move(impl)), name_(std::move(name)) {}

CpuCompute::~CpuCompute() = default;

Status CpuCompute::wait_stream(StreamId stream) {
    if (device_ == nullptr) return Status::ok();
    return device_->synchronize(stream);
}

template <typename Body>
void CpuCompute::parallel_tiles(std::size_t count, std::size_t tile_count, const Body& body) {
    ZINF_ASSERT_GT(tile_count, 0u);
    const std::size_t tiles = ceil_div(count, tile_count);
    if (tiles == 0) return;
    if (tiles == 1 || threads_ == 1) {
        for (std::size_t t = 0; t < tiles; ++t) {
            body(t * tile_count, std::min(count, (t + 1) * tile_count));
        }
        return;
    }
    impl_->arena.execute([&] {
        tbb::parallel_for(
            tbb::blocked_range<std::size_t>(0, tiles, 1),
            [&](const tbb::blocked_range<std::size_t>& range) {
                for (std::size_t t = range.begin(); t != range.end(); ++t) {
                    body(t * tile_count, std::min(count, (t + 1) * tile_count));
                }
            },
            tbb::simple_partitioner());
    });
}

// ---- GEMM ------------------------------------------------------------------------------------

Status CpuCompute::gemm(Transpose trans_a, Transpose trans_b, std::size_t m, std::size_t n,
                        std::size_t k, float alpha, const float* a, std::size_t lda, const float* b,
                        std::size_t ldb, float beta, float* c, std::size_t ldc, StreamId stream) {
    const bool ta = trans_a == Transpose::kYes;
    const bool tb = trans_b == Transpose::kYes;
    // std::max returns a reference: keep its result in values, not in the assertion's refs.
    const std::size_t lda_min = std::max<std::size_t>(1, ta ? m : k);
    const std::size_t ldb_min = std::max<std::size_t>(1, tb ? k : n);
    const std::size_t ldc_min = std::max<std::size_t>(1, n);
    ZINF_ASSERT_GE(lda, lda_min);
    ZINF_ASSERT_GE(ldb, ldb_min);
    ZINF_ASSERT_GE(ldc, ldc_min);
    ZINF_TRY(wait_stream(stream));
    if (m == 0 || n == 0) return Status::ok();
    ZINF_ASSERT(c != nullptr);
    if (k == 0) {
        // C = beta * C, with beta == 0 not reading C.
        parallel_tiles(m, kGemmTileRows, [&](std::size_t r0, std::size_t r1) {
            for (std::size_t r = r0; r < r1; ++r) {
                float* row = c + r * ldc;
                for (std::size_t j = 0; j < n; ++j) row[j] = beta == 0.0f ? 0.0f : beta * row[j];
            }
        });
        return Status::ok();
    }
    ZINF_ASSERT(a != nullptr);
    ZINF_ASSERT(b != nullptr);
    const int k_int = blas_int(k);
    const int lda_int = blas_int(lda);
    const int ldb_int = blas_int(ldb);
    const int ldc_int = blas_int(ldc);
    const std::size_t col_tiles = ceil_div(n, kGemmTileCols);
    const std::size_t row_tiles = ceil_div(m, kGemmTileRows);
    parallel_tiles(row_tiles * col_tiles, 1, [&](std::size_t t0, std::size_t t1) {
        for (std::size_t t = t0; t < t1; ++t) {
            const std::size_t i0 = (t / col_tiles) * kGemmTileRows;
            const std::size_t j0 = (t % col_tiles) * kGemmTileCols;
            const std::size_t mi = std::min(kGemmTileRows, m - i0);
            const std::size_t nj = std::min(kGemmTileCols, n - j0);
            // Rows i0.. of op(A): row offset of A, or column offset of the stored k x m A^T.
            const float* a_tile = ta ? a + i0 : a + i0 * lda;
            // Columns j0.. of op(B): column offset of B, or row offset of the stored n x k B^T.
            const float* b_tile = tb ? b + j0 * ldb : b + j0;
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                        tb ? CblasTrans : CblasNoTrans, static_cast<int>(mi), static_cast<int>(nj),
                        k_int, alpha, a_tile, lda_int, b_tile, ldb_int, beta, c + i0 * ldc + j0,
                        ldc_int);
        }
    });
    return Status::ok();
}

Status CpuCompute::bias_add(float* y, const float* bias, std::size_t rows, std::size_t cols,
                            StreamId stream) {
    ZINF_TRY(wait_stream(stream));
    if (cols == 0) return Status::ok();
    const std::size_t rows_per_tile = std::max<std::size_t>(1, kElementwiseTileNumel / cols);
    parallel_tiles(rows, rows_per_tile, [&](std::size_t r0, std::size_t r1) {
        for (std::size_t r = r0; r < r1; ++r) {
            float* row = y + r * cols;
            for (std::size_t c = 0; c < cols; ++c) row[c] += bias[c];
        }
    });
    return Status::ok();
}

// Column sums of a rows x cols matrix over column tiles: each column is summed in double, rows
// in order, by exactly one task, so the result does not depend on the thread count.
Status CpuCompute::bias_grad(const float* dy, std::size_t rows, std::size_t cols, float* grad_bias,
                             StreamId stream) {
    ZINF_TRY(wait_stream(stream));
    parallel_tiles(cols, kColumnTileCols, [&](std::size_t c0, std::size_t c1) {
        std::array<double, kColumnTileCols> sums{};
        const std::size_t width = c1 - c0;
        for (std::size_t r = 0; r < rows; ++r) {
            const float* row = dy + r * cols + c0;
            for (std::size_t c = 0; c < width; ++c) sums[c] += row[c];
        }
        for (std::size_t c = 0; c < width; ++c) grad_bias[c0 + c] = static_cast<float>(sums[c]);
    });
    return Status::ok();
}

// ---- Activations -----------------------------------------------------------------------------

Status CpuCompute::relu_forward(const float* x, float* y, std::size_t numel, StreamId stream) {
    ZINF_TRY(wait_stream(stream));
    parallel_tiles(numel, kElementwiseTileNumel, [&](std::size_t i0, std::size_t i1) {
        for (std::size_t i = i0; i < i1; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    });
    return Status::ok();
}

Status CpuCompute::relu_backward(const float* x, const float* dy, float* dx, std::size_t numel,
                                 StreamId stream) {
    ZINF_TRY(wait_stream(stream));
    parallel_tiles(numel, kElementwiseTileNumel, [&](std::size_t i0, std::size_t i1) {
        for (std::size_t i = i0; i < i1; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
    });
    return Status::ok();
}

Status CpuCompute::gelu_forward(const float* x, float* y, std::size_t numel, StreamId stream) {
    ZINF_TRY(wait_stream(stream));
    parallel_tiles(numel, kElementwiseTileNumel, [&](std::size_t i0, std::size_t i1) {
        gelu_forward_loop(x + i0, y + i0, i1 - i0);
    });
    return Status::ok();
}

Status CpuCompute::gelu_backward(const float* x, const float* dy, float* dx, std::size_t numel,
                                 StreamId stream) {
    ZINF_TRY(wait_stream(stream));
    parallel_tiles(numel, kElementwiseTileNumel, [&](std::size_t i0, std::size_t i1) {
        gelu_backward_loop(x + i0, dy + i0, dx + i0, i1 - i0);
    });
    return Status::ok();
}

// ---- LayerNorm -------------------------------------------------------------------------------

Status CpuCompute::layer_norm_forward(const float* x, const float* gamma, const float* beta,
                                      float eps, std::size_t rows, std::size_t cols, float* y,
                                      float* mean, float* rstd, StreamId stream) {
    ZINF_ASSERT_GT(cols, 0u);
    ZINF_ASSERT_GE(eps, 0.0f);
    ZINF_TRY(wait_stream(stream));
    parallel_tiles(rows, kRowTileRows, [&](std::size_t r0, std::size_t r1) {
        for (std::size_t r = r0; r < r1; ++r) {
            const float* xr = x + r * cols;
            double sum = 0;
            for (std::size_t c = 0; c < cols; ++c) sum += xr[c];
            const double mu = sum / static_cast<double>(cols);
            double sq = 0;
            for (std::size_t c = 0; c < cols; ++c) {
                const double d = xr[c] - mu;
                sq += d * d;
            }
            const double var = sq / static_cast<double>(cols);
            // y uses the saved fp32 statistics, so that backward sees exactly what forward used.
            const auto mu_f = static_cast<float>(mu);
            const auto rstd_f = static_cast<float>(1.0 / std::sqrt(var + eps));
            mean[r] = mu_f;
            rstd[r] = rstd_f;
            float* yr = y + r * cols;
            for (std::size_t c = 0; c < cols; ++c) {
                yr[c] = (xr[c] - mu_f) * rstd_f * gamma[c] + beta[c];
            }
        }
    });
    return Status::ok();
}

Status CpuCompute::layer_norm_backward(const float* x, const float* gamma, const float* mean,
                                       const float* rstd, const float* dy, std::size_t rows,
                                       std::size_t cols, float* dx, float* grad_gamma,
                                       float* grad_beta, StreamId stream) {
    ZINF_ASSERT_GT(cols, 0u);
    ZINF_TRY(wait_stream(stream));
    if (dx != nullptr) {
        parallel_tiles(rows, kRowTileRows, [&](std::size_t r0, std::size_t r1) {
            for (std::size_t r = r0; r < r1; ++r) {
                const float* xr = x + r * cols;
                const float* dyr = dy + r * cols;
                const float mu = mean[r];
                const float rs = rstd[r];
                double sum_g = 0;
                double sum_g_xhat = 0;
                for (std::size_t c = 0; c < cols; ++c) {
                    const float xhat = (xr[c] - mu) * rs;
                    const float g = dyr[c] * gamma[c];
                    sum_g += g;
                    sum_g_xhat += static_cast<double>(g) * xhat;
                }
                const auto mean_g = static_cast<float>(sum_g / static_cast<double>(cols));
                const auto mean_g_xhat = static_cast<float>(sum_g_xhat / static_cast<double>(cols));
                float* dxr = dx + r * cols;
                for (std::size_t c = 0; c < cols; ++c) {
                    const float xhat = (xr[c] - mu) * rs;
                    const float g = dyr[c] * gamma[c];
                    dxr[c] = rs * (g - mean_g - xhat * mean_g_xhat);
                }
            }
        });
    }
    parallel_tiles(cols, kColumnTileCols, [&](std::size_t c0, std::size_t c1) {
        std::array<double, kColumnTileCols> sum_gamma{};
        std::array<double, kColumnTileCols> sum_beta{};
        const std::size_t width = c1 - c0;
        for (std::size_t r = 0; r < rows; ++r) {
            const float* xr = x + r * cols + c0;
            const float* dyr = dy + r * cols + c0;
            const float mu = mean[r];
            const float rs = rstd[r];
            for (std::size_t c = 0; c < width; ++c) {
                const float xhat = (xr[c] - mu) * rs;
                sum_gamma[c] += static_cast<double>(dyr[c]) * xhat;
                sum_beta[c] += dyr[c];
            }
        }
        for (std::size_t c = 0; c < width; ++c) {
            grad_gamma[c0 + c] = static_cast<float>(sum_gamma[c]);
            grad_beta[c0 + c] = static_cast<float>(sum_beta[c]);
        }
    });
    return Status::ok();
}

// ---- Dropout ---------------------------------------------------------------------------------

Status CpuCompute::dropout_forward(const float* x, float* y, std::uint8_t* mask, std::size_t numel,
                                   float p, std::uint64_t seed, std::uint64_t step,
                                   StreamId stream) {
    ZINF_ASSERT_GE(p, 0.0f);
    ZINF_ASSERT_LT(p, 1.0f);
    ZINF_TRY(wait_stream(stream));
    const std::uint32_t threshold = philox::dropout_threshold(p);
    const float keep_scale = 1.0f / (1.0f - p);
    // Tiles are multiples of 4 elements, so each Philox call serves one tile.
    static_assert(kElementwiseTileNumel % 4 == 0);
    parallel_tiles(numel, kElementwiseTileNumel, [&](std::size_t i0, std::size_t i1) {
        const philox::Key key = philox::make_key(seed);
        for (std::size_t g = i0; g < i1; g += 4) {
            const std::uint64_t group = g >> 2;
            const philox::Counter words = philox::philox4x32_10(
                philox::Counter{
                    {static_cast<std::uint32_t>(group), static_cast<std::uint32_t>(group >> 32),
                     static_cast<std::uint32_t>(step), static_cast<std::uint32_t>(step >> 32)}},
                key);
            const std::size_t end = std::min(i1, g + 4);
            for (std::size_t i = g; i < end; ++i) {
                const bool keep = words.v[i & 3] >= threshold;
                mask[i] = keep ? 1 : 0;
                y[i] = keep ? x[i] * keep_scale : 0.0f;
            }
        }
    });
    return Status::ok();
}

Status CpuCompute::dropout_backward(const float* dy, const std::uint8_t* mask, float* dx,
                                    std::size_t numel, float p, StreamId stream) {
    ZINF_ASSERT_GE(p, 0.0f);
    ZINF_ASSERT_LT(p, 1.0f);
    ZINF_TRY(wait_stream(stream));
    const float keep_scale = 1.0f / (1.0f - p);
    parallel_tiles(numel, kElementwiseTileNumel, [&](std::size_t i0, std::size_t i1) {
        for (std::size_t i = i0; i < i1; ++i) dx[i] = mask[i] != 0 ? dy[i] * keep_scale : 0.0f;
    });
    return Status::ok();
}

// ---- Loss and metrics ------------------------------------------------------------------------

Status CpuCompute::softmax_cross_entropy_forward(const float* logits, const std::int32_t* labels,
                                                 std::size_t rows, std::size_t classes,
                                                 float* probs, float* loss, StreamId stream) {
    ZINF_ASSERT_GT(rows, 0u);
    ZINF_ASSERT_GT(classes, 0u);
    ZINF_TRY(wait_stream(stream));
    // Per-tile loss sums, then tiles in order: a fixed summation order for every thread count.
    std::array<double, kReduceBatchTiles> partials{};
    double total = 0;
    const std::size_t batch_rows = kReduceBatchTiles * kRowTileRows;
    for (std::size_t base = 0; base < rows; base += batch_rows) {
        const std::size_t count = std::min(batch_rows, rows - base);
        parallel_tiles(count, kRowTileRows, [&](std::size_t r0, std::size_t r1) {
            double tile_sum = 0;
            for (std::size_t r = base + r0; r < base + r1; ++r) {
                const float* lr = logits + r * classes;
                const std::int32_t label = labels[r];
                ZINF_ASSERT_GE(label, 0);
                ZINF_ASSERT_LT(static_cast<std::size_t>(label), classes);
                float max_logit = lr[0];
                for (std::size_t c = 1; c < classes; ++c) max_logit = std::max(max_logit, lr[c]);
                float* pr = probs + r * classes;
                exp_shifted_loop(lr, pr, classes, max_logit);
                double sum = 0;
                for (std::size_t c = 0; c < classes; ++c) sum += pr[c];
                const double inv_sum = 1.0 / sum;
                for (std::size_t c = 0; c < classes; ++c) {
                    pr[c] = static_cast<float>(pr[c] * inv_sum);
                }
                tile_sum += std::log(sum) - static_cast<double>(lr[label] - max_logit);
            }
            partials[r0 / kRowTileRows] = tile_sum;
        });
        const std::size_t tiles = ceil_div(count, kRowTileRows);
        for (std::size_t t = 0; t < tiles; ++t) total += partials[t];
    }
    *loss = static_cast<float>(total / static_cast<double>(rows));
    return Status::ok();
}

Status CpuCompute::softmax_cross_entropy_backward(const float* probs, const std::int32_t* labels,
                                                  std::size_t rows, std::size_t classes,
                                                  float grad_scale, float* dlogits,
                                                  StreamId stream) {
    ZINF_ASSERT_GT(rows, 0u);
    ZINF_TRY(wait_stream(stream));
    const float row_scale = grad_scale / static_cast<float>(rows);
    parallel_tiles(rows, kRowTileRows, [&](std::size_t r0, std::size_t r1) {
        for (std::size_t r = r0; r < r1; ++r) {
            const std::int32_t label = labels[r];
            ZINF_ASSERT_GE(label, 0);
            ZINF_ASSERT_LT(static_cast<std::size_t>(label), classes);
            const float* pr = probs + r * classes;
            float* dr = dlogits + r * classes;
            for (std::size_t c = 0; c < classes; ++c) {
                const float target = c == static_cast<std::size_t>(label) ? 1.0f : 0.0f;
                dr[c] = (pr[c] - target) * row_scale;
            }
        }
    });
    return Status::ok();
}

Status CpuCompute::count_correct(const float* logits, const std::int32_t* labels, std::size_t rows,
                                 std::size_t classes, std::uint64_t* correct_count, bool accumulate,
                                 StreamId stream) {
    ZINF_ASSERT_GT(classes, 0u);
    ZINF_TRY(wait_stream(stream));
    std::array<std::uint64_t, kReduceBatchTiles> partials{};
    std::uint64_t total = 0;
    const std::size_t batch_rows = kReduceBatchTiles * kRowTileRows;
    for (std::size_t base = 0; base < rows; base += batch_rows) {
        const std::size_t count = std::min(batch_rows, rows - base);
        parallel_tiles(count, kRowTileRows, [&](std::size_t r0, std::size_t r1) {
            std::uint64_t correct = 0;
            for (std::size_t r = base + r0; r < base + r1; ++r) {
                const float* lr = logits + r * classes;
                std::size_t best = 0;
                for (std::size_t c = 1; c < classes; ++c) {
                    if (lr[c] > lr[best]) best = c;
                }
                if (labels[r] >= 0 && best == static_cast<std::size_t>(labels[r])) ++correct;
            }
            partials[r0 / kRowTileRows] = correct;
        });
        const std::size_t tiles = ceil_div(count, kRowTileRows);
        for (std::size_t t = 0; t < tiles; ++t) total += partials[t];
    }
    *correct_count = accumulate ? *correct_count + total : total;
    return Status::ok();
}

// ---- Embeddings and attention ----------------------------------------------------------------

Status CpuCompute::embedding_forward(const std::int32_t* tokens, const float* table,
                                     const float* positions, std::size_t rows, std::size_t period,
                                     std::size_t cols, std::size_t vocab, float* y,
                                     StreamId stream) {
    ZINF_ASSERT_GT(period, 0u);
    ZINF_TRY(wait_stream(stream));
    const std::size_t rows_per_tile = std::max<std::size_t>(1, kElementwiseTileNumel / cols);
    parallel_tiles(rows, rows_per_tile, [&](std::size_t r0, std::size_t r1) {
        for (std::size_t r = r0; r < r1; ++r) {
            const std::int32_t token = tokens[r];
            ZINF_ASSERT_GE(token, 0);
            ZINF_ASSERT_LT(static_cast<std::size_t>(token), vocab);
            const float* te = table + static_cast<std::size_t>(token) * cols;
            const float* pe = positions + (r % period) * cols;
            float* yr = y + r * cols;
            for (std::size_t c = 0; c < cols; ++c) yr[c] = te[c] + pe[c];
        }
    });
    return Status::ok();
}

Status CpuCompute::embedding_backward(const std::int32_t* tokens, const float* dy, std::size_t rows,
                                      std::size_t period, std::size_t cols, std::size_t vocab,
                                      float* grad_table, float* grad_positions, StreamId stream) {
    ZINF_ASSERT_GT(period, 0u);
    ZINF_TRY(wait_stream(stream));
    // Tiles of columns, rows in order inside each: the same sums for every thread count (and the
    // order the CUDA kernel uses).
    parallel_tiles(cols, kColumnTileCols, [&](std::size_t c0, std::size_t c1) {
        for (std::size_t t = 0; t < period; ++t) {
            std::fill(grad_positions + t * cols + c0, grad_positions + t * cols + c1, 0.0f);
        }
        for (std::size_t r = 0; r < rows; ++r) {
            const std::int32_t token = tokens[r];
            ZINF_ASSERT_GE(token, 0);
            ZINF_ASSERT_LT(static_cast<std::size_t>(token), vocab);
            const float* g = dy + r * cols;
            float* gt = grad_table + static_cast<std::size_t>(token) * cols;
            float* gp = grad_positions + (r % period) * cols;
            for (std::size_t c = c0; c < c1; ++c) {
                gp[c] += g[c];
                gt[c] += g[c];
            }
        }
    });
    return Status::ok();
}

Status CpuCompute::causal_softmax_forward(float* s, std::size_t n, std::size_t ld,
                                          StreamId stream) {
    ZINF_ASSERT_GE(ld, n);
    ZINF_TRY(wait_stream(stream));
    parallel_tiles(n, kRowTileRows, [&](std::size_t r0, std::size_t r1) {
        for (std::size_t i = r0; i < r1; ++i) {
            float* row = s + i * ld;
            float row_max = row[0];
            for (std::size_t j = 1; j <= i; ++j) row_max = std::max(row_max, row[j]);
            exp_shifted_loop(row, row, i + 1, row_max);
            double sum = 0;
            for (std::size_t j = 0; j <= i; ++j) sum += row[j];
            const double inv_sum = 1.0 / sum;
            for (std::size_t j = 0; j <= i; ++j) row[j] = static_cast<float>(row[j] * inv_sum);
            std::fill(row + i + 1, row + n, 0.0f);
        }
    });
    return Status::ok();
}

Status CpuCompute::causal_softmax_backward(const float* p, float* dp, std::size_t n, std::size_t ld,
                                           StreamId stream) {
    ZINF_ASSERT_GE(ld, n);
    ZINF_TRY(wait_stream(stream));
    parallel_tiles(n, kRowTileRows, [&](std::size_t r0, std::size_t r1) {
        for (std::size_t i = r0; i < r1; ++i) {
            const float* pr = p + i * ld;
            float* dr = dp + i * ld;
            double dot = 0;
            for (std::size_t j = 0; j <= i; ++j) {
                dot += static_cast<double>(pr[j]) * static_cast<double>(dr[j]);
            }
            const float d = static_cast<float>(dot);
            for (std::size_t j = 0; j <= i; ++j) dr[j] = pr[j] * (dr[j] - d);
            std::fill(dr + i + 1, dr + n, 0.0f);
        }
    });
    return Status::ok();
}

// ---- Vector operations -----------------------------------------------------------------------

Status CpuCompute::scale(float* x, std::size_t numel, float alpha, StreamId stream) {
    ZINF_TRY(wait_stream(stream));
    parallel_tiles(numel, kElementwiseTileNumel, [&](std::size_t i0, std::size_t i1) {
        for (std::size_t i = i0; i < i1; ++i) x[i] *= alpha;
    });
    return Status::ok();
}

Status CpuCompute::axpy(float alpha, const float* x, float* y, std::size_t numel, StreamId stream) {
    ZINF_TRY(wait_stream(stream));
    parallel_tiles(numel, kElementwiseTileNumel, [&](std::size_t i0, std::size_t i1) {
        for (std::size_t i = i0; i < i1; ++i) {
            const float product = alpha * x[i];  // a separate rounding: see Compute::axpy
            y[i] += product;
        }
    });
    return Status::ok();
}

// Conversions run the kernels library's cast variant per tile (kernels/cast.h defines each
// rounding; every variant matches it bit for bit).
Status CpuCompute::cast(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                        std::size_t numel, StreamId stream) {
    ZINF_TRY(wait_stream(stream));
    if (numel == 0) return Status::ok();
    ZINF_ASSERT(src != nullptr);
    ZINF_ASSERT(dst != nullptr);
    const kernels::Isa isa = impl_->isa;
    if (src_dtype == dst_dtype) {
        const std::size_t element_bytes = dtype_size_bytes(src_dtype);
        parallel_tiles(numel, kElementwiseTileNumel, [&](std::size_t i0, std::size_t i1) {
            std::memcpy(static_cast<std::byte*>(dst) + i0 * element_bytes,
                        static_cast<const std::byte*>(src) + i0 * element_bytes,
                        (i1 - i0) * element_bytes);
        });
        return Status::ok();
    }
    if (src_dtype == DType::kFloat32) {
        const auto* in = static_cast<const float*>(src);
        auto* out = static_cast<std::uint16_t*>(dst);
        const DType to = dst_dtype;
        parallel_tiles(numel, kElementwiseTileNumel, [&](std::size_t i0, std::size_t i1) {
            kernels::cast_from_fp32(isa, {in + i0, i1 - i0}, {out + i0, i1 - i0}, to);
        });
        return Status::ok();
    }
    if (dst_dtype == DType::kFloat32) {
        const auto* in = static_cast<const std::uint16_t*>(src);
        auto* out = static_cast<float*>(dst);
        const DType from = src_dtype;
        parallel_tiles(numel, kElementwiseTileNumel, [&](std::size_t i0, std::size_t i1) {
            kernels::cast_to_fp32(isa, {in + i0, i1 - i0}, from, {out + i0, i1 - i0});
        });
        return Status::ok();
    }
    // bf16 <-> fp16 through fp32, which holds every value of both exactly (rare: scalar).
    const auto* in = static_cast<const std::uint16_t*>(src);
    auto* out = static_cast<std::uint16_t*>(dst);
    const bool to_fp16 = dst_dtype == DType::kFloat16;
    parallel_tiles(numel, kElementwiseTileNumel, [&](std::size_t i0, std::size_t i1) {
        for (std::size_t i = i0; i < i1; ++i) {
            out[i] = to_fp16 ? kernels::float_to_fp16(kernels::bf16_to_float(in[i]))
                             : kernels::float_to_bf16(kernels::fp16_to_float(in[i]));
        }
    });
    return Status::ok();
}

Status CpuCompute::sum_squares(const float* x, std::size_t numel, SumSquares* out, bool accumulate,
                               StreamId stream) {
    ZINF_ASSERT(out != nullptr);
    ZINF_TRY(wait_stream(stream));
    std::array<SumSquares, kReduceBatchTiles> partials{};
    SumSquares total;
    const std::size_t batch_numel = kReduceBatchTiles * kElementwiseTileNumel;
    for (std::size_t base = 0; base < numel; base += batch_numel) {
        const std::size_t count = std::min(batch_numel, numel - base);
        parallel_tiles(count, kElementwiseTileNumel, [&](std::size_t i0, std::size_t i1) {
            SumSquares tile;
            for (std::size_t i = base + i0; i < base + i1; ++i) {
                const double v = x[i];
                tile.sum_squares += v * v;
                if (!std::isfinite(x[i])) ++tile.nonfinite_count;
            }
            partials[i0 / kElementwiseTileNumel] = tile;
        });
        const std::size_t tiles = ceil_div(count, kElementwiseTileNumel);
        for (std::size_t t = 0; t < tiles; ++t) {
            total.sum_squares += partials[t].sum_squares;
            total.nonfinite_count += partials[t].nonfinite_count;
        }
    }
    if (accumulate) {
        out->sum_squares += total.sum_squares;
        out->nonfinite_count += total.nonfinite_count;
    } else {
        *out = total;
    }
    return Status::ok();
}

}  // namespace zinf::device
