// Compute: the tensor operations the model's modules run, over device memory of a `Device`, each
// ordered on a stream. One implementation per device family (src/device/cpu_compute.h; CUDA
// next), one conformance suite (tests/model/compute_test.cc). Calls are made per tensor, never
// per element.
//
// Conventions shared by every operation:
// - Pointers are device memory of the Device the implementation was made for (host memory for
//   the CPU), fp32 unless stated, dense and row-major: a `rows x cols` matrix has element (r, c)
//   at r * cols + c. Inputs and outputs do not overlap unless an operation says so.
// - Work is ordered on `stream` after all work enqueued on it before; it may run asynchronously
//   (CUDA) or before the call returns (CPU). Outputs written to device memory (loss, counts,
//   sums) are read by the host with Device::copy_to_host on the same stream.
// - Results are deterministic: the same inputs give bitwise the same outputs on every run and
//   every thread count of one implementation. Reductions run in a fixed order (fixed tiles,
//   partial sums combined in tile order), never in the order threads finish. Different
//   implementations agree to rounding, except the random masks of dropout, which are bitwise
//   identical everywhere (src/base/philox.h defines them).
// - Shapes and pointers that break a precondition are programmer errors (asserted). The Status
//   returned reports operating errors only: a failed launch, a sticky device error, a failed
//   wait on the stream (kCuda, kInternal).
// - Thread-compatible: one thread issues the calls of one Compute at a time. Calls allocate
//   nothing on the device and nothing per element on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "src/base/device.h"
#include "src/base/dtype.h"
#include "src/base/status.h"

namespace zinf {

enum class Transpose : std::uint8_t { kNo, kYes };

// Device-memory output of Compute::sum_squares.
struct SumSquares {
    double sum_squares = 0;             // sum of x*x accumulated in double; inf/NaN if any x is
    std::uint64_t nonfinite_count = 0;  // elements that are inf or NaN
};

class Compute {
public:
    virtual ~Compute() = default;

    // "cpu (openblas 0.3.21, 2 threads)", "cuda:0".
    virtual std::string_view name() const noexcept = 0;

    // ---- Linear algebra -------------------------------------------------------------------
    // C = alpha * op(A) * op(B) + beta * C, all row-major. op(A) is m x k and op(B) is k x n.
    // trans_a == kNo: A is stored m x k with row stride lda >= k; kYes: A is stored k x m
    // (op(A) = A^T) with lda >= m. Likewise B: kNo stored k x n (ldb >= n), kYes stored n x k
    // (ldb >= k). C is m x n with ldc >= n. beta == 0 means C is not read (NaNs in it vanish).
    // k == 0 gives C = beta * C. In fp32 with fp32 accumulation.
    virtual Status gemm(Transpose trans_a, Transpose trans_b, std::size_t m, std::size_t n,
                        std::size_t k, float alpha, const float* a, std::size_t lda, const float* b,
                        std::size_t ldb, float beta, float* c, std::size_t ldc,
                        StreamId stream) = 0;

    // y[r, c] += bias[c] for a rows x cols matrix y.
    virtual Status bias_add(float* y, const float* bias, std::size_t rows, std::size_t cols,
                            StreamId stream) = 0;
    // grad_bias[c] = sum over r of dy[r, c] (accumulated in double, rows in order).
    virtual Status bias_grad(const float* dy, std::size_t rows, std::size_t cols, float* grad_bias,
                             StreamId stream) = 0;

    // ---- Activations ----------------------------------------------------------------------
    // y = max(x, 0). y may equal x.
    virtual Status relu_forward(const float* x, float* y, std::size_t numel, StreamId stream) = 0;
    // dx = x > 0 ? dy : 0 (the subgradient at 0 is 0, as in PyTorch). dx may equal dy.
    virtual Status relu_backward(const float* x, const float* dy, float* dx, std::size_t numel,
                                 StreamId stream) = 0;
    // GELU, tanh approximation (PyTorch's approximate="tanh"):
    //   y = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3).
    // y may equal x.
    virtual Status gelu_forward(const float* x, float* y, std::size_t numel, StreamId stream) = 0;
    // dx = dy * (0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2)).
    // dx may equal dy.
    virtual Status gelu_backward(const float* x, const float* dy, float* dx, std::size_t numel,
                                 StreamId stream) = 0;

    // ---- LayerNorm over the last dimension of a rows x cols matrix --------------------------
    // mean[r] = sum_c x / cols, var[r] = sum_c (x - mean)^2 / cols (biased, as in PyTorch),
    // rstd[r] = 1 / sqrt(var + eps), y = (x - mean) * rstd * gamma[c] + beta[c]. Row statistics
    // are accumulated in double; mean and rstd (rows floats each) are saved for backward.
    virtual Status layer_norm_forward(const float* x, const float* gamma, const float* beta,
                                      float eps, std::size_t rows, std::size_t cols, float* y,
                                      float* mean, float* rstd, StreamId stream) = 0;
    // With xhat = (x - mean) * rstd and g = dy * gamma:
    //   dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)),
    //   grad_gamma[c] = sum_r dy * xhat,  grad_beta[c] = sum_r dy  (overwritten, not added).
    // dx may be null when the input gradient is not needed.
    virtual Status layer_norm_backward(const float* x, const float* gamma, const float* mean,
                                       const float* rstd, const float* dy, std::size_t rows,
                                       std::size_t cols, float* dx, float* grad_gamma,
                                       float* grad_beta, StreamId stream) = 0;

    // ---- Dropout (inverted) -----------------------------------------------------------------
    // mask[i] = philox::dropout_keep(seed, step, i, philox::dropout_threshold(p)) ? 1 : 0,
    // y[i] = mask[i] ? x[i] * (1.0f / (1.0f - p)) : 0. Precondition 0 <= p < 1. The mask is a
    // pure function of (seed, step, i): identical on every implementation and thread count.
    // y may equal x.
    virtual Status dropout_forward(const float* x, float* y, std::uint8_t* mask, std::size_t numel,
                                   float p, std::uint64_t seed, std::uint64_t step,
                                   StreamId stream) = 0;
    // dx[i] = mask[i] ? dy[i] * (1.0f / (1.0f - p)) : 0. dx may equal dy.
    virtual Status dropout_backward(const float* dy, const std::uint8_t* mask, float* dx,
                                    std::size_t numel, float p, StreamId stream) = 0;

    // ---- Loss and metrics --------------------------------------------------------------------
    // Softmax over each row of logits (rows x classes), cross-entropy against labels (rows
    // int32 values in [0, classes)): writes probs (rows x classes) and *loss = the mean over
    // rows of (logsumexp(row) - row[label]), summed in double in row order. loss is one device
    // float. rows >= 1.
    virtual Status softmax_cross_entropy_forward(const float* logits, const std::int32_t* labels,
                                                 std::size_t rows, std::size_t classes,
                                                 float* probs, float* loss, StreamId stream) = 0;
    // d(loss * grad_scale)/d(logits) = (probs - onehot(label)) * grad_scale / rows. grad_scale
    // is 1 for plain training and the loss scale under fp16. dlogits may equal probs.
    virtual Status softmax_cross_entropy_backward(const float* probs, const std::int32_t* labels,
                                                  std::size_t rows, std::size_t classes,
                                                  float grad_scale, float* dlogits,
                                                  StreamId stream) = 0;
    // Counts rows whose argmax (the first index of the maximum) equals the label. Writes the
    // count to *correct_count, or adds it when accumulate.
    virtual Status count_correct(const float* logits, const std::int32_t* labels, std::size_t rows,
                                 std::size_t classes, std::uint64_t* correct_count, bool accumulate,
                                 StreamId stream) = 0;

    // ---- Embeddings and attention (the GPT model) -------------------------------------------
    // y[r, c] = table[tokens[r], c] + positions[r % period, c] for a rows x cols output: token
    // embedding plus learned position embedding, rows = sequences x period. tokens: rows int32
    // in [0, vocab) (the CPU asserts; CUDA writes NaN into a row with a bad token).
    virtual Status embedding_forward(const std::int32_t* tokens, const float* table,
                                     const float* positions, std::size_t rows, std::size_t period,
                                     std::size_t cols, std::size_t vocab, float* y,
                                     StreamId stream) = 0;
    // grad_table[v, c] += sum over rows r with tokens[r] == v of dy[r, c] (added: the table may
    // already hold another gradient of a tied weight), and grad_positions[t, c] = sum over rows
    // r with r % period == t of dy[r, c] (overwritten); both summed over rows in order.
    virtual Status embedding_backward(const std::int32_t* tokens, const float* dy, std::size_t rows,
                                      std::size_t period, std::size_t cols, std::size_t vocab,
                                      float* grad_table, float* grad_positions,
                                      StreamId stream) = 0;
    // Causal softmax of one head's n x n attention scores s (row stride ld >= n), in place:
    // row i becomes softmax(s[i, 0..i]) (the row maximum subtracted, the sum in double) and
    // s[i, j] = 0 for j > i. Scores are scaled beforehand (the GEMM's alpha).
    virtual Status causal_softmax_forward(float* s, std::size_t n, std::size_t ld,
                                          StreamId stream) = 0;
    // Its backward, in place over dp: dp[i, j] = p[i, j] (dp[i, j] - sum_{k <= i} p[i, k]
    // dp[i, k]) for j <= i (the sum in double), 0 for j > i. p is the forward's output.
    virtual Status causal_softmax_backward(const float* p, float* dp, std::size_t n, std::size_t ld,
                                           StreamId stream) = 0;

    // ---- Vector operations -------------------------------------------------------------------
    // x *= alpha.
    virtual Status scale(float* x, std::size_t numel, float alpha, StreamId stream) = 0;
    // y += alpha * x (one multiply and one add per element, not fused, so that every
    // implementation rounds the same way).
    virtual Status axpy(float alpha, const float* x, float* y, std::size_t numel,
                        StreamId stream) = 0;
    // dst = src converted between fp32, bf16 and fp16 (16-bit values as raw uint16 patterns).
    // Narrowing rounds to nearest even, keeps NaN a NaN and overflows fp16 to infinity; widening
    // is exact. src_dtype == dst_dtype copies.
    virtual Status cast(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                        std::size_t numel, StreamId stream) = 0;
    // Sum of squares (in double, fixed tiles combined in order) and the count of inf/NaN
    // elements of x, for gradient clipping and overflow checks. Writes *out, or adds to it
    // when accumulate (so one result can cover many tensors without a copy per tensor).
    virtual Status sum_squares(const float* x, std::size_t numel, SumSquares* out, bool accumulate,
                               StreamId stream) = 0;
};

}  // namespace zinf
