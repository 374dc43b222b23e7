// CUDA casts between fp32, bf16 and fp16: one grid-stride kernel per pair of types.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/cast.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/detail/half_bits.cuh"
#include "kernels/cuda/detail/launch.cuh"

namespace zinf::kernels::cuda {
namespace {

template <typename T>
__device__ inline float to_float(T value);
template <>
__device__ inline float to_float<float>(float value) {
    return value;
}
template <>
__device__ inline float to_float<__nv_bfloat16>(__nv_bfloat16 value) {
    return detail::bf16_to_float(value);
}
template <>
__device__ inline float to_float<__half>(__half value) {
    return detail::fp16_to_float(value);
}

template <typename T>
__device__ inline T from_float(float value);
template <>
__device__ inline float from_float<float>(float value) {
    return value;
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float value) {
    return detail::float_to_bf16(value);
}
template <>
__device__ inline __half from_float<__half>(float value) {
    return detail::float_to_fp16(value);
}

template <typename Src, typename Dst>
__global__ void cast_kernel(const Src* __restrict__ src, Dst* __restrict__ dst, std::size_t numel) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < numel;
         i += stride) {
        dst[i] = from_float<Dst>(to_float<Src>(src[i]));
    }
}

template <typename Src>
Status launch_from(const Src* src, void* dst, DType dst_dtype, std::size_t numel, Stream stream) {
    const unsigned int grid = detail::grid_for(numel);
    switch (dst_dtype) {
        case DType::kFloat32:
            cast_kernel<<<grid, detail::kBlockThreads, 0, stream>>>(src, static_cast<float*>(dst),
                                                                    numel);
            break;
        case DType::kBFloat16:
            cast_kernel<<<grid, detail::kBlockThreads, 0, stream>>>(
                src, static_cast<__nv_bfloat16*>(dst), numel);
            break;
        case DType::kFloat16:
            cast_kernel<<<grid, detail::kBlockThreads, 0, stream>>>(src, static_cast<__half*>(dst),
                                                                    numel);
            break;
    }
    ZINF_CUDA_TRY_LAUNCH("cast_kernel");
    return Status::ok();
}

}  // namespace

Status cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t numel,
            Stream stream) {
    if (numel == 0) return Status::ok();
    ZINF_ASSERT(src != nullptr);
    ZINF_ASSERT(dst != nullptr);
    if (src_dtype == dst_dtype) {
        if (src == dst) return Status::ok();
        ZINF_CUDA_TRY(cudaMemcpyAsync(dst, src, numel * dtype_size_bytes(src_dtype),
                                      cudaMemcpyDeviceToDevice, stream));
        return Status::ok();
    }
    switch (src_dtype) {
        case DType::kFloat32:
            return launch_from(static_cast<const float*>(src), dst, dst_dtype, numel, stream);
        case DType::kBFloat16:
            return launch_from(static_cast<const __nv_bfloat16*>(src), dst, dst_dtype, numel,
                               stream);
        case DType::kFloat16:
            return launch_from(static_cast<const __half*>(src), dst, dst_dtype, numel, stream);
    }
    return Status::invalid_argument("cast: unknown source dtype");
}

}  // namespace zinf::kernels::cuda
