// Conversions between fp32 and the 16-bit float formats: bf16 rounded to nearest even with NaN
// kept NaN, and fp16 rounded to nearest even, bit-for-bit what F16C's VCVTPS2PH produces.
// The scalar functions here are the definition; the SIMD variants match them exactly.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>

#include "kernels/cpu_features.h"
#include "src/base/dtype.h"

namespace zinf::kernels {

inline std::uint32_t float_bits(float value) noexcept {
    std::uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
}

inline float bits_float(std::uint32_t bits) noexcept {
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

// Exact: every bf16 value is an fp32 value.
inline float bf16_to_float(std::uint16_t bf16) noexcept {
    return bits_float(static_cast<std::uint32_t>(bf16) << 16);
}

// Round to nearest, ties to even. Denormals are kept (no flush to zero, unlike
// VCVTNEPS2BF16, which is why the SIMD variants do not use it). A NaN stays a NaN of the same
// sign: adding the rounding bias could otherwise carry a NaN with only low payload bits into
// infinity, so NaNs are quietened and truncated instead.
inline std::uint16_t float_to_bf16(float value) noexcept {
    const std::uint32_t bits = float_bits(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
    }
    const std::uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<std::uint16_t>((bits + rounding_bias) >> 16);
}

// Exact: every fp16 value (denormals included) is an fp32 value. A NaN comes out quiet with its
// payload, as VCVTPH2PS returns it.
inline float fp16_to_float(std::uint16_t fp16) noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(fp16 & 0x8000u) << 16;
    const std::uint32_t exponent = (fp16 >> 10) & 0x1fu;
    std::uint32_t mantissa = fp16 & 0x3ffu;
    if (exponent == 0x1f) {
        const std::uint32_t quiet = mantissa != 0 ? 0x00400000u : 0u;
        return bits_float(sign | 0x7f800000u | quiet | (mantissa << 13));
    }
    if (exponent != 0) return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
    if (mantissa == 0) return bits_float(sign);
    // A denormal: normalise it. Its value is mantissa * 2^-24.
    std::uint32_t e = 113;
    while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --e;
    }
    return bits_float(sign | (e << 23) | ((mantissa & 0x3ffu) << 13));
}

// Round to nearest, ties to even, with fp16 denormals, overflow to infinity (from 65520 up) and
// NaN quietened with its top payload bits kept: what VCVTPS2PH with imm8 = 0 (nearest) returns.
inline std::uint16_t float_to_fp16(float value) noexcept {
    const std::uint32_t bits = float_bits(value);
    const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
    const std::uint32_t abs_bits = bits & 0x7fffffffu;
    if (abs_bits > 0x7f800000u) {
        return static_cast<std::uint16_t>(sign | 0x7e00u | ((abs_bits >> 13) & 0x3ffu));
    }
    if (abs_bits >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520
    if (abs_bits >= 0x38800000u) {
        // Normal in fp16 (>= 2^-14): rebias the exponent and round the 13 dropped bits; a
        // carry out of the mantissa correctly bumps the exponent.
        const std::uint32_t rebased = abs_bits - 0x38000000u;
        const std::uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
        return static_cast<std::uint16_t>(sign | (rounded >> 13));
    }
    if (abs_bits < 0x33000000u) return sign;  // below half the smallest denormal, 2^-25
    // Denormal in fp16: the result is round(|value| * 2^24) with the implicit bit made explicit.
    const std::uint32_t exponent = abs_bits >> 23;
    const std::uint32_t mantissa = (abs_bits & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exponent;  // 14..24 for exponents 102..112
    const std::uint32_t halfway = 1u << (shift - 1);
    const std::uint32_t remainder = mantissa & ((1u << shift) - 1u);
    std::uint32_t result = mantissa >> shift;
    if (remainder > halfway || (remainder == halfway && (result & 1u) != 0)) ++result;
    return static_cast<std::uint16_t>(sign | result);
}

// Converts src to dst, which is bf16 or fp16 (dst_dtype), with the `isa` variant's code.
// Preconditions: src.size() == dst.size(); dst_dtype is not kFp32; isa_supported(isa).
// Single-threaded, allocates nothing, any alignment. Results are identical for every variant.
void cast_from_fp32(Isa isa, std::span<const float> src, std::span<std::uint16_t> dst,
                    DType dst_dtype) noexcept;
// Converts src (bf16 or fp16, src_dtype) to fp32; exact. Same contract as cast_from_fp32.
void cast_to_fp32(Isa isa, std::span<const std::uint16_t> src, DType src_dtype,
                  std::span<float> dst) noexcept;

}  // namespace zinf::kernels
