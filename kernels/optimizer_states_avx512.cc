// The AVX-512 variant of the compressed-state step (kernels/detail/state_body.h): Avx512Ops plus
// the int8 and bf16 codes and a 16-lane Philox. Built with the AVX-512 unit's flags; operation
// for operation the AVX2 variant's.
#include <cstddef>

#include "kernels/detail/ops_avx512.h"
#include "kernels/detail/state_body.h"
#include "kernels/detail/state_table.h"
#include "kernels/state_codec.h"
#include "src/base/philox.h"

namespace zinf::kernels::detail {
namespace {

struct Avx512StateOps : Avx512Ops {
    // Words per philox_words batch (count and first_index are multiples of it).
    static constexpr std::size_t kPhiloxBatch = 64;
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

    // encode_int8's codes (int32 lanes): the octave from the exponent, the step from the tables
    // of the mantissa's top four bits (one midpoint at most per interval).
    // kClampMax false leaves codes above c_max (NaN, and |x| above the scale; below 1300)
    // to the caller: store_int8_x4's unsigned packs saturate them to 255 anyway. kMagnitude:
    // x is |x| already, so x * inv_scale needs no AND unless it is the NaN of inf * 0, whose
    // sign bit only raises its code (below 3400, still saturated, or clamped) to c_max.
    template <bool kUnsigned, bool kClampMax = true, bool kMagnitude = false>
    static __m512i int8_codes(F x, F inv_scale) noexcept {
        constexpr int kCodeMax = kUnsigned ? kUnsignedCodeMax : kSignedCodeMax;
        static constexpr OctaveStepTables<4> kTables = make_octave_step_tables<4>(kCodeMax);
        static_assert(kTables.second[0] == 0x7fffffff);  // spot check: one midpoint at most
        const __m512i product = _mm512_castps_si512(_mm512_mul_ps(x, inv_scale));
        const __m512i bits =
            kMagnitude ? product : _mm512_and_si512(product, set1_u32(0x7fffffffu));
        const __m512i index = _mm512_srli_epi32(bits, 19);  // the permutes use its low 4 bits
        const __m512i mantissa = _mm512_and_si512(bits, set1_u32(0x007fffffu));
        const __mmask16 above = _mm512_cmpgt_epi32_mask(
            mantissa, _mm512_permutexvar_epi32(index, load_table(kTables.first)));
        const __m512i octave = _mm512_srli_epi32(bits, 20);  // 8 * exponent + top 3 bits
        __m512i c =
            _mm512_add_epi32(octave, _mm512_permutexvar_epi32(index, load_table(kTables.base)));
        c = _mm512_mask_add_epi32(c, above, c, _mm512_set1_epi32(1));
        if constexpr (kClampMax) c = _mm512_min_epi32(c, _mm512_set1_epi32(kCodeMax));
        // Below the smallest code's lower threshold: 0 or 1, whichever is nearer. Lanes below
        // half the smallest code have c <= 0 and take 0; the others (NaN too, c_max) max(c, 1).
        const float half_smallest = kUnsigned ? kUnsignedHalfSmallest : kSignedHalfSmallest;
        const __mmask16 at_least_half = _mm512_cmp_ps_mask(
            _mm512_castsi512_ps(bits), _mm512_set1_ps(half_smallest), _CMP_NLT_UQ);
        c = _mm512_maskz_max_epi32(at_least_half, c, _mm512_set1_epi32(1));
        if constexpr (!kUnsigned) {
            c = _mm512_mask_sub_epi32(c, _mm512_movepi32_mask(_mm512_castps_si512(x)),
                                      _mm512_setzero_si512(), c);
        }
        return c;
    }

    template <bool kUnsigned>
    static void store_int8(std::uint8_t* p, F x, F inv_scale) noexcept {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                         _mm512_cvtepi32_epi8(int8_codes<kUnsigned>(x, inv_scale)));  // low bytes
    }

    // Four vectors' codes narrowed by packs (the codes fit their saturation) and one dword
    // permute: four micro-ops instead of four two-micro-op vpmovdb.
    template <bool kUnsigned>
    static void store_int8_x4(std::uint8_t* p, const float* x, F inv_scale) noexcept {
        const __m512i c0 = int8_codes<kUnsigned, !kUnsigned, kUnsigned>(load(x), inv_scale);
        const __m512i c1 = int8_codes<kUnsigned, !kUnsigned, kUnsigned>(load(x + 16), inv_scale);
        const __m512i c2 = int8_codes<kUnsigned, !kUnsigned, kUnsigned>(load(x + 32), inv_scale);
        const __m512i c3 = int8_codes<kUnsigned, !kUnsigned, kUnsigned>(load(x + 48), inv_scale);
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
    static void store_bf16_stochastic(std::uint16_t* p, F x, const std::uint32_t* words) noexcept {
        const __m512i w = _mm512_loadu_si512(words);
        const __m512i random = kShift == 0 ? _mm512_and_si512(w, _mm512_set1_epi32(0xffff))
                                           : _mm512_srli_epi32(w, kShift);
        const __m512i high = _mm512_srli_epi32(bf16_rounded(x, random), 16);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(high));
    }

    // Two moments rounded with the low and the high 16 bits of the same words, in one pack
    // (x0 and x1 alternate by 64 bits within each 128-bit lane) and one 64-bit permute, instead
    // of two two-micro-op narrowing moves.
    static void store_bf16_stochastic_pair(std::uint16_t* p0, std::uint16_t* p1, F x0, F x1,
                                           const std::uint32_t* words) noexcept {
        const __m512i w = _mm512_loadu_si512(words);
        const __m512i high0 =
            _mm512_srli_epi32(bf16_rounded(x0, _mm512_and_si512(w, _mm512_set1_epi32(0xffff))), 16);
        const __m512i high1 = _mm512_srli_epi32(bf16_rounded(x1, _mm512_srli_epi32(w, 16)), 16);
        const __m512i packed = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7),
                                                        _mm512_packus_epi32(high0, high1));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p0), _mm512_castsi512_si256(packed));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p1), _mm512_extracti64x4_epi64(packed, 1));
    }

    // Philox4x32-10 state of eight groups, one in the low half of each 64-bit lane (the high
    // halves carry garbage that _mm512_mul_epu32 ignores), so that a round needs no blends.
    struct PhiloxLanes {
        __m512i c0, c1, c2, c3;
    };

    // What philox_words needs of (seed, stream), made once per chunk: as the AVX2 unit's, the
    // round keys as vectors and the first three rounds' lanes that do not depend on the group's
    // low word.
    struct PhiloxSchedule {
        __m512i key0[philox::kRounds];  // round r's key words in every lane
        __m512i key1[philox::kRounds];
        __m512i round0_c2;  // stream high ^ key1[0]
        __m512i round1_c0;  // lo(M1 * stream low) ^ key0[1]
        __m512i round1_c2;  // hi(M0 * round 0's c0) ^ key1[1]
        __m512i round2_c2;  // lo(M0 * round 0's c0) ^ key1[2]
        std::uint64_t seed, stream;
        std::uint32_t group_high;  // the groups' high word these constants hold for
    };

    // The schedule for groups whose high word is (first_index / 4) >> 32.
    static PhiloxSchedule philox_schedule(std::uint64_t seed, std::uint64_t stream,
                                          std::uint64_t first_index) noexcept {
        PhiloxSchedule s;
        s.seed = seed;
        s.stream = stream;
        s.group_high = static_cast<std::uint32_t>(first_index >> 34);
        auto k0 = static_cast<std::uint32_t>(seed);
        auto k1 = static_cast<std::uint32_t>(seed >> 32);
        std::uint32_t key0[philox::kRounds], key1[philox::kRounds];
        for (int round = 0; round < philox::kRounds; ++round) {
            if (round > 0) {
                k0 += philox::kWeyl0;
                k1 += philox::kWeyl1;
            }
            key0[round] = k0;
            key1[round] = k1;
            s.key0[round] = set1_u32(k0);
            s.key1[round] = set1_u32(k1);
        }
        const auto s0 = static_cast<std::uint32_t>(stream);
        const auto s1 = static_cast<std::uint32_t>(stream >> 32);
        const std::uint64_t round0_p1 = std::uint64_t{philox::kMultiplier1} * s0;
        const auto round0_c0 = static_cast<std::uint32_t>(round0_p1 >> 32) ^ s.group_high ^ key0[0];
        const std::uint64_t round1_p0 = std::uint64_t{philox::kMultiplier0} * round0_c0;
        s.round0_c2 = set1_u32(s1 ^ key1[0]);
        s.round1_c0 = set1_u32(static_cast<std::uint32_t>(round0_p1) ^ key0[1]);
        s.round1_c2 = set1_u32(static_cast<std::uint32_t>(round1_p0 >> 32) ^ key1[1]);
        s.round2_c2 = set1_u32(static_cast<std::uint32_t>(round1_p0) ^ key1[2]);
        return s;
    }

    static __m512i mul0(__m512i c) noexcept {
        return _mm512_mul_epu32(c, set1_u32(philox::kMultiplier0));
    }
    static __m512i mul1(__m512i c) noexcept {
        return _mm512_mul_epu32(c, set1_u32(philox::kMultiplier1));
    }
    static __m512i high_down(__m512i product) noexcept {
        return _mm512_shuffle_epi32(product, _MM_PERM_DDBB);
    }
    static constexpr int kXor3 = 0x96;  // ternary logic a ^ b ^ c

    // Rounds 0 to 2 of the groups whose low words are c0 (one in each 64-bit lane's low half).
    static PhiloxLanes philox_first_rounds(__m512i c0, const PhiloxSchedule& s) noexcept {
        const __m512i round0_p0 = mul0(c0);
        const __m512i round0_c2 = _mm512_xor_si512(high_down(round0_p0), s.round0_c2);
        // After round 0: c0 and c1 are constants, c3 is round0_p0.
        const __m512i round1_p1 = mul1(round0_c2);
        const __m512i round1_c0 = _mm512_xor_si512(high_down(round1_p1), s.round1_c0);
        const __m512i round1_c2 = _mm512_xor_si512(round0_p0, s.round1_c2);
        // After round 1: c1 is round1_p1, c3 a constant.
        const __m512i round2_p0 = mul0(round1_c0);
        const __m512i round2_p1 = mul1(round1_c2);
        PhiloxLanes out;
        out.c0 = _mm512_ternarylogic_epi32(high_down(round2_p1), round1_p1, s.key0[2], kXor3);
        out.c1 = round2_p1;
        out.c2 = _mm512_xor_si512(high_down(round2_p0), s.round2_c2);
        out.c3 = round2_p0;
        return out;
    }

    // One round; k0, k1 the round's key in every lane.
    static void philox_round(PhiloxLanes& s, __m512i k0, __m512i k1) noexcept {
        const __m512i p0 = mul0(s.c0);
        const __m512i p1 = mul1(s.c2);
        s.c0 = _mm512_ternarylogic_epi32(high_down(p1), s.c1, k0, kXor3);
        s.c2 = _mm512_ternarylogic_epi32(high_down(p0), s.c3, k1, kXor3);
        s.c1 = p1;
        s.c3 = p0;
    }

    // The last round, and its 32 words in element order: the 64-bit lanes hold groups (0, 4, 1,
    // 5, 2, 6, 3, 7) + base, one group per 128-bit lane after the 64-bit unpacks. Words (c0, c1)
    // of a lane are (hi1 ^ c1 ^ k0, lo1): the product with its halves swapped, XORed with c1 and
    // k0 in the low halves only (and c2, c3 alike).
    static void philox_last_round(std::uint32_t* out, const PhiloxLanes& s, __m512i k0,
                                  __m512i k1) noexcept {
        const __m512i p0 = mul0(s.c0);
        const __m512i p1 = mul1(s.c2);
        const __m512i swapped1 = _mm512_shuffle_epi32(p1, _MM_PERM_CDAB);
        const __m512i swapped0 = _mm512_shuffle_epi32(p0, _MM_PERM_CDAB);
        const __m512i w01 = _mm512_mask_ternarylogic_epi32(swapped1, 0x5555, s.c1, k0, kXor3);
        const __m512i w23 = _mm512_mask_ternarylogic_epi32(swapped0, 0x5555, s.c3, k1, kXor3);
        _mm512_storeu_si512(out, _mm512_unpacklo_epi64(w01, w23));
        _mm512_storeu_si512(out + 16, _mm512_unpackhi_epi64(w01, w23));
    }

    // Philox4x32-10 for 16 groups (64 elements) at a time, as two interleaved PhiloxLanes.
    static void philox_words(std::uint32_t* out, const PhiloxSchedule& schedule,
                             std::uint64_t first_index, std::size_t count) noexcept {
        const __m512i lane_groups =
            _mm512_setr_epi32(0, 0, 4, 0, 1, 0, 5, 0, 2, 0, 6, 0, 3, 0, 7, 0);
        PhiloxSchedule other;  // for groups past a multiple of 2^32 groups (2^34 elements)
        for (std::size_t i = 0; i < count; i += 64) {
            const std::uint64_t group = (first_index + i) >> 2;  // a multiple of 16: no carry
            const PhiloxSchedule* s = &schedule;
            if (static_cast<std::uint32_t>(group >> 32) != schedule.group_high) [[unlikely]] {
                other = philox_schedule(schedule.seed, schedule.stream, first_index + i);
                s = &other;
            }
            const __m512i low =
                _mm512_add_epi32(set1_u32(static_cast<std::uint32_t>(group)), lane_groups);
            PhiloxLanes a = philox_first_rounds(low, *s);
            PhiloxLanes b = philox_first_rounds(_mm512_add_epi32(low, set1_u32(8)), *s);
            for (int round = 3; round < philox::kRounds - 1; ++round) {
                philox_round(a, s->key0[round], s->key1[round]);
                philox_round(b, s->key0[round], s->key1[round]);
            }
            constexpr int kLast = philox::kRounds - 1;
            philox_last_round(out + i, a, s->key0[kLast], s->key1[kLast]);
            philox_last_round(out + i + 32, b, s->key0[kLast], s->key1[kLast]);
        }
    }
};

constexpr StateKernelTable kAvx512StateTable = make_state_kernel_table<Avx512StateOps>();

}  // namespace

const StateKernelTable& avx512_state_kernel_table() noexcept {
    return kAvx512StateTable;
}

}  // namespace zinf::kernels::detail
