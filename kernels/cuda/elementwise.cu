// Elementwise CUDA kernels: grid-stride loops over fp32 tensors, plus the bias-gradient and
// sum-of-squares reductions. Memory-bound; each kernel reads and writes every element once.
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/detail/launch.cuh"
#include "kernels/cuda/elementwise.h"
#include "src/base/philox.h"

namespace zinf::kernels::cuda {
namespace {

#define ZINF_GRID_STRIDE(i, numel)                                                        \
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; \
         i < (numel); i += static_cast<std::size_t>(gridDim.x) * blockDim.x)

__global__ void relu_forward_kernel(const float* x, float* y, std::size_t numel) {
    ZINF_GRID_STRIDE(i, numel) {
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    }
}

__global__ void relu_backward_kernel(const float* x, const float* dy, float* dx,
                                     std::size_t numel) {
    ZINF_GRID_STRIDE(i, numel) {
        dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
    }
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

__global__ void gelu_forward_kernel(const float* x, float* y, std::size_t numel) {
    ZINF_GRID_STRIDE(i, numel) {
        const float v = x[i];
        const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
        y[i] = 0.5f * v * (1.0f + tanhf(u));
    }
}

__global__ void gelu_backward_kernel(const float* x, const float* dy, float* dx,
                                     std::size_t numel) {
    ZINF_GRID_STRIDE(i, numel) {
        const float v = x[i];
        const float t = tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
        const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
        dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
    }
}

__global__ void bias_add_kernel(float* y, const float* bias, std::size_t rows, std::size_t cols) {
    const std::size_t numel = rows * cols;
    ZINF_GRID_STRIDE(i, numel) {
        y[i] += bias[i % cols];
    }
}

// Block (32, 8): 32 columns per block, 8 row phases; each thread sums every 8th row of its column
// in double (reads coalesced across the warp), then the 8 partial sums are added in order.
constexpr unsigned int kBiasCols = 32;
constexpr unsigned int kBiasRowPhases = 8;

__global__ void bias_grad_kernel(const float* dy, float* dbias, std::size_t rows,
                                 std::size_t cols) {
    __shared__ double partial[kBiasRowPhases][kBiasCols];
    const std::size_t col = static_cast<std::size_t>(blockIdx.x) * kBiasCols + threadIdx.x;
    double sum = 0.0;
    if (col < cols) {
        for (std::size_t r = threadIdx.y; r < rows; r += kBiasRowPhases) sum += dy[r * cols + col];
    }
    partial[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        double total = 0.0;
        for (unsigned int p = 0; p < kBiasRowPhases; ++p) total += partial[p][threadIdx.x];
        dbias[col] = static_cast<float>(total);
    }
}

__global__ void scale_kernel(float* x, float alpha, std::size_t numel) {
    ZINF_GRID_STRIDE(i, numel) {
        x[i] *= alpha;
    }
}

__global__ void scale_matrix_kernel(float* c, std::size_t rows, std::size_t cols, std::size_t ld,
                                    float beta) {
    const std::size_t numel = rows * cols;
    ZINF_GRID_STRIDE(i, numel) {
        float& v = c[(i / cols) * ld + i % cols];
        v = beta == 0.0f ? 0.0f : beta * v;
    }
}

__global__ void axpy_kernel(float alpha, const float* x, float* y, std::size_t numel) {
    // Separate roundings (no FMA contraction), as compute.h asks of every implementation.
    ZINF_GRID_STRIDE(i, numel) {
        y[i] = __fadd_rn(__fmul_rn(alpha, x[i]), y[i]);
    }
}

struct SquaresPartial {
    double sum;
    unsigned long long nonfinite;
};

// Stage 1: each block writes the partial of its grid-stride share to partials[blockIdx.x].
__global__ void sum_squares_partial_kernel(const float* x, std::size_t numel,
                                           SquaresPartial* partials) {
    __shared__ double scratch_sum[32];
    __shared__ unsigned long long scratch_count[32];
    double sum = 0.0;
    unsigned long long count = 0;
    ZINF_GRID_STRIDE(i, numel) {
        const double v = x[i];
        sum += v * v;  // inf/NaN propagate into the sum, as compute.h asks
        if (!isfinite(v)) ++count;
    }
    sum = detail::block_sum(sum, scratch_sum);
    count = detail::block_sum(count, scratch_count);
    if (threadIdx.x == 0) partials[blockIdx.x] = SquaresPartial{sum, count};
}

// Stage 2: one block sums the partials in a fixed order and writes or adds the result.
__global__ void sum_squares_final_kernel(const SquaresPartial* partials, unsigned int count,
                                         SumSquares* out, bool accumulate) {
    __shared__ double scratch_sum[32];
    __shared__ unsigned long long scratch_count[32];
    double sum = 0.0;
    unsigned long long nonfinite = 0;
    for (unsigned int b = threadIdx.x; b < count; b += blockDim.x) {
        sum += partials[b].sum;
        nonfinite += partials[b].nonfinite;
    }
    sum = detail::block_sum(sum, scratch_sum);
    nonfinite = detail::block_sum(nonfinite, scratch_count);
    if (threadIdx.x == 0) {
        if (accumulate) {
            out->sum_squares += sum;
            out->nonfinite_count += nonfinite;
        } else {
            out->sum_squares = sum;
            out->nonfinite_count = nonfinite;
        }
    }
}

// One thread per group of four elements: one Philox call yields the words of its group, with
// the counter layout of philox::element_word.
__global__ void dropout_forward_kernel(const float* x, float* y, std::uint8_t* mask,
                                       std::size_t numel, std::uint32_t threshold, float keep_scale,
                                       std::uint64_t seed, std::uint64_t step) {
    const std::size_t groups = (numel + 3) / 4;
    const philox::Key key = philox::make_key(seed);
    ZINF_GRID_STRIDE(g, groups) {
        const philox::Counter words = philox::philox4x32_10(
            philox::Counter{{static_cast<std::uint32_t>(g), static_cast<std::uint32_t>(g >> 32),
                             static_cast<std::uint32_t>(step),
                             static_cast<std::uint32_t>(step >> 32)}},
            key);
#pragma unroll
        for (unsigned int k = 0; k < 4; ++k) {
            const std::size_t i = g * 4 + k;
            if (i < numel) {
                const bool keep = words.v[k] >= threshold;
                mask[i] = keep ? 1 : 0;
                y[i] = keep ? x[i] * keep_scale : 0.0f;
            }
        }
    }
}

__global__ void dropout_backward_kernel(const float* dy, const std::uint8_t* mask, float* dx,
                                        std::size_t numel, float inv_keep) {
    ZINF_GRID_STRIDE(i, numel) {
        dx[i] = mask[i] != 0 ? dy[i] * inv_keep : 0.0f;
    }
}

#undef ZINF_GRID_STRIDE

}  // namespace

Status relu_forward(const float* x, float* y, std::size_t numel, Stream stream) {
    if (numel == 0) return Status::ok();
    ZINF_ASSERT(x != nullptr);
    ZINF_ASSERT(y != nullptr);
    relu_forward_kernel<<<detail::grid_for(numel), detail::kBlockThreads, 0, stream>>>(x, y, numel);
    ZINF_CUDA_TRY_LAUNCH("relu_forward_kernel");
    return Status::ok();
}

Status relu_backward(const float* x, const float* dy, float* dx, std::size_t numel, Stream stream) {
    if (numel == 0) return Status::ok();
    ZINF_ASSERT(x != nullptr);
    ZINF_ASSERT(dy != nullptr);
    ZINF_ASSERT(dx != nullptr);
    relu_backward_kernel<<<detail::grid_for(numel), detail::kBlockThreads, 0, stream>>>(x, dy, dx,
                                                                                        numel);
    ZINF_CUDA_TRY_LAUNCH("relu_backward_kernel");
    return Status::ok();
}

Status gelu_forward(const float* x, float* y, std::size_t numel, Stream stream) {
    if (numel == 0) return Status::ok();
    ZINF_ASSERT(x != nullptr);
    ZINF_ASSERT(y != nullptr);
    gelu_forward_kernel<<<detail::grid_for(numel), detail::kBlockThreads, 0, stream>>>(x, y, numel);
    ZINF_CUDA_TRY_LAUNCH("gelu_forward_kernel");
    return Status::ok();
}

Status gelu_backward(const float* x, const float* dy, float* dx, std::size_t numel, Stream stream) {
    if (numel == 0) return Status::ok();
    ZINF_ASSERT(x != nullptr);
    ZINF_ASSERT(dy != nullptr);
    ZINF_ASSERT(dx != nullptr);
    gelu_backward_kernel<<<detail::grid_for(numel), detail::kBlockThreads, 0, stream>>>(x, dy, dx,
                                                                                        numel);
    ZINF_CUDA_TRY_LAUNCH("gelu_backward_kernel");
    return Status::ok();
}

Status bias_add(float* y, const float* bias, std::size_t rows, std::size_t cols, Stream stream) {
    if (rows == 0 || cols == 0) return Status::ok();
    ZINF_ASSERT(y != nullptr);
    ZINF_ASSERT(bias != nullptr);
    bias_add_kernel<<<detail::grid_for(rows * cols), detail::kBlockThreads, 0, stream>>>(
        y, bias, rows, cols);
    ZINF_CUDA_TRY_LAUNCH("bias_add_kernel");
    return Status::ok();
}

Status bias_grad(const float* dy, std::size_t rows, std::size_t cols, float* dbias, Stream stream) {
    if (cols == 0) return Status::ok();
    ZINF_ASSERT(dbias != nullptr);
    if (rows == 0) {
        ZINF_CUDA_TRY(cudaMemsetAsync(dbias, 0, cols * sizeof(float), stream));
        return Status::ok();
    }
    ZINF_ASSERT(dy != nullptr);
    const std::size_t blocks = (cols + kBiasCols - 1) / kBiasCols;
    ZINF_ASSERT_LE(blocks, std::size_t{0x7fffffff});
    bias_grad_kernel<<<static_cast<unsigned int>(blocks), dim3(kBiasCols, kBiasRowPhases), 0,
                       stream>>>(dy, dbias, rows, cols);
    ZINF_CUDA_TRY_LAUNCH("bias_grad_kernel");
    return Status::ok();
}

Status scale(float* x, std::size_t numel, float alpha, Stream stream) {
    if (numel == 0) return Status::ok();
    ZINF_ASSERT(x != nullptr);
    scale_kernel<<<detail::grid_for(numel), detail::kBlockThreads, 0, stream>>>(x, alpha, numel);
    ZINF_CUDA_TRY_LAUNCH("scale_kernel");
    return Status::ok();
}

Status scale_matrix(float* c, std::size_t rows, std::size_t cols, std::size_t ld, float beta,
                    Stream stream) {
    if (rows == 0 || cols == 0) return Status::ok();
    ZINF_ASSERT(c != nullptr);
    ZINF_ASSERT_GE(ld, cols);
    scale_matrix_kernel<<<detail::grid_for(rows * cols), detail::kBlockThreads, 0, stream>>>(
        c, rows, cols, ld, beta);
    ZINF_CUDA_TRY_LAUNCH("scale_matrix_kernel");
    return Status::ok();
}

Status axpy(float alpha, const float* x, float* y, std::size_t numel, Stream stream) {
    if (numel == 0) return Status::ok();
    ZINF_ASSERT(x != nullptr);
    ZINF_ASSERT(y != nullptr);
    axpy_kernel<<<detail::grid_for(numel), detail::kBlockThreads, 0, stream>>>(alpha, x, y, numel);
    ZINF_CUDA_TRY_LAUNCH("axpy_kernel");
    return Status::ok();
}

Status sum_squares(const float* x, std::size_t numel, SumSquares* out, bool accumulate,
                   ReduceScratch scratch, Stream stream) {
    ZINF_ASSERT(out != nullptr);
    ZINF_ASSERT(scratch.data != nullptr);
    ZINF_ASSERT_GE(scratch.size_bytes, kReduceScratchBytesMin);
    static_assert(detail::kGridBlocksMax * sizeof(SquaresPartial) <= kReduceScratchBytesMin);
    if (numel == 0) {
        if (!accumulate) ZINF_CUDA_TRY(cudaMemsetAsync(out, 0, sizeof(SumSquares), stream));
        return Status::ok();
    }
    ZINF_ASSERT(x != nullptr);
    auto* partials = static_cast<SquaresPartial*>(scratch.data);
    const unsigned int grid = detail::grid_for(numel);
    sum_squares_partial_kernel<<<grid, detail::kBlockThreads, 0, stream>>>(x, numel, partials);
    ZINF_CUDA_TRY_LAUNCH("sum_squares_partial_kernel");
    sum_squares_final_kernel<<<1, 1024, 0, stream>>>(partials, grid, out, accumulate);
    ZINF_CUDA_TRY_LAUNCH("sum_squares_final_kernel");
    return Status::ok();
}

Status dropout_forward(const float* x, float* y, std::uint8_t* mask, std::size_t numel, float p,
                       std::uint64_t seed, std::uint64_t step, Stream stream) {
    if (numel == 0) return Status::ok();
    ZINF_ASSERT(x != nullptr);
    ZINF_ASSERT(y != nullptr);
    ZINF_ASSERT(mask != nullptr);
    ZINF_ASSERT_GE(p, 0.0f);
    ZINF_ASSERT_LT(p, 1.0f);
    const float keep_scale = 1.0f / (1.0f - p);
    const std::size_t groups = (numel + 3) / 4;
    dropout_forward_kernel<<<detail::grid_for(groups), detail::kBlockThreads, 0, stream>>>(
        x, y, mask, numel, philox::dropout_threshold(p), keep_scale, seed, step);
    ZINF_CUDA_TRY_LAUNCH("dropout_forward_kernel");
    return Status::ok();
}

Status dropout_backward(const float* dy, const std::uint8_t* mask, float* dx, std::size_t numel,
                        float p, Stream stream) {
    if (numel == 0) return Status::ok();
    ZINF_ASSERT(dy != nullptr);
    ZINF_ASSERT(mask != nullptr);
    ZINF_ASSERT(dx != nullptr);
    ZINF_ASSERT_GE(p, 0.0f);
    ZINF_ASSERT_LT(p, 1.0f);
    const float inv_keep = 1.0f / (1.0f - p);
    dropout_backward_kernel<<<detail::grid_for(numel), detail::kBlockThreads, 0, stream>>>(
        dy, mask, dx, numel, inv_keep);
    ZINF_CUDA_TRY_LAUNCH("dropout_backward_kernel");
    return Status::ok();
}

}  // namespace zinf::kernels::cuda
