// Conversions between fp32 and the 16-bit types on the GPU with the CPU's results for every
// input (kernels/cast.h), NaNs included: the hardware conversions round like the CPU's but
// return one canonical NaN, where the CPU keeps the sign and the top payload bits. Private to
// kernels/cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace zinf::kernels::cuda::detail {

__device__ inline bool is_nan_bits(std::uint32_t bits) {
    return (bits & 0x7fffffffu) > 0x7f800000u;
}

// Exact for every input (a bf16 is the top half of an fp32), NaNs included.
__device__ inline float bf16_to_float(__nv_bfloat16 value) {
    return __uint_as_float(static_cast<std::uint32_t>(__bfloat16_as_ushort(value)) << 16);
}

__device__ inline __nv_bfloat16 float_to_bf16(float value) {
    const std::uint32_t bits = __float_as_uint(value);
    if (is_nan_bits(bits)) {
        return __ushort_as_bfloat16(static_cast<unsigned short>((bits >> 16) | 0x0040u));
    }
    return __float2bfloat16_rn(value);
}

// Exact; a NaN comes out quiet with its payload, as on the CPU.
__device__ inline float fp16_to_float(__half value) {
    const unsigned short h = __half_as_ushort(value);
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0) {
        const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
        return __uint_as_float(sign | 0x7fc00000u |
                               (static_cast<std::uint32_t>(h & 0x03ffu) << 13));
    }
    return __half2float(value);
}

__device__ inline __half float_to_fp16(float value) {
    const std::uint32_t bits = __float_as_uint(value);
    if (is_nan_bits(bits)) {
        const std::uint32_t sign = (bits >> 16) & 0x8000u;
        return __ushort_as_half(
            static_cast<unsigned short>(sign | 0x7e00u | (((bits & 0x7fffffffu) >> 13) & 0x3ffu)));
    }
    return __float2half_rn(value);
}

}  // namespace zinf::kernels::cuda::detail
