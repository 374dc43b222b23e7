// Softmax cross-entropy over the classes of row-major fp32 logits [rows x classes], forward and
// backward, and the accuracy count, on the GPU, with the semantics of src/base/compute.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/stream.h"
#include "src/base/status.h"

namespace zinf::kernels::cuda {

// probs = softmax of each row; *loss (one device float) = mean over rows of
// logsumexp(row) - row[label], each row's loss in double, summed in double in a fixed order
// through `scratch` (>= kReduceScratchBytesMin; rows beyond its capacity go in chunks). A label
// outside [0, classes) makes that row's loss, and so *loss, NaN: a bad batch shows in the loss
// instead of reading out of bounds (the CPU asserts instead). rows >= 1 and classes >= 1
// (asserted). Asynchronous on `stream`.
Status softmax_xent_forward(const float* logits, const std::int32_t* labels, std::size_t rows,
                            std::size_t classes, float* probs, float* loss, ReduceScratch scratch,
                            Stream stream);

// dlogits = (probs - onehot(label)) * (grad_scale / rows). In place allowed (dlogits == probs).
Status softmax_xent_backward(const float* probs, const std::int32_t* labels, std::size_t rows,
                             std::size_t classes, float grad_scale, float* dlogits, Stream stream);

// Counts rows whose argmax (first index of the maximum) equals the label into *correct_count
// (device memory), written, or added to when accumulate. Integer counts: order-independent.
Status count_correct(const float* logits, const std::int32_t* labels, std::size_t rows,
                     std::size_t classes, std::uint64_t* correct_count, bool accumulate,
                     Stream stream);

}  // namespace zinf::kernels::cuda
