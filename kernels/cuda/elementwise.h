// Elementwise and small-reduction CUDA kernels that the model's modules and the engine's step
// need: activations, bias, scaling, dropout and the gradient norm / overflow check. They follow
// the semantics of src/base/compute.h (CudaCompute is a thin layer over them): fp32 tensors,
// row-major [rows x cols], results deterministic run to run (fixed reduction order, no
// floating-point atomics). Every function is asynchronous on `stream`, launches nothing for
// empty input, neither blocks nor allocates, asserts its pointers and returns kCuda when a launch
// fails (a sticky error from earlier work shows there too).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/stream.h"
#include "src/base/compute.h"
#include "src/base/status.h"

namespace zinf::kernels::cuda {

// Device memory the reductions keep partial results in, so that they sum in a fixed order
// without allocating. One scratch serves one stream at a time.
struct ReduceScratch {
    void* data = nullptr;
    std::size_t size_bytes = 0;
};
// What sum_squares needs (one partial per block of its grid); softmax_xent_forward works with
// any size of at least this, in chunks of rows.
constexpr std::size_t kReduceScratchBytesMin = 8192 * 16 + 64;

// y = max(x, 0). In place allowed (y == x).
Status relu_forward(const float* x, float* y, std::size_t numel, Stream stream);
// dx = dy where x > 0, else 0. `x` is the forward input. In place allowed (dx == dy).
Status relu_backward(const float* x, const float* dy, float* dx, std::size_t numel, Stream stream);

// GELU, tanh approximation (PyTorch's approximate="tanh"), as compute.h defines it. In place
// allowed.
Status gelu_forward(const float* x, float* y, std::size_t numel, Stream stream);
Status gelu_backward(const float* x, const float* dy, float* dx, std::size_t numel, Stream stream);

// y[r, c] += bias[c] for a row-major y of rows x cols.
Status bias_add(float* y, const float* bias, std::size_t rows, std::size_t cols, Stream stream);
// dbias[c] = sum over r of dy[r, c] in double (overwrites dbias); fixed order.
Status bias_grad(const float* dy, std::size_t rows, std::size_t cols, float* dbias, Stream stream);

// x *= alpha, in place.
Status scale(float* x, std::size_t numel, float alpha, Stream stream);
// c[r, ld * r + col] = beta * c[...] for a rows x cols matrix with row stride ld >= cols; beta 0
// writes zeros (NaN and infinity in c vanish, as BLAS does for beta 0). GEMM's k == 0 case.
Status scale_matrix(float* c, std::size_t rows, std::size_t cols, std::size_t ld, float beta,
                    Stream stream);
// y += alpha * x, one multiply and one add (not fused), as compute.h asks.
Status axpy(float alpha, const float* x, float* y, std::size_t numel, Stream stream);

// out->sum_squares = sum of x*x in double (inf/NaN when any x is), out->nonfinite_count = the
// number of inf/NaN elements; `out` is device memory, written, or added to when accumulate.
// Per-block partials go to `scratch` (>= kReduceScratchBytesMin) and are summed in block order.
Status sum_squares(const float* x, std::size_t numel, SumSquares* out, bool accumulate,
                   ReduceScratch scratch, Stream stream);

// Inverted dropout with the mask of src/base/philox.h: element i is kept when
// philox::dropout_keep(seed, step, i, philox::dropout_threshold(p)); then y = x * (1/(1-p)),
// else 0; mask[i] = kept. Bitwise the same as every other implementation. 0 <= p < 1.
Status dropout_forward(const float* x, float* y, std::uint8_t* mask, std::size_t numel, float p,
                       std::uint64_t seed, std::uint64_t step, Stream stream);
// dx = mask ? dy * (1/(1-p)) : 0. In place allowed (dx == dy).
Status dropout_backward(const float* dy, const std::uint8_t* mask, float* dx, std::size_t numel,
                        float p, Stream stream);

}  // namespace zinf::kernels::cuda
