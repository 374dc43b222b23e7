// LayerNorm kernels: one block per row for the row statistics, y and dx (two passes over the
// row, which stays in L1/L2 for the widths a layer has); a column-parallel kernel for dgamma and
// dbeta.
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/detail/launch.cuh"
#include "kernels/cuda/layernorm.h"

namespace zinf::kernels::cuda {
namespace {

// Rows beyond the grid's y limit are covered by striding.
constexpr std::size_t kRowBlocksMax = 65535;

__global__ void layernorm_forward_kernel(const float* x, const float* gamma, const float* beta,
                                         float* y, float* mean_out, float* rstd_out,
                                         std::size_t rows, std::size_t cols, float eps) {
    __shared__ double scratch[32];
    for (std::size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* xr = x + row * cols;
        double sum = 0.0;
        for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) sum += xr[c];
        const double mean = detail::block_sum(sum, scratch) / static_cast<double>(cols);
        // Second pass over the centred values: no cancellation when |mean| >> stddev.
        double sq = 0.0;
        for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) {
            const double d = xr[c] - mean;
            sq += d * d;
        }
        const double var = detail::block_sum(sq, scratch) / static_cast<double>(cols);
        // y uses the saved fp32 statistics, so that backward sees exactly what forward used.
        const auto mean_f = static_cast<float>(mean);
        const auto rstd_f = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
        float* yr = y + row * cols;
        for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) {
            yr[c] = (xr[c] - mean_f) * rstd_f * gamma[c] + beta[c];
        }
        if (threadIdx.x == 0) {
            mean_out[row] = mean_f;
            rstd_out[row] = rstd_f;
        }
    }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), with g = dy * gamma.
__global__ void layernorm_backward_dx_kernel(const float* dy, const float* x, const float* gamma,
                                             const float* mean, const float* rstd, float* dx,
                                             std::size_t rows, std::size_t cols) {
    __shared__ double scratch[32];
    for (std::size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* dyr = dy + row * cols;
        const float* xr = x + row * cols;
        const float m = mean[row];
        const float rs = rstd[row];
        double sum_g = 0.0;
        double sum_gx = 0.0;
        for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) {
            const float g = dyr[c] * gamma[c];
            sum_g += g;
            sum_gx += static_cast<double>(g) * ((xr[c] - m) * rs);
        }
        const auto mean_g =
            static_cast<float>(detail::block_sum(sum_g, scratch) / static_cast<double>(cols));
        const auto mean_gx =
            static_cast<float>(detail::block_sum(sum_gx, scratch) / static_cast<double>(cols));
        float* dxr = dx + row * cols;
        for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) {
            const float xhat = (xr[c] - m) * rs;
            const float g = dyr[c] * gamma[c];
            dxr[c] = rs * (g - mean_g - xhat * mean_gx);
        }
    }
}

constexpr unsigned int kParamCols = 32;
constexpr unsigned int kParamRowPhases = 8;

__global__ void layernorm_backward_params_kernel(const float* dy, const float* x, const float* mean,
                                                 const float* rstd, float* dgamma, float* dbeta,
                                                 std::size_t rows, std::size_t cols) {
    __shared__ double partial_gamma[kParamRowPhases][kParamCols];
    __shared__ double partial_beta[kParamRowPhases][kParamCols];
    const std::size_t col = static_cast<std::size_t>(blockIdx.x) * kParamCols + threadIdx.x;
    double sum_gamma = 0.0;
    double sum_beta = 0.0;
    if (col < cols) {
        for (std::size_t r = threadIdx.y; r < rows; r += kParamRowPhases) {
            const float g = dy[r * cols + col];
            const float xhat = (x[r * cols + col] - mean[r]) * rstd[r];
            sum_gamma += static_cast<double>(g) * xhat;
            sum_beta += g;
        }
    }
    partial_gamma[threadIdx.y][threadIdx.x] = sum_gamma;
    partial_beta[threadIdx.y][threadIdx.x] = sum_beta;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        double total_gamma = 0.0;
        double total_beta = 0.0;
        for (unsigned int p = 0; p < kParamRowPhases; ++p) {
            total_gamma += partial_gamma[p][threadIdx.x];
            total_beta += partial_beta[p][threadIdx.x];
        }
        dgamma[col] = static_cast<float>(total_gamma);
        dbeta[col] = static_cast<float>(total_beta);
    }
}

unsigned int row_blocks(std::size_t rows) {
    return static_cast<unsigned int>(rows < kRowBlocksMax ? rows : kRowBlocksMax);
}

}  // namespace

Status layernorm_forward(const float* x, const float* gamma, const float* beta, float* y,
                         float* mean, float* rstd, std::size_t rows, std::size_t cols, float eps,
                         Stream stream) {
    if (rows == 0) return Status::ok();
    ZINF_ASSERT_GE(cols, std::size_t{1});
    ZINF_ASSERT(x != nullptr);
    ZINF_ASSERT(gamma != nullptr);
    ZINF_ASSERT(beta != nullptr);
    ZINF_ASSERT(y != nullptr);
    ZINF_ASSERT(mean != nullptr);
    ZINF_ASSERT(rstd != nullptr);
    layernorm_forward_kernel<<<row_blocks(rows), detail::kBlockThreads, 0, stream>>>(
        x, gamma, beta, y, mean, rstd, rows, cols, eps);
    ZINF_CUDA_TRY_LAUNCH("layernorm_forward_kernel");
    return Status::ok();
}

Status layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                          const float* rstd, float* dx, float* dgamma, float* dbeta,
                          std::size_t rows, std::size_t cols, Stream stream) {
    ZINF_ASSERT_GE(cols, std::size_t{1});
    ZINF_ASSERT(dgamma != nullptr);
    ZINF_ASSERT(dbeta != nullptr);
    if (rows == 0) {
        ZINF_CUDA_TRY(cudaMemsetAsync(dgamma, 0, cols * sizeof(float), stream));
        ZINF_CUDA_TRY(cudaMemsetAsync(dbeta, 0, cols * sizeof(float), stream));
        return Status::ok();
    }
    ZINF_ASSERT(dy != nullptr);
    ZINF_ASSERT(x != nullptr);
    ZINF_ASSERT(gamma != nullptr);
    ZINF_ASSERT(mean != nullptr);
    ZINF_ASSERT(rstd != nullptr);
    if (dx != nullptr) {
        layernorm_backward_dx_kernel<<<row_blocks(rows), detail::kBlockThreads, 0, stream>>>(
            dy, x, gamma, mean, rstd, dx, rows, cols);
        ZINF_CUDA_TRY_LAUNCH("layernorm_backward_dx_kernel");
    }
    const std::size_t blocks = (cols + kParamCols - 1) / kParamCols;
    ZINF_ASSERT_LE(blocks, std::size_t{0x7fffffff});
    layernorm_backward_params_kernel<<<static_cast<unsigned int>(blocks),
                                       dim3(kParamCols, kParamRowPhases), 0, stream>>>(
        dy, x, mean, rstd, dgamma, dbeta, rows, cols);
    ZINF_CUDA_TRY_LAUNCH("layernorm_backward_params_kernel");
    return Status::ok();
}

}  // namespace zinf::kernels::cuda
