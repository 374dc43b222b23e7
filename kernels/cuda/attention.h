// The GPT model's kernels on the GPU, with the semantics of src/base/compute.h: token and
// position embeddings (forward, and backward into the two tables) and the causal softmax of one
// head's attention scores (forward in place, backward in place over the probabilities'
// gradient). Deterministic: every sum runs in a fixed order (no floating-point atomics).
// Asynchronous on `stream`; nothing launched for empty input; kCuda when a launch fails.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/stream.h"
#include "src/base/status.h"

namespace zinf::kernels::cuda {

// y[r, c] = table[tokens[r], c] + positions[r % period, c] for r < rows, c < cols. A token
// outside [0, vocab) writes NaN into its row (the CPU asserts instead).
Status embedding_forward(const std::int32_t* tokens, const float* table, const float* positions,
                         std::size_t rows, std::size_t period, std::size_t cols, std::size_t vocab,
                         float* y, Stream stream);
// grad_table[v, c] += sum over rows r with tokens[r] == v of dy[r, c], rows in order;
// grad_positions[t, c] = sum over rows r with r % period == t of dy[r, c], rows in order
// (overwritten). One thread per column: the order of the sums is the CPU's.
Status embedding_backward(const std::int32_t* tokens, const float* dy, std::size_t rows,
                          std::size_t period, std::size_t cols, std::size_t vocab,
                          float* grad_table, float* grad_positions, Stream stream);

// In place over an n x n matrix s with row stride ld: row i becomes the softmax of s[i, 0..i]
// (the max subtracted, the sum in double) and zeros above the diagonal.
Status causal_softmax_forward(float* s, std::size_t n, std::size_t ld, Stream stream);
// In place over dp: dp[i, j] = p[i, j] (dp[i, j] - sum_{k <= i} p[i, k] dp[i, k]) for j <= i,
// 0 above the diagonal; the row sum in double.
Status causal_softmax_backward(const float* p, float* dp, std::size_t n, std::size_t ld,
                               Stream stream);

}  // namespace zinf::kernels::cuda
