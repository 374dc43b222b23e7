// The AVX2 variant of the compressed-state step (kernels/detail/state_body.h): Avx2Ops plus the
// int8 and bf16 codes and an 8-lane Philox. Built with the AVX2 unit's flags.
#include "kernels/detail/ops_avx2.h"
#include "kernels/detail/state_body.h"
#include "kernels/detail/state_table.h"
#include "kernels/state_codec.h"
#include "src/base/philox.h"

namespace zinf::kernels::detail {
namespace {

struct Avx2StateOps : Avx2Ops {
    // Words per philox_words batch (count and first_index are multiples of it).
    static constexpr std::size_t kPhiloxBatch = 32;
    static __m256i set1_u32(std::uint32_t x) noexcept {
        return _mm256_set1_epi32(static_cast<int>(x));
    }
    static __m256i load_table(const std::int32_t* t) noexcept {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t));
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

    // decode_int8: scale * ratio, the ratio's bits made from the code by a table permute and an
    // integer add (make_decode_ratio_table; one multiply fewer than step * 2^e).
    template <bool kUnsigned>
    static F load_int8(const std::uint8_t* p, F scale) noexcept {
        constexpr int kCodeMax = kUnsigned ? kUnsignedCodeMax : kSignedCodeMax;
        static constexpr DecodeRatioTable kRatios = make_decode_ratio_table(kCodeMax);
        const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
        const __m256i q = kUnsigned ? _mm256_cvtepu8_epi32(bytes) : _mm256_cvtepi8_epi32(bytes);
        const __m256i c = kUnsigned ? q : _mm256_abs_epi32(q);
        const __m256i octave = _mm256_and_si256(_mm256_slli_epi32(c, 20), set1_u32(0xff800000u));
        const F ratio = _mm256_castsi256_ps(_mm256_add_epi32(
            _mm256_permutevar8x32_epi32(load_table(kRatios.bits), c), octave));  // index c & 7
        // psignd: 0 where c is 0, else x unchanged (c >= 0).
        __m256i x = _mm256_sign_epi32(_mm256_castps_si256(_mm256_mul_ps(scale, ratio)), c);
        if constexpr (!kUnsigned) {
            x = _mm256_xor_si256(x, _mm256_and_si256(q, set1_u32(0x80000000u)));
        }
        return _mm256_castsi256_ps(x);
    }

    // encode_int8's codes (int32 lanes): the octave from the exponent, the step
    // from the tables of the mantissa's top three bits (two midpoints at most per interval).
    // kClampMax false leaves codes above c_max (NaN, and |x| above the scale; below 1300)
    // to the caller: store_int8_x4's unsigned packs saturate them to 255 anyway. kMagnitude:
    // x is |x| already, so x * inv_scale needs no AND unless it is the NaN of inf * 0, whose
    // sign bit only raises its code (below 3400, still saturated, or clamped) to c_max.
    template <bool kUnsigned, bool kClampMax = true, bool kMagnitude = false>
    static __m256i int8_codes(F x, F inv_scale) noexcept {
        constexpr int kCodeMax = kUnsigned ? kUnsignedCodeMax : kSignedCodeMax;
        static constexpr OctaveStepTables<3> kTables = make_octave_step_tables<3>(kCodeMax);
        const __m256i product = _mm256_castps_si256(_mm256_mul_ps(x, inv_scale));
        const __m256i bits =
            kMagnitude ? product : _mm256_and_si256(product, set1_u32(0x7fffffffu));
        // 8 * exponent + the mantissa's top 3 bits; the permutes use those 3 bits.
        const __m256i index = _mm256_srli_epi32(bits, 20);
        const __m256i mantissa = _mm256_and_si256(bits, set1_u32(0x007fffffu));
        __m256i c =
            _mm256_add_epi32(index, _mm256_permutevar8x32_epi32(load_table(kTables.base), index));
        // A true comparison is -1.
        c = _mm256_sub_epi32(
            c, _mm256_cmpgt_epi32(mantissa,
                                  _mm256_permutevar8x32_epi32(load_table(kTables.first), index)));
        c = _mm256_sub_epi32(
            c, _mm256_cmpgt_epi32(mantissa,
                                  _mm256_permutevar8x32_epi32(load_table(kTables.second), index)));
        if constexpr (kClampMax) c = _mm256_min_epi32(c, _mm256_set1_epi32(kCodeMax));
        // Below the smallest code's lower threshold: 0 or 1, whichever is nearer.
        const float half_smallest = kUnsigned ? kUnsignedHalfSmallest : kSignedHalfSmallest;
        const __m256i at_least_half = _mm256_castps_si256(
            _mm256_cmp_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(half_smallest), _CMP_GE_OQ));
        c = _mm256_max_epi32(c, _mm256_srli_epi32(at_least_half, 31));
        if constexpr (!kUnsigned) {
            // psignd: -c where x's bits are negative, 0 where they are 0 (x = +0, whose code is
            // 0 anyway), else c: the two's complement code in one micro-op.
            c = _mm256_sign_epi32(c, _mm256_castps_si256(x));
        }
        return c;
    }

    template <bool kUnsigned>
    static void store_int8(std::uint8_t* p, F x, F inv_scale) noexcept {
        const __m256i c = int8_codes<kUnsigned>(x, inv_scale);
        const __m256i low = _mm256_and_si256(c, _mm256_set1_epi32(0xff));
        const __m256i bytes =
            _mm256_packus_epi16(_mm256_packus_epi32(low, low), _mm256_setzero_si256());
        // Each 128-bit half now starts with its four codes; gather the two dwords.
        const __m256i gathered =
            _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(gathered));
    }

    // Four vectors' codes packed into one 32-byte store (the codes fit their saturating packs).
    template <bool kUnsigned>
    static void store_int8_x4(std::uint8_t* p, const float* x, F inv_scale) noexcept {
        const __m256i c0 = int8_codes<kUnsigned, !kUnsigned, kUnsigned>(load(x), inv_scale);
        const __m256i c1 = int8_codes<kUnsigned, !kUnsigned, kUnsigned>(load(x + 8), inv_scale);
        const __m256i c2 = int8_codes<kUnsigned, !kUnsigned, kUnsigned>(load(x + 16), inv_scale);
        const __m256i c3 = int8_codes<kUnsigned, !kUnsigned, kUnsigned>(load(x + 24), inv_scale);
        __m256i bytes;
        if constexpr (kUnsigned) {
            bytes = _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3));
        } else {
            bytes = _mm256_packs_epi16(_mm256_packs_epi32(c0, c1), _mm256_packs_epi32(c2, c3));
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
    static void store_bf16_stochastic(std::uint16_t* p, F x, const std::uint32_t* words) noexcept {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words));
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
                                           const std::uint32_t* words) noexcept {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words));
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

    // Philox4x32-10 state of four groups, one in the low half of each 64-bit lane (the high
    // halves carry garbage that _mm256_mul_epu32 ignores), so that a round needs no blends.
    struct PhiloxLanes {
        __m256i c0, c1, c2, c3;
    };

    // What philox_words needs of (seed, stream), made once per chunk. Philox's counter is
    // (group low, group high, stream low, stream high) and only the group's low word differs
    // between the elements of a chunk, so the lanes of the first three rounds that do not depend
    // on it are constants here: round 0 multiplies only the group, round 1 only its c2, and
    // round 2's c3 is fixed. The round keys are vectors in memory, operands of the XORs (made
    // per round, their broadcasts cost as many shuffle-port micro-ops as the round's shuffles).
    struct PhiloxSchedule {
        __m256i key0[philox::kRounds];  // round r's key words in every lane
        __m256i key1[philox::kRounds];
        __m256i last_key0;  // the last round's key words in the low halves, zero above
        __m256i last_key1;
        __m256i round0_c2;  // stream high ^ key1[0]
        __m256i round1_c0;  // lo(M1 * stream low) ^ key0[1]
        __m256i round1_c2;  // hi(M0 * round 0's c0) ^ key1[1]
        __m256i round2_c2;  // lo(M0 * round 0's c0) ^ key1[2]
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
        s.last_key0 = _mm256_set1_epi64x(k0);
        s.last_key1 = _mm256_set1_epi64x(k1);
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

    static __m256i mul0(__m256i c) noexcept {
        return _mm256_mul_epu32(c, set1_u32(philox::kMultiplier0));
    }
    static __m256i mul1(__m256i c) noexcept {
        return _mm256_mul_epu32(c, set1_u32(philox::kMultiplier1));
    }
    static __m256i high_down(__m256i product) noexcept {
        return _mm256_shuffle_epi32(product, 0xF5);
    }

    // Rounds 0 to 2 of the groups whose low words are c0 (one in each 64-bit lane's low half).
    static PhiloxLanes philox_first_rounds(__m256i c0, const PhiloxSchedule& s) noexcept {
        const __m256i round0_p0 = mul0(c0);
        const __m256i round0_c2 = _mm256_xor_si256(high_down(round0_p0), s.round0_c2);
        // After round 0: c0 and c1 are constants, c3 is round0_p0.
        const __m256i round1_p1 = mul1(round0_c2);
        const __m256i round1_c0 = _mm256_xor_si256(high_down(round1_p1), s.round1_c0);
        const __m256i round1_c2 = _mm256_xor_si256(round0_p0, s.round1_c2);
        // After round 1: c1 is round1_p1, c3 a constant.
        const __m256i round2_p0 = mul0(round1_c0);
        const __m256i round2_p1 = mul1(round1_c2);
        PhiloxLanes out;
        out.c0 = _mm256_xor_si256(high_down(round2_p1), _mm256_xor_si256(round1_p1, s.key0[2]));
        out.c1 = round2_p1;
        out.c2 = _mm256_xor_si256(high_down(round2_p0), s.round2_c2);
        out.c3 = round2_p0;
        return out;
    }

    // One round; k0, k1 the round's key in every lane.
    static void philox_round(PhiloxLanes& s, __m256i k0, __m256i k1) noexcept {
        const __m256i p0 = mul0(s.c0);
        const __m256i p1 = mul1(s.c2);
        const __m256i c1_key = _mm256_xor_si256(s.c1, k0);  // off the multiply's path
        const __m256i c3_key = _mm256_xor_si256(s.c3, k1);
        s.c0 = _mm256_xor_si256(high_down(p1), c1_key);
        s.c2 = _mm256_xor_si256(high_down(p0), c3_key);
        s.c1 = p1;
        s.c3 = p0;
    }

    // The last round, and its 16 words in element order: the 64-bit lanes hold groups (0, 2, 1,
    // 3) + base, so that two groups sit in each 128-bit half after the 64-bit unpacks. Words
    // (c0, c1) of a lane are (hi1 ^ c1 ^ k0, lo1): the product with its halves swapped, XORed
    // with c1 ^ k0 in the low half only (and c2, c3 alike).
    static void philox_last_round(std::uint32_t* out, const PhiloxLanes& s,
                                  const PhiloxSchedule& schedule) noexcept {
        const __m256i p0 = mul0(s.c0);
        const __m256i p1 = mul1(s.c2);
        const __m256i zero = _mm256_setzero_si256();
        const __m256i c1_key =
            _mm256_xor_si256(_mm256_blend_epi32(s.c1, zero, 0xAA), schedule.last_key0);
        const __m256i c3_key =
            _mm256_xor_si256(_mm256_blend_epi32(s.c3, zero, 0xAA), schedule.last_key1);
        const __m256i w01 = _mm256_xor_si256(_mm256_shuffle_epi32(p1, 0xB1), c1_key);
        const __m256i w23 = _mm256_xor_si256(_mm256_shuffle_epi32(p0, 0xB1), c3_key);
        auto* dst = reinterpret_cast<__m256i*>(out);
        _mm256_storeu_si256(dst, _mm256_unpacklo_epi64(w01, w23));
        _mm256_storeu_si256(dst + 1, _mm256_unpackhi_epi64(w01, w23));
    }

    // Philox4x32-10 for 8 groups (32 elements) at a time, as two interleaved PhiloxLanes.
    static void philox_words(std::uint32_t* out, const PhiloxSchedule& schedule,
                             std::uint64_t first_index, std::size_t count) noexcept {
        const __m256i lane_groups = _mm256_setr_epi32(0, 0, 2, 0, 1, 0, 3, 0);
        PhiloxSchedule other;  // for groups past a multiple of 2^32 groups (2^34 elements)
        for (std::size_t i = 0; i < count; i += 32) {
            const std::uint64_t group = (first_index + i) >> 2;  // a multiple of 8: no carry
            const PhiloxSchedule* s = &schedule;
            if (static_cast<std::uint32_t>(group >> 32) != schedule.group_high) [[unlikely]] {
                other = philox_schedule(schedule.seed, schedule.stream, first_index + i);
                s = &other;
            }
            const __m256i low =
                _mm256_add_epi32(set1_u32(static_cast<std::uint32_t>(group)), lane_groups);
            PhiloxLanes a = philox_first_rounds(low, *s);
            PhiloxLanes b = philox_first_rounds(_mm256_add_epi32(low, set1_u32(4)), *s);
            for (int round = 3; round < philox::kRounds - 1; ++round) {
                philox_round(a, s->key0[round], s->key1[round]);
                philox_round(b, s->key0[round], s->key1[round]);
            }
            philox_last_round(out + i, a, *s);
            philox_last_round(out + i + 16, b, *s);
        }
    }
};

constexpr StateKernelTable kAvx2StateTable = make_state_kernel_table<Avx2StateOps>();

}  // namespace

const StateKernelTable& avx2_state_kernel_table() noexcept {
    return kAvx2StateTable;
}

}  // namespace zinf::kernels::detail
