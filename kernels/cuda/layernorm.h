// LayerNorm over the last dimension of a row-major [rows x cols] fp32 tensor, forward and
// backward, on the GPU: y = (x - mean) * rstd * gamma + beta, rstd = 1 / sqrt(var + eps), with
// the biased variance (as torch.nn.LayerNorm). Semantics of src/base/compute.h: row statistics
// and parameter gradients accumulate in double, in a fixed order.
#pragma once

#include <cstddef>

#include "kernels/cuda/stream.h"
#include "src/base/status.h"

namespace zinf::kernels::cuda {

// Writes y and, for the backward pass, mean[rows] and rstd[rows]. gamma and beta have cols
// elements. Asynchronous on `stream`; nothing for rows == 0; cols >= 1 (asserted). Does not block
// or allocate; returns kCuda when a launch fails.
Status layernorm_forward(const float* x, const float* gamma, const float* beta, float* y,
                         float* mean, float* rstd, std::size_t rows, std::size_t cols, float eps,
                         Stream stream);

// From dy and the forward's x, gamma, mean and rstd: writes dx [rows x cols] (skipped when dx is
// null), and dgamma and dbeta [cols] (overwritten, summed over rows in a fixed order).
Status layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                          const float* rstd, float* dx, float* dgamma, float* dbeta,
                          std::size_t rows, std::size_t cols, Stream stream);

}  // namespace zinf::kernels::cuda
