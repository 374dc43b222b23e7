// CUDA casts between fp32 and the 16-bit types (bf16, fp16) of parameters and gradients.
// Rounding is to nearest, ties to even; bit-exact with the CPU casts (kernels/cast.h) for every
// input, NaN signs and payloads included.
#pragma once

#include <cstddef>

#include "kernels/cuda/stream.h"
#include "src/base/dtype.h"
#include "src/base/status.h"

namespace zinf::kernels::cuda {

// Converts `numel` elements of `src` (dtype `src_dtype`) into `dst` (dtype `dst_dtype`), both
// device memory, asynchronously on `stream`. Same-dtype casts are copies. src and dst must not
// overlap unless equal with the same element size. numel 0 launches nothing. Returns kCuda when
// the launch fails (a sticky error from earlier work shows here too). Does not block or allocate.
Status cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t numel,
            Stream stream);

}  // namespace zinf::kernels::cuda
