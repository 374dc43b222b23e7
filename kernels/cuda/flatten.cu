// Flatten / unflatten: segments travel by value in the kernel's parameters (32 per launch, under
// the 4 KiB parameter limit), so no descriptor table has to be staged in device memory first.
#include <cstdint>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/detail/launch.cuh"
#include "kernels/cuda/flatten.h"

namespace zinf::kernels::cuda {
namespace {

constexpr std::size_t kSegmentsPerLaunch = 32;

struct SegmentBatch {
    void* tensor[kSegmentsPerLaunch];
    std::size_t offset_numel[kSegmentsPerLaunch];
    std::size_t numel[kSegmentsPerLaunch];
};
static_assert(sizeof(SegmentBatch) < 4096, "kernel parameters are limited to 4 KiB");

// blockIdx.y picks the segment; the x blocks stride over its elements.
template <typename T, bool kToFlat>
__global__ void flatten_kernel(SegmentBatch batch, T* flat) {
    const unsigned int s = blockIdx.y;
    T* tensor = static_cast<T*>(batch.tensor[s]);
    T* flat_part = flat + batch.offset_numel[s];
    const std::size_t numel = batch.numel[s];
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < numel;
         i += stride) {
        if constexpr (kToFlat) {
            flat_part[i] = tensor[i];
        } else {
            tensor[i] = flat_part[i];
        }
    }
}

template <typename T, bool kToFlat>
Status run(std::span<const FlatSegment> segments, T* flat, std::size_t flat_numel, Stream stream) {
    // Each launch takes the next kSegmentsPerLaunch non-empty segments; `s` walks the list once.
    for (std::size_t s = 0; s < segments.size();) {
        SegmentBatch batch{};
        std::size_t count = 0;
        std::size_t numel_max = 0;
        for (; s < segments.size() && count < kSegmentsPerLaunch; ++s) {
            const FlatSegment& seg = segments[s];
            ZINF_ASSERT_LE(seg.offset_numel, flat_numel);
            ZINF_ASSERT_LE(seg.numel, flat_numel - seg.offset_numel);
            if (seg.numel == 0) continue;
            ZINF_ASSERT(seg.tensor != nullptr);
            batch.tensor[count] = seg.tensor;
            batch.offset_numel[count] = seg.offset_numel;
            batch.numel[count] = seg.numel;
            numel_max = seg.numel > numel_max ? seg.numel : numel_max;
            ++count;
        }
        if (count == 0) continue;
        const dim3 grid(detail::grid_for(numel_max), static_cast<unsigned int>(count));
        flatten_kernel<T, kToFlat><<<grid, detail::kBlockThreads, 0, stream>>>(batch, flat);
        ZINF_CUDA_TRY_LAUNCH("flatten_kernel");
    }
    return Status::ok();
}

template <bool kToFlat>
Status dispatch(std::span<const FlatSegment> segments, void* flat, std::size_t flat_numel,
                DType dtype, Stream stream) {
    if (segments.empty()) return Status::ok();
    ZINF_ASSERT(flat != nullptr);
    if (dtype_size_bytes(dtype) == 4) {
        return run<std::uint32_t, kToFlat>(segments, static_cast<std::uint32_t*>(flat), flat_numel,
                                           stream);
    }
    ZINF_ASSERT_EQ(dtype_size_bytes(dtype), std::size_t{2});
    return run<std::uint16_t, kToFlat>(segments, static_cast<std::uint16_t*>(flat), flat_numel,
                                       stream);
}

}  // namespace

Status flatten(std::span<const FlatSegment> segments, void* flat, std::size_t flat_numel,
               DType dtype, Stream stream) {
    return dispatch<true>(segments, flat, flat_numel, dtype, stream);
}

Status unflatten(const void* flat, std::size_t flat_numel, std::span<const FlatSegment> segments,
                 DType dtype, Stream stream) {
    // The kernel only reads `flat` when unflattening; one kernel template serves both ways.
    return dispatch<false>(segments, const_cast<void*>(flat), flat_numel, dtype, stream);
}

}  // namespace zinf::kernels::cuda
