// Flatten and unflatten of partitions on the GPU: many tensors packed into one contiguous flat
// buffer (the unit that is gathered, reduced, swapped and stepped) and unpacked again.
#pragma once

#include <cstddef>
#include <span>

#include "kernels/cuda/stream.h"
#include "src/base/dtype.h"
#include "src/base/status.h"

namespace zinf::kernels::cuda {

// One tensor of a flat buffer: `numel` elements at `tensor` (device memory) that live at element
// `offset_numel` of the flat buffer.
struct FlatSegment {
    void* tensor = nullptr;
    std::size_t offset_numel = 0;
    std::size_t numel = 0;
};

// Copies every segment's tensor into `flat` (device memory of `flat_numel` elements of `dtype`)
// at its offset, asynchronously on `stream`. Elements of `flat` that no segment covers (padding
// up to a multiple of the world size) are left as they are: zero them once with fill_zero.
// Segments must lie inside `flat` (asserted) and not overlap each other or `flat`. One launch
// per 32 segments; blocks and allocates nothing. Returns kCuda when a launch fails.
Status flatten(std::span<const FlatSegment> segments, void* flat, std::size_t flat_numel,
               DType dtype, Stream stream);

// The inverse: copies each segment's range of `flat` back into its tensor.
Status unflatten(const void* flat, std::size_t flat_numel, std::span<const FlatSegment> segments,
                 DType dtype, Stream stream);

}  // namespace zinf::kernels::cuda
