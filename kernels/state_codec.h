// The element codes of compressed optimizer states (src/base/state_dtype.h), defined once here in
// scalar code: bf16 with stochastic rounding from hashed rounding words, and the int8 logarithmic
// code with one fp32 scale per block (the step's encode rounding stochastically with the same
// words). The SIMD variants reproduce these functions bit for bit; the
// span conversions at the end serve checkpoints, the swapper and tests.
//
// The int8 code (kernels/README.md, "Compressed optimizer states"): a magnitude code c in
// [0, c_max] stands for 0 (c = 0) or scale * 2^((c - c_max) / 8), eight steps per octave, so a
// value keeps about 4.4 % relative precision over 2^-15.75 (signed, c_max = 127, exp_avg) or
// 2^-31.75 (unsigned, c_max = 255, exp_avg_sq and other never-negative moments) of its block's
// largest magnitude. Signed codes keep the sign in the int8's two's complement (-127..127).
// A conversion (encode_int8) quantizes to the nearest code value (not the nearest logarithm), so
// the error is at most half a step; the optimizer step rounds stochastically
// (encode_int8_stochastic, below). This is the same idea as 8-bit Adam's dynamic-tree code
// (Dettmers et al., 2022: blockwise absmax, more codes near zero), in a form that needs no table
// search: the octave is the fp32 exponent and the step within it eight comparisons.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/cast.h"
#include "src/base/philox.h"
#include "src/base/state_dtype.h"

namespace zinf::kernels {

inline constexpr int kCodeStepsPerOctave = 8;
inline constexpr int kSignedCodeMax = 127;
inline constexpr int kUnsignedCodeMax = 255;

// 2^(k/8) for k = 0..7, rounded to fp32 (code values within an octave).
inline constexpr float kOctaveSteps[kCodeStepsPerOctave] = {
    0x1.000000p+0f, 0x1.172b84p+0f, 0x1.306fe0p+0f, 0x1.4bfdaep+0f,
    0x1.6a09e6p+0f, 0x1.8ace54p+0f, 0x1.ae89fap+0f, 0x1.d5818ep+0f};
// (2^(k/8) + 2^((k+1)/8)) / 2 for k = 0..7, rounded to fp32: the nearest-value thresholds.
inline constexpr float kOctaveMidpoints[kCodeStepsPerOctave] = {
    0x1.0b95c2p+0f, 0x1.23cdb2p+0f, 0x1.3e36c6p+0f, 0x1.5b03cap+0f,
    0x1.7a6c1ep+0f, 0x1.9cac26p+0f, 0x1.c205c4p+0f, 0x1.eac0c6p+0f};

// Half the smallest nonzero code's ratio, 0.5 * code_ratio(1, c_max), written out so that the
// SIMD units need no function to derive it (tests/kernels/state_codec_test.cc checks both).
inline constexpr float kSignedHalfSmallest = 0x1.306fe0p-17f;
inline constexpr float kUnsignedHalfSmallest = 0x1.306fe0p-33f;

// 2^e as fp32 for e in [-126, 127]: exact.
inline float exp2_int(int e) noexcept {
    return bits_float(static_cast<std::uint32_t>(e + 127) << 23);
}

// The value of magnitude code c in (0, code_max] relative to the scale: 2^((c - code_max) / 8),
// exact in fp32 as kOctaveSteps[k] * 2^e.
inline float code_ratio(int c, int code_max) noexcept {
    const int level = c - code_max;  // <= 0
    return kOctaveSteps[level & 7] * exp2_int(level >> 3);
}

// The magnitude code nearest to ratio r = |x| / scale (r >= 0; r a little above 1 from rounding
// gives code_max; NaN gives code_max). A value at a threshold rounds up.
inline int encode_ratio(float r, int code_max) noexcept {
    const std::uint32_t bits = float_bits(r);
    const int exponent = static_cast<int>(bits >> 23) - 127;
    const float mantissa = bits_float((bits & 0x007fffffu) | 0x3f800000u);
    int steps = 0;
    for (const float threshold : kOctaveMidpoints) steps += mantissa >= threshold ? 1 : 0;
    const int c = code_max + kCodeStepsPerOctave * exponent + steps;
    if (c > code_max) return code_max;
    if (c >= 1) return c;
    // Below the smallest code's lower threshold: 0 or the smallest code, whichever is nearer.
    return r >= (code_max == kSignedCodeMax ? kSignedHalfSmallest : kUnsignedHalfSmallest) ? 1 : 0;
}

// One int8 element: `is_unsigned` for never-negative moments (OptimizerDescriptor's
// non_negative), whose sign is dropped. inv_scale is 1 / scale, or 0 when the scale is 0.
inline std::uint8_t encode_int8(float x, float inv_scale, bool is_unsigned) noexcept {
    const float magnitude = bits_float(float_bits(x) & 0x7fffffffu);
    const int c =
        encode_ratio(magnitude * inv_scale, is_unsigned ? kUnsignedCodeMax : kSignedCodeMax);
    if (is_unsigned || (float_bits(x) & 0x80000000u) == 0) return static_cast<std::uint8_t>(c);
    return static_cast<std::uint8_t>(-c);  // two's complement of the negative code
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

// ---- int8 with stochastic rounding (the optimizer step's encode) ----
//
// Round to nearest would freeze a moment whose per-step change is below half a code (about 4.5 %:
// exp_avg_sq at beta2 = 0.99 changes by about 1 % a step and could not decay). The step rounds
// the ratio r = |x| / scale to one of its two neighbouring codes instead: `below`, the largest
// code value at or under r (0 under the smallest code), and `above`, the next, taken when
// r - below > (above - below) * u with u = r16 / 2^16 from the element's 16 random bits, i.e. with
// probability (r - below) / (above - below) (to 2^-16): the expected stored value is r's. Both
// differences are exact (Sterbenz: above < 2 below, or below = 0), the product is one fp32
// rounding, so every variant takes the same branch. r at or above 1 (the block's largest value,
// with the scale's rounding) and NaN give code_max.
inline int encode_ratio_stochastic(float r, int code_max, std::uint32_t random16) noexcept {
    if (!(r < 1.0f)) return code_max;
    const std::uint32_t bits = float_bits(r);
    const int exponent = static_cast<int>(bits >> 23) - 127;
    const float mantissa = bits_float((bits & 0x007fffffu) | 0x3f800000u);
    int steps = 0;
    for (int k = 1; k < kCodeStepsPerOctave; ++k) steps += mantissa >= kOctaveSteps[k] ? 1 : 0;
    int low = code_max + kCodeStepsPerOctave * exponent + steps;  // below r's code; < code_max
    if (low < 0) low = 0;
    const float below = low == 0 ? 0.0f : code_ratio(low, code_max);
    const float above = code_ratio(low + 1, code_max);
    const float u = static_cast<float>(random16 & 0xffffu) * 0x1p-16f;
    return r - below > (above - below) * u ? low + 1 : low;
}

// encode_int8 with encode_ratio_stochastic: the step's encode (random16: the element's 16 bits).
inline std::uint8_t encode_int8_stochastic(float x, float inv_scale, bool is_unsigned,
                                           std::uint32_t random16) noexcept {
    const float magnitude = bits_float(float_bits(x) & 0x7fffffffu);
    const int c = encode_ratio_stochastic(
        magnitude * inv_scale, is_unsigned ? kUnsignedCodeMax : kSignedCodeMax, random16);
    if (is_unsigned || (float_bits(x) & 0x80000000u) == 0) return static_cast<std::uint8_t>(c);
    return static_cast<std::uint8_t>(-c);
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
