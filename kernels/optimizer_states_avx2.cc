// The AVX2 variant of the compressed-state step (kernels/detail/state_body.h): Avx2Ops plus the
// int8 and bf16 codes and the rounding words' hash. Built with the AVX2 unit's flags.
#include "kernels/detail/ops_avx2.h"
#include "kernels/detail/state_body.h"
#include "kernels/detail/state_table.h"
#include "kernels/state_codec.h"

namespace zinf::kernels::detail {
namespace {

struct Avx2StateOps : Avx2Ops {
    static __m256i set1_u32(std::uint32_t x) noexcept {
        return _mm256_set1_epi32(static_cast<int>(x));
    }

    // The running largest magnitude as the integer maximum of |x|'s bits: exact, order-free, and
    // any NaN above every number.
    using U = __m256i;
    static U max_magnitude_zero() noexcept { return _mm256_setzero_si256(); }
    static U max_magnitude(U acc, F x) noexcept {
        return _mm256_max_epu32(acc,
                                _mm256_and_si256(_mm256_castps_si256(x), set1_u32(0x7fffffffu)));
    }
    static F magnitude(F x) noexcept {
        return _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(x), set1_u32(0x7fffffffu)));
    }
    static U max_of_magnitudes(U acc, F magnitude) noexcept {
        return _mm256_max_epu32(acc, _mm256_castps_si256(magnitude));
    }
    static float reduce_max_magnitude(U acc) noexcept {
        alignas(32) std::uint32_t lanes[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
        std::uint32_t m = 0;
        for (const std::uint32_t lane : lanes) m = lane > m ? lane : m;
        return bits_float(m > 0x7f800000u ? kCanonicalNanBits : m);
    }

    using W = __m256i;
    // mix32 after its first xor-shift: two multiplies and two xor-shifts.
    static W mix32_tail(W x) noexcept {
        x = _mm256_mullo_epi32(x, set1_u32(0x7feb352du));
        x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
        x = _mm256_mullo_epi32(x, set1_u32(0x846ca68bu));
        return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    }
    // state_codec.h's rounding_word of indices index_low .. index_low + 7.
    static W rounding_words(std::uint32_t run_key, std::uint32_t index_low) noexcept {
        __m256i x = _mm256_xor_si256(
            _mm256_add_epi32(set1_u32(index_low), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
            set1_u32(run_key));
        x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
        return mix32_tail(x);
    }
    // An int8 block's rounding words, index_low a multiple of 4 * 8: the indices of vector k's
    // lanes are index_low ^ (k * 8 + l) (no carries), so mix32's first xor-shift of
    // (index_low + k * 8 + l) ^ run_key is (s ^ (s >> 16)) ^ (k * 8 + l), s = index_low ^
    // run_key: one scalar broadcast for four vectors and one XOR each instead of five vector
    // operations each, the same words.
    using R = __m256i;
    static R rounding_base(std::uint32_t run_key, std::uint32_t index_low) noexcept {
        const std::uint32_t s = index_low ^ run_key;
        return set1_u32(s ^ (s >> 16));
    }
    template <int kVector>
    static W rounding_words_at(R base) noexcept {
        constexpr int k = kVector * 8;
        __m256i x = _mm256_xor_si256(
            base,
            _mm256_add_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
        return mix32_tail(x);
    }
    // decode_int8: scale * f(c), f(c)'s bits (c + K) << 20; psignd makes code 0 zero.
    template <bool kUnsigned>
    static F load_int8(const std::uint8_t* p, F scale) noexcept {
        constexpr int kBias = code_bias(kUnsigned ? kUnsignedCodeMax : kSignedCodeMax);
        const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
        const __m256i q = kUnsigned ? _mm256_cvtepu8_epi32(bytes) : _mm256_cvtepi8_epi32(bytes);
        const __m256i c = kUnsigned ? q : _mm256_abs_epi32(q);
        const F ratio = _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_add_epi32(c, _mm256_set1_epi32(kBias)), 20));
        // psignd: 0 where c is 0, else x unchanged (c >= 0).
        __m256i x = _mm256_sign_epi32(_mm256_castps_si256(_mm256_mul_ps(scale, ratio)), c);
        if constexpr (!kUnsigned) {
            x = _mm256_xor_si256(x, _mm256_and_si256(q, set1_u32(0x80000000u)));
        }
        return _mm256_castsi256_ps(x);
    }

    // encode_int8_stochastic's ratio bits plus the random number, >> 20: t = c + K before the
    // clamp, at most 4095 (the 32-bit sum's top 12 bits). kMagnitude as in int8_codes.
    template <int kShift, bool kMagnitude>
    static __m256i int8_biased_codes(F x, F inv_scale, W words) noexcept {
        const __m256i product = _mm256_castps_si256(_mm256_mul_ps(x, inv_scale));
        const __m256i bits =
            kMagnitude ? product : _mm256_and_si256(product, set1_u32(0x7fffffffu));
        const __m256i random = _mm256_and_si256(
            kShift == 0 ? _mm256_slli_epi32(words, 4) : _mm256_srli_epi32(words, kShift - 4),
            set1_u32(0x000ffff0u));
        return _mm256_srli_epi32(_mm256_add_epi32(bits, random), 20);
    }

    // encode_int8_stochastic's codes (int32 lanes): the ratio's bits plus the 16 random bits of
    // word >> kShift (kShift 0 or 16) at bits 4..19, shifted, less K, clamped. kMagnitude: x is
    // |x| already, so x * inv_scale needs no AND (its only negative result is the NaN of inf * 0,
    // 0xffc00000, whose code is clamped to c_max as the AND's 0x7fc00000 would be).
    template <bool kUnsigned, int kShift, bool kMagnitude = false>
    static __m256i int8_codes(F x, F inv_scale, W words) noexcept {
        constexpr int kCodeMax = kUnsigned ? kUnsignedCodeMax : kSignedCodeMax;
        __m256i c = _mm256_sub_epi32(int8_biased_codes<kShift, kMagnitude>(x, inv_scale, words),
                                     _mm256_set1_epi32(code_bias(kCodeMax)));
        c = _mm256_min_epi32(_mm256_max_epi32(c, _mm256_setzero_si256()),
                             _mm256_set1_epi32(kCodeMax));
        if constexpr (!kUnsigned) {
            // psignd: -c where x's bits are negative, 0 where they are 0 (x = +0, whose code is
            // 0 anyway), else c: the two's complement code in one micro-op.
            c = _mm256_sign_epi32(c, _mm256_castps_si256(x));
        }
        return c;
    }

    template <bool kUnsigned, int kShift>
    static void store_int8(std::uint8_t* p, F x, F inv_scale, W words) noexcept {
        const __m256i c = int8_codes<kUnsigned, kShift>(x, inv_scale, words);
        const __m256i low = _mm256_and_si256(c, _mm256_set1_epi32(0xff));
        const __m256i bytes =
            _mm256_packus_epi16(_mm256_packus_epi32(low, low), _mm256_setzero_si256());
        // Each 128-bit half now starts with its four codes; gather the two dwords.
        const __m256i gathered =
            _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(gathered));
    }

    // Four vectors' codes (int8_codes) in one 32-byte store, clamped in 16-bit lanes: t fits a
    // 16-bit lane exactly, so after the first pack one unsigned saturating subtraction of K takes
    // both the bias and the clamp at 0 for two vectors; the last pack's saturation is the clamp
    // at 255 (unsigned), and for signed codes one byte maximum after it turns -128 into -127
    // (the 16-bit sign comes from a pack of x's bits, which keeps each lane's sign and zero).
    template <bool kUnsigned, int kShift>
    static void store_int8_x4(std::uint8_t* p, const float* x, F inv_scale,
                              const W* words) noexcept {
        constexpr int kBias = code_bias(kUnsigned ? kUnsignedCodeMax : kSignedCodeMax);
        const __m256i bias = _mm256_set1_epi16(static_cast<std::int16_t>(kBias));
        const F x0 = load(x), x1 = load(x + 8), x2 = load(x + 16), x3 = load(x + 24);
        const __m256i t0 = int8_biased_codes<kShift, kUnsigned>(x0, inv_scale, words[0]);
        const __m256i t1 = int8_biased_codes<kShift, kUnsigned>(x1, inv_scale, words[1]);
        const __m256i t2 = int8_biased_codes<kShift, kUnsigned>(x2, inv_scale, words[2]);
        const __m256i t3 = int8_biased_codes<kShift, kUnsigned>(x3, inv_scale, words[3]);
        __m256i c01 = _mm256_subs_epu16(_mm256_packus_epi32(t0, t1), bias);
        __m256i c23 = _mm256_subs_epu16(_mm256_packus_epi32(t2, t3), bias);
        __m256i bytes;
        if constexpr (kUnsigned) {
            bytes = _mm256_packus_epi16(c01, c23);
        } else {
            c01 = _mm256_sign_epi16(
                c01, _mm256_packs_epi32(_mm256_castps_si256(x0), _mm256_castps_si256(x1)));
            c23 = _mm256_sign_epi16(
                c23, _mm256_packs_epi32(_mm256_castps_si256(x2), _mm256_castps_si256(x3)));
            bytes = _mm256_max_epi8(_mm256_packs_epi16(c01, c23),
                                    _mm256_set1_epi8(static_cast<char>(-kSignedCodeMax)));
        }
        // The packs interleave 128-bit halves: dwords (c0 lo, c1 lo, c2 lo, c3 lo, c0 hi, ...).
        bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bytes);
    }

    // float_to_bf16_stochastic's 32 bits before the shift: x's bits plus the random number, or
    // for a NaN its bits with the quiet bit (and no random number, which could carry into the
    // exponent): one AND-NOT, AND and OR instead of a three-micro-op variable blend.
    static __m256i bf16_rounded(F x, __m256i random) noexcept {
        const __m256i bits = _mm256_castps_si256(x);
        const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        const __m256i sum = _mm256_add_epi32(bits, _mm256_andnot_si256(nan, random));
        return _mm256_or_si256(sum, _mm256_and_si256(nan, _mm256_set1_epi32(0x00400000)));
    }

    // float_to_bf16_stochastic with word >> kShift (its low 16 bits) of each lane's word.
    template <int kShift>
    static void store_bf16_stochastic(std::uint16_t* p, F x, W w) noexcept {
        const __m256i random = kShift == 0 ? _mm256_and_si256(w, _mm256_set1_epi32(0xffff))
                                           : _mm256_srli_epi32(w, kShift);
        const __m256i high = _mm256_srli_epi32(bf16_rounded(x, random), 16);
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(high, high), 0x08);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
    }

    // Two moments rounded with the low and the high 16 bits of the same words, in one pack:
    // (x0 0-3, x1 0-3 | x0 4-7, x1 4-7), then one 64-bit permute puts each in its own half. A
    // NaN in either is rare (it makes the whole step non-finite): one unordered compare of the
    // two finds it, and only then do the lanes take bf16_rounded's NaN case.
    static void store_bf16_stochastic_pair(std::uint16_t* p0, std::uint16_t* p1, F x0, F x1,
                                           W w) noexcept {
        const __m256i random0 = _mm256_and_si256(w, _mm256_set1_epi32(0xffff));
        const __m256i random1 = _mm256_srli_epi32(w, 16);
        __m256i rounded0, rounded1;
        if (_mm256_movemask_ps(_mm256_cmp_ps(x0, x1, _CMP_UNORD_Q)) == 0) [[likely]] {
            rounded0 = _mm256_add_epi32(_mm256_castps_si256(x0), random0);
            rounded1 = _mm256_add_epi32(_mm256_castps_si256(x1), random1);
        } else {
            rounded0 = bf16_rounded(x0, random0);
            rounded1 = bf16_rounded(x1, random1);
        }
        const __m256i packed = _mm256_permute4x64_epi64(
            _mm256_packus_epi32(_mm256_srli_epi32(rounded0, 16), _mm256_srli_epi32(rounded1, 16)),
            0xD8);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p0), _mm256_castsi256_si128(packed));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p1), _mm256_extracti128_si256(packed, 1));
    }
};

constexpr StateKernelTable kAvx2StateTable = make_state_kernel_table<Avx2StateOps>();

}  // namespace

const StateKernelTable& avx2_state_kernel_table() noexcept {
    return kAvx2StateTable;
}

}  // namespace zinf::kernels::detail
