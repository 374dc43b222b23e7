// Embedding and causal-softmax kernels: a thread per column for the embedding sums (rows in
// order, as the CPU sums them), a block per row for the softmax.
#include <cmath>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/detail/launch.cuh"

namespace zinf::kernels::cuda {
namespace {

constexpr std::size_t kRowBlocksMax = 65535;

__global__ void embedding_forward_kernel(const std::int32_t* tokens, const float* table,
                                         const float* positions, std::size_t rows,
                                         std::size_t period, std::size_t cols, std::size_t vocab,
                                         float* y) {
    const std::size_t numel = rows * cols;
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < numel;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const std::size_t r = i / cols;
        const std::size_t c = i % cols;
        const std::int32_t token = tokens[r];
        const bool valid = token >= 0 && static_cast<std::size_t>(token) < vocab;
        y[i] = valid ? table[static_cast<std::size_t>(token) * cols + c] +
                           positions[(r % period) * cols + c]
                     : NAN;
    }
}

__global__ void embedding_backward_kernel(const std::int32_t* tokens, const float* dy,
                                          std::size_t rows, std::size_t period, std::size_t cols,
                                          std::size_t vocab, float* grad_table,
                                          float* grad_positions) {
    const std::size_t c = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
    if (c >= cols) return;
    for (std::size_t t = 0; t < period; ++t) grad_positions[t * cols + c] = 0.0f;
    for (std::size_t r = 0; r < rows; ++r) {
        const float g = dy[r * cols + c];
        grad_positions[(r % period) * cols + c] += g;
        const std::int32_t token = tokens[r];
        if (token >= 0 && static_cast<std::size_t>(token) < vocab) {
            grad_table[static_cast<std::size_t>(token) * cols + c] += g;
        }
    }
}

__global__ void causal_softmax_forward_kernel(float* s, std::size_t n, std::size_t ld) {
    __shared__ float scratch_max[32];
    __shared__ double scratch_sum[32];
    for (std::size_t i = blockIdx.x; i < n; i += gridDim.x) {
        float* row = s + i * ld;
        float local_max = -INFINITY;
        for (std::size_t j = threadIdx.x; j <= i; j += blockDim.x)
            local_max = fmaxf(local_max, row[j]);
        const float row_max = detail::block_max(local_max, scratch_max);
        double sum = 0.0;
        for (std::size_t j = threadIdx.x; j <= i; j += blockDim.x) {
            const float e = expf(row[j] - row_max);
            row[j] = e;
            sum += e;
        }
        sum = detail::block_sum(sum, scratch_sum);
        const double inv_sum = 1.0 / sum;
        for (std::size_t j = threadIdx.x; j < n; j += blockDim.x) {
            row[j] = j <= i ? static_cast<float>(row[j] * inv_sum) : 0.0f;
        }
    }
}

__global__ void causal_softmax_backward_kernel(const float* p, float* dp, std::size_t n,
                                               std::size_t ld) {
    __shared__ double scratch_sum[32];
    for (std::size_t i = blockIdx.x; i < n; i += gridDim.x) {
        const float* pr = p + i * ld;
        float* dr = dp + i * ld;
        double dot = 0.0;
        for (std::size_t j = threadIdx.x; j <= i; j += blockDim.x) {
            dot += static_cast<double>(pr[j]) * static_cast<double>(dr[j]);
        }
        dot = detail::block_sum(dot, scratch_sum);
        const float d = static_cast<float>(dot);
        for (std::size_t j = threadIdx.x; j < n; j += blockDim.x) {
            dr[j] = j <= i ? pr[j] * (dr[j] - d) : 0.0f;
        }
    }
}

unsigned int row_blocks(std::size_t n) {
    return static_cast<unsigned int>(n < kRowBlocksMax ? n : kRowBlocksMax);
}

}  // namespace

Status embedding_forward(const std::int32_t* tokens, const float* table, const float* positions,
                         std::size_t rows, std::size_t period, std::size_t cols, std::size_t vocab,
                         float* y, Stream stream) {
    ZINF_ASSERT_GT(period, std::size_t{0});
    if (rows == 0 || cols == 0) return Status::ok();
    ZINF_ASSERT(tokens != nullptr && table != nullptr && positions != nullptr && y != nullptr);
    embedding_forward_kernel<<<detail::grid_for(rows * cols), detail::kBlockThreads, 0, stream>>>(
        tokens, table, positions, rows, period, cols, vocab, y);
    ZINF_CUDA_TRY_LAUNCH("embedding_forward_kernel");
    return Status::ok();
}

Status embedding_backward(const std::int32_t* tokens, const float* dy, std::size_t rows,
                          std::size_t period, std::size_t cols, std::size_t vocab,
                          float* grad_table, float* grad_positions, Stream stream) {
    ZINF_ASSERT_GT(period, std::size_t{0});
    if (cols == 0) return Status::ok();
    ZINF_ASSERT(tokens != nullptr && dy != nullptr && grad_table != nullptr &&
                grad_positions != nullptr);
    const auto blocks =
        static_cast<unsigned int>((cols + detail::kBlockThreads - 1) / detail::kBlockThreads);
    embedding_backward_kernel<<<blocks, detail::kBlockThreads, 0, stream>>>(
        tokens, dy, rows, period, cols, vocab, grad_table, grad_positions);
    ZINF_CUDA_TRY_LAUNCH("embedding_backward_kernel");
    return Status::ok();
}

Status causal_softmax_forward(float* s, std::size_t n, std::size_t ld, Stream stream) {
    if (n == 0) return Status::ok();
    ZINF_ASSERT(s != nullptr);
    ZINF_ASSERT_GE(ld, n);
    causal_softmax_forward_kernel<<<row_blocks(n), detail::kBlockThreads, 0, stream>>>(s, n, ld);
    ZINF_CUDA_TRY_LAUNCH("causal_softmax_forward_kernel");
    return Status::ok();
}

Status causal_softmax_backward(const float* p, float* dp, std::size_t n, std::size_t ld,
                               Stream stream) {
    if (n == 0) return Status::ok();
    ZINF_ASSERT(p != nullptr && dp != nullptr);
    ZINF_ASSERT_GE(ld, n);
    causal_softmax_backward_kernel<<<row_blocks(n), detail::kBlockThreads, 0, stream>>>(p, dp, n,
                                                                                        ld);
    ZINF_CUDA_TRY_LAUNCH("causal_softmax_backward_kernel");
    return Status::ok();
}

}  // namespace zinf::kernels::cuda
