// The element codes of compressed optimizer states (src/base/state_dtype.h), defined once here in
// scalar code: bf16 and int8 with stochastic rounding from hashed rounding words, the int8 code
// with one fp32 scale per block. The SIMD and CUDA variants reproduce these functions bit for
// bit; the span conversions at the end serve checkpoints, the swapper and tests.
//
// The int8 code (kernels/README.md, "Compressed optimizer states"): a magnitude code c in
// [0, c_max] stands for 0 (c = 0) or scale * f(c), f(c) the fp32 number whose bits are
// (c + K) << 20, K = 1016 - c_max: an exponent and three mantissa bits, so f(c_max) = 1 and each
// octave below holds eight codes, 1, 1.125, ..., 1.875 times its power of two (relative spacing
// 6.25-12.5 %), down to f(1) = 1.25 * 2^-16 (signed, c_max = 127, exp_avg) or 1.25 * 2^-32
// (unsigned, c_max = 255, exp_avg_sq and other never-negative moments) of the block's largest
// magnitude. Signed codes keep the sign in the int8's two's complement (-127..127). Like 8-bit
// Adam's dynamic-tree code (Dettmers et al., 2022: blockwise absmax, more codes near zero) and
// fp8, in a form where encoding and decoding are integer operations on the ratio's fp32 bits:
// decode is a shift, an add and a multiply by the scale; encode adds half a code (a conversion,
// round to nearest) or 16 random bits at the 20 dropped ones (the optimizer step, stochastic
// rounding: the upper code with probability the value's position between the two, exactly,
// so the expected stored value is the value's) and shifts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/cast.h"
#include "src/base/philox.h"
#include "src/base/state_dtype.h"

namespace zinf::kernels {

inline constexpr int kSignedCodeMax = 127;
inline constexpr int kUnsignedCodeMax = 255;

// K: the fp32 bits >> 20 of f(c) are c + K, f(c_max) = 1.0 (0x3f800000 >> 20 = 1016).
ZINF_HOST_DEVICE constexpr int code_bias(int code_max) noexcept {
    return 1016 - code_max;
}

// f(c) for a magnitude code c in (0, code_max] (exact).
inline float code_ratio(int c, int code_max) noexcept {
    return bits_float(static_cast<std::uint32_t>(c + code_bias(code_max)) << 20);
}

// The magnitude code of ratio r = |x| / scale with `add` (below 2^20) added to its bits before
// the 20 low bits are dropped, clamped to [0, code_max]: r >= 1 and NaN give code_max, r below
// the smallest code 0 (or 1 when the addition carries).
inline int encode_ratio_bits(float r, std::uint32_t add, int code_max) noexcept {
    const auto c = static_cast<int>((float_bits(r) + add) >> 20) - code_bias(code_max);
    return c < 0 ? 0 : (c > code_max ? code_max : c);
}

// Round to nearest (ties up, in the bits): the conversion's code.
inline int encode_ratio(float r, int code_max) noexcept {
    return encode_ratio_bits(r, 1u << 19, code_max);
}

// Stochastic rounding with random16 (its low 16 bits) at bits 4..19.
inline int encode_ratio_stochastic(float r, int code_max, std::uint32_t random16) noexcept {
    return encode_ratio_bits(r, (random16 & 0xffffu) << 4, code_max);
}

// One int8 element: `is_unsigned` for never-negative moments (OptimizerDescriptor's
// non_negative), whose sign is dropped. inv_scale is 1 / scale, or 0 when the scale is 0.
inline std::uint8_t int8_with_sign(int c, float x, bool is_unsigned) noexcept {
    if (is_unsigned || (float_bits(x) & 0x80000000u) == 0) return static_cast<std::uint8_t>(c);
    return static_cast<std::uint8_t>(-c);  // two's complement of the negative code
}
inline std::uint8_t encode_int8(float x, float inv_scale, bool is_unsigned) noexcept {
    const float magnitude = bits_float(float_bits(x) & 0x7fffffffu);
    return int8_with_sign(
        encode_ratio(magnitude * inv_scale, is_unsigned ? kUnsignedCodeMax : kSignedCodeMax), x,
        is_unsigned);
}
// The optimizer step's encode (random16: the element's 16 random bits).
inline std::uint8_t encode_int8_stochastic(float x, float inv_scale, bool is_unsigned,
                                           std::uint32_t random16) noexcept {
    const float magnitude = bits_float(float_bits(x) & 0x7fffffffu);
    return int8_with_sign(
        encode_ratio_stochastic(magnitude * inv_scale,
                                is_unsigned ? kUnsignedCodeMax : kSignedCodeMax, random16),
        x, is_unsigned);
}

inline float decode_int8(std::uint8_t code, float scale, bool is_unsigned) noexcept {
    if (is_unsigned) return code == 0 ? 0.0f : scale * code_ratio(code, kUnsignedCodeMax);
    // The code's two's-complement value (the signed code's byte).
    const int q = code < 128 ? static_cast<int>(code) : static_cast<int>(code) - 256;
    if (q == 0) return 0.0f;
    const float magnitude = scale * code_ratio(q < 0 ? -q : q, kSignedCodeMax);
    return q < 0 ? -magnitude : magnitude;
}

// A block's scale is the largest magnitude of its new values; a NaN anywhere gives the one quiet
// NaN 0x7fc00000 (so that every variant stores the same bits). Its inverse for encode_int8: 0
// unless the scale is a finite normal number, so a block of zeros (or of denormals only, or with
// an infinity) encodes without dividing by zero, and its finite values as code 0.
inline constexpr std::uint32_t kCanonicalNanBits = 0x7fc00000u;
inline float int8_inverse_scale(float scale) noexcept {
    return scale >= 0x1p-126f && scale <= 0x1.fffffep+127f ? 1.0f / scale : 0.0f;
}

// bf16 with stochastic rounding: the 16 dropped bits plus a uniform 16-bit random number carry
// into the kept ones with probability (dropped / 2^16), so E[result] = x exactly for every finite
// x (denormals included). A NaN stays a quiet NaN of the same sign, as in float_to_bf16.
inline std::uint16_t float_to_bf16_stochastic(float x, std::uint32_t random16) noexcept {
    const std::uint32_t bits = float_bits(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
    return static_cast<std::uint16_t>((bits + (random16 & 0xffffu)) >> 16);
}

// ---- Stochastic rounding's random numbers ----
//
// Every element has a 32-bit rounding word per step and moment pair: moments 2 * pair and
// 2 * pair + 1 take its low and its high 16 bits. The word is a keyed hash of the element's
// global flat index: mix32 (a 32-bit integer finaliser: two multiplies and three xor-shifts,
// bijective) of the index's low word XOR a key. The key is made once per step from the run's
// seed by Philox (rounding_key), and once per 2^32 elements from the index's high word
// (rounding_run_key), so that the per-element cost is five vector operations and two multiplies
// instead of Philox's ten rounds: the words are a pure function of (seed, pair, step, index) in
// every variant, thread count and rank count.
ZINF_HOST_DEVICE constexpr std::uint32_t mix32(std::uint32_t x) noexcept {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

inline constexpr std::uint64_t kRoundingStreamTag = 0x53520000u;  // 'SR' in the high half
ZINF_HOST_DEVICE constexpr std::uint64_t rounding_stream(int pair, std::uint64_t step) noexcept {
    return ((kRoundingStreamTag + static_cast<std::uint64_t>(pair)) << 32) ^ step;
}
// The 64-bit key of moment pair `pair` at `step`: two Philox words of (seed, its stream).
ZINF_HOST_DEVICE constexpr std::uint64_t rounding_key(std::uint64_t seed, int pair,
                                                      std::uint64_t step) noexcept {
    const std::uint64_t stream = rounding_stream(pair, step);
    return (std::uint64_t{philox::element_word(seed, stream, 1)} << 32) |
           philox::element_word(seed, stream, 0);
}
// The 32-bit key of the elements whose global index has high word `index_high`.
ZINF_HOST_DEVICE constexpr std::uint32_t rounding_run_key(std::uint64_t key,
                                                          std::uint32_t index_high) noexcept {
    return static_cast<std::uint32_t>(key) ^
           mix32(index_high ^ static_cast<std::uint32_t>(key >> 32));
}
ZINF_HOST_DEVICE constexpr std::uint32_t rounding_word(std::uint32_t run_key,
                                                       std::uint32_t index_low) noexcept {
    return mix32(index_low ^ run_key);
}
// The rounding word of the element at global flat index `index` under pair key `key`.
ZINF_HOST_DEVICE constexpr std::uint32_t rounding_word(std::uint64_t key,
                                                       std::uint64_t index) noexcept {
    return rounding_word(rounding_run_key(key, static_cast<std::uint32_t>(index >> 32)),
                         static_cast<std::uint32_t>(index));
}

// Span conversions, single-threaded, scalar, allocation-free. `values` starts at a block
// boundary of the global flat index. encode_moment rounds bf16 to nearest even (a conversion, not
// an optimizer step) and int8 to the nearest code with the block's largest magnitude as scale;
// `scales` has state_scale_count(dtype, values.size()) elements (empty unless int8); `stored` has
// state_element_size_bytes(dtype) * values.size() bytes. fp32 is a copy.
void encode_moment(StateDType dtype, bool non_negative, std::span<const float> values,
                   std::span<std::byte> stored, std::span<float> scales) noexcept;
void decode_moment(StateDType dtype, bool non_negative, std::span<const std::byte> stored,
                   std::span<const float> scales, std::span<float> values) noexcept;

// A moment laid out as the stores keep it (src/base/state_dtype.h): its elements, then (int8)
// its scales at state_scales_offset_bytes; `laid_out` has state_moment_stored_bytes(dtype, n)
// bytes, 4-byte aligned. The two halves as spans, and the conversions above over the layout.
struct StoredMoment {
    std::span<std::byte> elements;
    std::span<float> scales;
};
StoredMoment split_stored_moment(StateDType dtype, std::span<std::byte> laid_out,
                                 std::size_t numel) noexcept;
void encode_stored_moment(StateDType dtype, bool non_negative, std::span<const float> values,
                          std::span<std::byte> laid_out) noexcept;
void decode_stored_moment(StateDType dtype, bool non_negative, std::span<const std::byte> laid_out,
                          std::span<float> values) noexcept;

}  // namespace zinf::kernels
