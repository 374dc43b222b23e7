// The AVX-512 variant of the compressed-state step (kernels/detail/state_body.h): Avx512Ops plus
// the int8 and bf16 codes and the rounding words' hash. Built with the AVX-512 unit's flags;
// operation for operation the AVX2 variant's.
#include <cstddef>

#include "kernels/detail/ops_avx512.h"
#include "kernels/detail/state_body.h"
#include "kernels/detail/state_table.h"
#include "kernels/state_codec.h"

namespace zinf::kernels::detail {
namespace {

struct Avx512StateOps : Avx512Ops {
    static __m512i set1_u32(std::uint32_t x) noexcept {
        return _mm512_set1_epi32(static_cast<int>(x));
    }

    // The running largest magnitude as the integer maximum of |x|'s bits: exact, order-free, and
    // any NaN above every number.
    using U = __m512i;
    static U max_magnitude_zero() noexcept { return _mm512_setzero_si512(); }
    static U max_magnitude(U acc, F x) noexcept {
        return _mm512_max_epu32(acc,
                                _mm512_and_si512(_mm512_castps_si512(x), set1_u32(0x7fffffffu)));
    }
    static F magnitude(F x) noexcept {
        return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), set1_u32(0x7fffffffu)));
    }
    static U max_of_magnitudes(U acc, F magnitude) noexcept {
        return _mm512_max_epu32(acc, _mm512_castps_si512(magnitude));
    }
    static float reduce_max_magnitude(U acc) noexcept {
        const std::uint32_t m = _mm512_reduce_max_epu32(acc);
        return bits_float(m > 0x7f800000u ? kCanonicalNanBits : m);
    }

    using W = __m512i;
    // mix32 after its first xor-shift: two multiplies and two xor-shifts.
    static W mix32_tail(W x) noexcept {
        x = _mm512_mullo_epi32(x, set1_u32(0x7feb352du));
        x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
        x = _mm512_mullo_epi32(x, set1_u32(0x846ca68bu));
        return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    }
    // state_codec.h's rounding_word of indices index_low .. index_low + 15.
    static W rounding_words(std::uint32_t run_key, std::uint32_t index_low) noexcept {
        __m512i x = _mm512_xor_si512(
            _mm512_add_epi32(set1_u32(index_low), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
                                                                    10, 11, 12, 13, 14, 15)),
            set1_u32(run_key));
        x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
        return mix32_tail(x);
    }
    // An int8 block's rounding words, index_low a multiple of 4 * 16: the indices of vector k's
    // lanes are index_low ^ (k * 16 + l) (no carries), so mix32's first xor-shift of
    // (index_low + k * 16 + l) ^ run_key is (s ^ (s >> 16)) ^ (k * 16 + l), s = index_low ^
    // run_key: one scalar broadcast for four vectors and one XOR each instead of five vector
    // operations each, the same words.
    using R = __m512i;
    static R rounding_base(std::uint32_t run_key, std::uint32_t index_low) noexcept {
        const std::uint32_t s = index_low ^ run_key;
        return set1_u32(s ^ (s >> 16));
    }
    template <int kVector>
    static W rounding_words_at(R base) noexcept {
        constexpr int k = kVector * 16;
        __m512i x = _mm512_xor_si512(
            base,
            _mm512_add_epi32(_mm512_set1_epi32(k), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
                                                                     10, 11, 12, 13, 14, 15)));
        return mix32_tail(x);
    }
    // decode_int8: scale * f(c), f(c)'s bits (c + K) << 20; a zero-masked multiply makes code 0
    // zero.
    template <bool kUnsigned>
    static F load_int8(const std::uint8_t* p, F scale) noexcept {
        constexpr int kBias = code_bias(kUnsigned ? kUnsignedCodeMax : kSignedCodeMax);
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        const __m512i q = kUnsigned ? _mm512_cvtepu8_epi32(bytes) : _mm512_cvtepi8_epi32(bytes);
        const __m512i c = kUnsigned ? q : _mm512_abs_epi32(q);
        const F ratio = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_add_epi32(c, _mm512_set1_epi32(kBias)), 20));
        F x = _mm512_maskz_mul_ps(_mm512_test_epi32_mask(c, c), scale, ratio);
        if constexpr (!kUnsigned) {
            x = _mm512_castsi512_ps(
                _mm512_mask_xor_epi32(_mm512_castps_si512(x), _mm512_movepi32_mask(q),
                                      _mm512_castps_si512(x), set1_u32(0x80000000u)));
        }
        return x;
    }

    // encode_int8_stochastic's codes (int32 lanes): the ratio's bits plus the 16 random bits of
    // word >> kShift (kShift 0 or 16) at bits 4..19, shifted, less K, clamped. kMagnitude: x is
    // |x| already, so x * inv_scale needs no AND (its only negative result is the NaN of inf * 0,
    // 0xffc00000, whose code is clamped to c_max as the AND's 0x7fc00000 would be).
    template <bool kUnsigned, int kShift, bool kMagnitude = false>
    static __m512i int8_codes(F x, F inv_scale, W words) noexcept {
        constexpr int kCodeMax = kUnsigned ? kUnsignedCodeMax : kSignedCodeMax;
        const __m512i product = _mm512_castps_si512(_mm512_mul_ps(x, inv_scale));
        const __m512i bits =
            kMagnitude ? product : _mm512_and_si512(product, set1_u32(0x7fffffffu));
        const __m512i random = _mm512_and_si512(
            kShift == 0 ? _mm512_slli_epi32(words, 4) : _mm512_srli_epi32(words, kShift - 4),
            set1_u32(0x000ffff0u));
        __m512i c = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_add_epi32(bits, random), 20),
                                     _mm512_set1_epi32(code_bias(kCodeMax)));
        c = _mm512_min_epi32(_mm512_max_epi32(c, _mm512_setzero_si512()),
                             _mm512_set1_epi32(kCodeMax));
        if constexpr (!kUnsigned) {
            c = _mm512_mask_sub_epi32(c, _mm512_movepi32_mask(_mm512_castps_si512(x)),
                                      _mm512_setzero_si512(), c);
        }
        return c;
    }

    template <bool kUnsigned, int kShift>
    static void store_int8(std::uint8_t* p, F x, F inv_scale, W words) noexcept {
        _mm_storeu_si128(
            reinterpret_cast<__m128i*>(p),
            _mm512_cvtepi32_epi8(int8_codes<kUnsigned, kShift>(x, inv_scale, words)));  // low bytes
    }

    // Four vectors' codes narrowed by packs (the codes fit their saturation) and one dword
    // permute: four micro-ops instead of four two-micro-op vpmovdb.
    template <bool kUnsigned, int kShift>
    static void store_int8_x4(std::uint8_t* p, const float* x, F inv_scale,
                              const W* words) noexcept {
        const __m512i c0 = int8_codes<kUnsigned, kShift, kUnsigned>(load(x), inv_scale, words[0]);
        const __m512i c1 =
            int8_codes<kUnsigned, kShift, kUnsigned>(load(x + 16), inv_scale, words[1]);
        const __m512i c2 =
            int8_codes<kUnsigned, kShift, kUnsigned>(load(x + 32), inv_scale, words[2]);
        const __m512i c3 =
            int8_codes<kUnsigned, kShift, kUnsigned>(load(x + 48), inv_scale, words[3]);
        __m512i bytes;
        if constexpr (kUnsigned) {
            bytes = _mm512_packus_epi16(_mm512_packus_epi32(c0, c1), _mm512_packus_epi32(c2, c3));
        } else {
            bytes = _mm512_packs_epi16(_mm512_packs_epi32(c0, c1), _mm512_packs_epi32(c2, c3));
        }
        // Per 128-bit lane j the packs leave dwords (c0 j, c1 j, c2 j, c3 j).
        bytes = _mm512_permutexvar_epi32(
            _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), bytes);
        _mm512_storeu_si512(p, bytes);
    }

    // float_to_bf16_stochastic's 32 bits before the shift: x's bits plus the random number, or
    // for a NaN its bits with the quiet bit (the masked add leaves those lanes as they are).
    static __m512i bf16_rounded(F x, __m512i random) noexcept {
        const __m512i bits = _mm512_castps_si512(x);
        const __mmask16 number = _mm512_cmp_ps_mask(x, x, _CMP_ORD_Q);
        const __m512i quiet = _mm512_or_si512(bits, _mm512_set1_epi32(0x00400000));
        return _mm512_mask_add_epi32(quiet, number, bits, random);
    }

    // float_to_bf16_stochastic with word >> kShift (its low 16 bits) of each lane's word.
    template <int kShift>
    static void store_bf16_stochastic(std::uint16_t* p, F x, W w) noexcept {
        const __m512i random = kShift == 0 ? _mm512_and_si512(w, _mm512_set1_epi32(0xffff))
                                           : _mm512_srli_epi32(w, kShift);
        const __m512i high = _mm512_srli_epi32(bf16_rounded(x, random), 16);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(high));
    }

    // Two moments rounded with the low and the high 16 bits of the same words, in one pack
    // (x0 and x1 alternate by 64 bits within each 128-bit lane) and one 64-bit permute, instead
    // of two two-micro-op narrowing moves.
    static void store_bf16_stochastic_pair(std::uint16_t* p0, std::uint16_t* p1, F x0, F x1,
                                           W w) noexcept {
        const __m512i high0 =
            _mm512_srli_epi32(bf16_rounded(x0, _mm512_and_si512(w, _mm512_set1_epi32(0xffff))), 16);
        const __m512i high1 = _mm512_srli_epi32(bf16_rounded(x1, _mm512_srli_epi32(w, 16)), 16);
        const __m512i packed = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7),
                                                        _mm512_packus_epi32(high0, high1));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p0), _mm512_castsi512_si256(packed));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p1), _mm512_extracti64x4_epi64(packed, 1));
    }
};

constexpr StateKernelTable kAvx512StateTable = make_state_kernel_table<Avx512StateOps>();

}  // namespace

const StateKernelTable& avx512_state_kernel_table() noexcept {
    return kAvx512StateTable;
}

}  // namespace zinf::kernels::detail
