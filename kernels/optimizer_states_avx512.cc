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
    static __m512i load_table(const std::int32_t* t) noexcept { return _mm512_loadu_si512(t); }
    static __m256i load_table_256(const std::int32_t* t) noexcept {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t));
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

    // state_codec.h's rounding_word of indices index_low .. index_low + 15.
    using W = __m512i;
    static W rounding_words(std::uint32_t run_key, std::uint32_t index_low) noexcept {
        __m512i x = _mm512_xor_si512(
            _mm512_add_epi32(set1_u32(index_low), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
                                                                    10, 11, 12, 13, 14, 15)),
            set1_u32(run_key));
        x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
        x = _mm512_mullo_epi32(x, set1_u32(0x7feb352du));
        x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
        x = _mm512_mullo_epi32(x, set1_u32(0x846ca68bu));
        return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    }
    // u = (word >> kShift & 0xffff) / 2^16 (kShift 0 or 16), exact.
    template <int kShift>
    static F unit_random(W words) noexcept {
        const __m512i random = kShift == 0 ? _mm512_and_si512(words, set1_u32(0xffffu))
                                           : _mm512_srli_epi32(words, kShift);
        return _mm512_mul_ps(_mm512_cvtepi32_ps(random), _mm512_set1_ps(0x1p-16f));
    }

    // decode_int8: scale * ratio, the ratio's bits made from the code by a table permute and an
    // integer add (make_decode_ratio_table; one multiply fewer than step * 2^e).
    template <bool kUnsigned>
    static F load_int8(const std::uint8_t* p, F scale) noexcept {
        constexpr int kCodeMax = kUnsigned ? kUnsignedCodeMax : kSignedCodeMax;
        static constexpr DecodeRatioTable kRatios = make_decode_ratio_table(kCodeMax);
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        const __m512i q = kUnsigned ? _mm512_cvtepu8_epi32(bytes) : _mm512_cvtepi8_epi32(bytes);
        const __m512i c = kUnsigned ? q : _mm512_abs_epi32(q);
        // The 8 entries twice: the permute takes c & 15, the octave add c >> 3.
        const __m512i table = _mm512_broadcast_i32x8(load_table_256(kRatios.bits));
        const __m512i octave = _mm512_and_si512(_mm512_slli_epi32(c, 20), set1_u32(0xff800000u));
        const F ratio =
            _mm512_castsi512_ps(_mm512_add_epi32(_mm512_permutexvar_epi32(c, table), octave));
        F x = _mm512_maskz_mul_ps(_mm512_test_epi32_mask(c, c), scale, ratio);
        if constexpr (!kUnsigned) {
            x = _mm512_castsi512_ps(
                _mm512_mask_xor_epi32(_mm512_castps_si512(x), _mm512_movepi32_mask(q),
                                      _mm512_castps_si512(x), set1_u32(0x80000000u)));
        }
        return x;
    }

    // encode_int8_stochastic's codes (int32 lanes), u from unit_random: the floor code `low` from
    // the exponent and the table of the mantissa's top four bits (one code value at most per
    // interval), its value and the next one's from permuted tables and the octave bits (as
    // load_int8), then low + 1 where r - below > (above - below) * u. kMagnitude: x is |x|
    // already, so x * inv_scale needs no AND unless it is the NaN of inf * 0, whose sign bit
    // only raises its floor code (clamped) to c_max.
    template <bool kUnsigned, bool kMagnitude = false>
    static __m512i int8_codes(F x, F inv_scale, F u) noexcept {
        constexpr int kCodeMax = kUnsigned ? kUnsignedCodeMax : kSignedCodeMax;
        static constexpr OctaveStepTables<4> kTables = make_octave_floor_tables<4>(kCodeMax);
        static constexpr DecodeRatioTable kBelow = make_decode_ratio_table(kCodeMax);
        static constexpr DecodeRatioTable kAbove = make_decode_ratio_table(kCodeMax, 1);
        static_assert(kTables.second[0] == 0x7fffffff);  // spot check: one value at most
        const __m512i product = _mm512_castps_si512(_mm512_mul_ps(x, inv_scale));
        const __m512i bits =
            kMagnitude ? product : _mm512_and_si512(product, set1_u32(0x7fffffffu));
        const __m512i index = _mm512_srli_epi32(bits, 19);  // the permutes use its low 4 bits
        const __m512i mantissa = _mm512_and_si512(bits, set1_u32(0x007fffffu));
        const __mmask16 above_first = _mm512_cmpgt_epi32_mask(
            mantissa, _mm512_permutexvar_epi32(index, load_table(kTables.first)));
        const __m512i octave_index = _mm512_srli_epi32(bits, 20);  // 8 * exponent + top 3 bits
        __m512i low = _mm512_add_epi32(octave_index,
                                       _mm512_permutexvar_epi32(index, load_table(kTables.base)));
        low = _mm512_mask_add_epi32(low, above_first, low, _mm512_set1_epi32(1));
        low = _mm512_min_epi32(_mm512_max_epi32(low, _mm512_setzero_si512()),
                               _mm512_set1_epi32(kCodeMax));
        // The 8 entries twice: the permutes take low & 15, the octave add low >> 3.
        const __m512i below_table = _mm512_broadcast_i32x8(load_table_256(kBelow.bits));
        const __m512i above_table = _mm512_broadcast_i32x8(load_table_256(kAbove.bits));
        const __m512i octave = _mm512_and_si512(_mm512_slli_epi32(low, 20), set1_u32(0xff800000u));
        const F below = _mm512_castsi512_ps(_mm512_maskz_add_epi32(
            _mm512_test_epi32_mask(low, low), _mm512_permutexvar_epi32(low, below_table), octave));
        const F above = _mm512_castsi512_ps(
            _mm512_add_epi32(_mm512_permutexvar_epi32(low, above_table), octave));
        const F r = _mm512_castsi512_ps(bits);
        const __mmask16 up = _mm512_mask_cmp_ps_mask(
            _mm512_cmplt_epi32_mask(low, _mm512_set1_epi32(kCodeMax)), _mm512_sub_ps(r, below),
            _mm512_mul_ps(_mm512_sub_ps(above, below), u), _CMP_GT_OQ);
        __m512i c = _mm512_mask_add_epi32(low, up, low, _mm512_set1_epi32(1));
        if constexpr (!kUnsigned) {
            c = _mm512_mask_sub_epi32(c, _mm512_movepi32_mask(_mm512_castps_si512(x)),
                                      _mm512_setzero_si512(), c);
        }
        return c;
    }

    template <bool kUnsigned, int kShift>
    static void store_int8(std::uint8_t* p, F x, F inv_scale, W words) noexcept {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                         _mm512_cvtepi32_epi8(int8_codes<kUnsigned>(
                             x, inv_scale, unit_random<kShift>(words))));  // low bytes
    }

    // Four vectors' codes narrowed by packs (the codes fit their saturation) and one dword
    // permute: four micro-ops instead of four two-micro-op vpmovdb.
    template <bool kUnsigned, int kShift>
    static void store_int8_x4(std::uint8_t* p, const float* x, F inv_scale,
                              const W* words) noexcept {
        const __m512i c0 =
            int8_codes<kUnsigned, kUnsigned>(load(x), inv_scale, unit_random<kShift>(words[0]));
        const __m512i c1 = int8_codes<kUnsigned, kUnsigned>(load(x + 16), inv_scale,
                                                            unit_random<kShift>(words[1]));
        const __m512i c2 = int8_codes<kUnsigned, kUnsigned>(load(x + 32), inv_scale,
                                                            unit_random<kShift>(words[2]));
        const __m512i c3 = int8_codes<kUnsigned, kUnsigned>(load(x + 48), inv_scale,
                                                            unit_random<kShift>(words[3]));
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
