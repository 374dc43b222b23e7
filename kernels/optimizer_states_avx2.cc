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
    static __m256i set1_u32(std::uint32_t x) noexcept {
        return _mm256_set1_epi32(static_cast<int>(x));
    }
    static F abs(F x) noexcept {
        return _mm256_and_ps(x, _mm256_castsi256_ps(set1_u32(0x7fffffffu)));
    }

    // decode_int8: scale * (kOctaveSteps[level & 7] * 2^(level >> 3)), level = c - c_max.
    template <bool kUnsigned>
    static F load_int8(const std::uint8_t* p, F scale) noexcept {
        const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
        const __m256i q = kUnsigned ? _mm256_cvtepu8_epi32(bytes) : _mm256_cvtepi8_epi32(bytes);
        const __m256i c = kUnsigned ? q : _mm256_abs_epi32(q);
        const int code_max = kUnsigned ? kUnsignedCodeMax : kSignedCodeMax;
        const __m256i level = _mm256_sub_epi32(c, _mm256_set1_epi32(code_max));
        const F steps = _mm256_loadu_ps(kOctaveSteps);
        const F step = _mm256_permutevar8x32_ps(steps, level);  // uses level's low 3 bits
        const __m256i biased =
            _mm256_add_epi32(_mm256_srai_epi32(level, 3), _mm256_set1_epi32(127));
        const F ratio = _mm256_mul_ps(step, _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23)));
        const __m256i nonzero = _mm256_cmpgt_epi32(c, _mm256_setzero_si256());
        F x = _mm256_and_ps(_mm256_mul_ps(scale, ratio), _mm256_castsi256_ps(nonzero));
        if constexpr (!kUnsigned) {
            const __m256i negative = _mm256_cmpgt_epi32(_mm256_setzero_si256(), q);
            x = _mm256_xor_ps(
                x, _mm256_castsi256_ps(_mm256_and_si256(negative, set1_u32(0x80000000u))));
        }
        return x;
    }

    // encode_int8: the octave from the exponent, the step from eight comparisons.
    template <bool kUnsigned>
    static void store_int8(std::uint8_t* p, F x, F inv_scale) noexcept {
        const int code_max = kUnsigned ? kUnsignedCodeMax : kSignedCodeMax;
        const F r = _mm256_mul_ps(abs(x), inv_scale);
        const __m256i bits = _mm256_castps_si256(r);
        const __m256i exponent =
            _mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(127));
        const F mantissa = _mm256_castsi256_ps(
            _mm256_or_si256(_mm256_and_si256(bits, set1_u32(0x007fffffu)), set1_u32(0x3f800000u)));
        __m256i steps = _mm256_setzero_si256();
        for (const float threshold : kOctaveMidpoints) {
            const F ge = _mm256_cmp_ps(mantissa, _mm256_set1_ps(threshold), _CMP_GE_OQ);
            steps = _mm256_sub_epi32(steps, _mm256_castps_si256(ge));  // a true mask is -1
        }
        __m256i c = _mm256_add_epi32(_mm256_set1_epi32(code_max),
                                     _mm256_add_epi32(_mm256_slli_epi32(exponent, 3), steps));
        c = _mm256_min_epi32(c, _mm256_set1_epi32(code_max));
        const float half_smallest = kUnsigned ? kUnsignedHalfSmallest : kSignedHalfSmallest;
        const __m256i smallest = _mm256_and_si256(
            _mm256_castps_si256(_mm256_cmp_ps(r, _mm256_set1_ps(half_smallest), _CMP_GE_OQ)),
            _mm256_set1_epi32(1));
        c = _mm256_blendv_epi8(c, smallest, _mm256_cmpgt_epi32(_mm256_set1_epi32(1), c));
        if constexpr (!kUnsigned) {
            const __m256i negative = _mm256_srai_epi32(_mm256_castps_si256(x), 31);
            c = _mm256_sub_epi32(_mm256_xor_si256(c, negative), negative);
        }
        const __m256i low = _mm256_and_si256(c, _mm256_set1_epi32(0xff));
        const __m256i bytes =
            _mm256_packus_epi16(_mm256_packus_epi32(low, low), _mm256_setzero_si256());
        // Each 128-bit half now starts with its four codes; gather the two dwords.
        const __m256i gathered =
            _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(gathered));
    }

    // float_to_bf16_stochastic with (word >> shift) & 0xffff of each lane's word.
    static void store_bf16_stochastic(std::uint16_t* p, F x, const std::uint32_t* words,
                                      int shift) noexcept {
        const __m256i bits = _mm256_castps_si256(x);
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words));
        const __m256i random = _mm256_and_si256(_mm256_srl_epi32(w, _mm_cvtsi32_si128(shift)),
                                                _mm256_set1_epi32(0xffff));
        const __m256i rounded = _mm256_add_epi32(bits, random);
        const __m256i quiet = _mm256_or_si256(bits, _mm256_set1_epi32(0x00400000));
        const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        const __m256i high = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(high, high), 0x08);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
    }

    // The high and low words of a * m per 32-bit lane (m in every lane).
    static void mul_wide(__m256i a, __m256i m, __m256i& hi, __m256i& lo) noexcept {
        const __m256i even = _mm256_mul_epu32(a, m);
        const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
        hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
        lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
    }

    // Philox4x32-10 for 8 groups (32 elements) at a time. Lane 4l + r holds group 2r + l, so
    // that the in-lane 4x4 transpose leaves the words in element order.
    static void philox_words(std::uint32_t* out, std::uint64_t seed, std::uint64_t stream,
                             std::uint64_t first_index, std::size_t count) noexcept {
        const __m256i lane_groups = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
        const __m256i m0 = set1_u32(philox::kMultiplier0);
        const __m256i m1 = set1_u32(philox::kMultiplier1);
        for (std::size_t i = 0; i < count; i += 32) {
            const std::uint64_t group = (first_index + i) >> 2;  // a multiple of 8: no carry
            __m256i c0 = _mm256_add_epi32(set1_u32(static_cast<std::uint32_t>(group)), lane_groups);
            __m256i c1 = set1_u32(static_cast<std::uint32_t>(group >> 32));
            __m256i c2 = set1_u32(static_cast<std::uint32_t>(stream));
            __m256i c3 = set1_u32(static_cast<std::uint32_t>(stream >> 32));
            auto k0 = static_cast<std::uint32_t>(seed);
            auto k1 = static_cast<std::uint32_t>(seed >> 32);
            for (int round = 0; round < philox::kRounds; ++round) {
                if (round > 0) {
                    k0 += philox::kWeyl0;
                    k1 += philox::kWeyl1;
                }
                __m256i hi0, lo0, hi1, lo1;
                mul_wide(c0, m0, hi0, lo0);
                mul_wide(c2, m1, hi1, lo1);
                c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), set1_u32(k0));
                c1 = lo1;
                c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), set1_u32(k1));
                c3 = lo0;
            }
            const __m256i a = _mm256_unpacklo_epi32(c0, c1);
            const __m256i b = _mm256_unpacklo_epi32(c2, c3);
            const __m256i c = _mm256_unpackhi_epi32(c0, c1);
            const __m256i d = _mm256_unpackhi_epi32(c2, c3);
            auto* dst = reinterpret_cast<__m256i*>(out + i);
            _mm256_storeu_si256(dst, _mm256_unpacklo_epi64(a, b));
            _mm256_storeu_si256(dst + 1, _mm256_unpackhi_epi64(a, b));
            _mm256_storeu_si256(dst + 2, _mm256_unpacklo_epi64(c, d));
            _mm256_storeu_si256(dst + 3, _mm256_unpackhi_epi64(c, d));
        }
    }
};

constexpr StateKernelTable kAvx2StateTable = make_state_kernel_table<Avx2StateOps>();

}  // namespace

const StateKernelTable& avx2_state_kernel_table() noexcept {
    return kAvx2StateTable;
}

}  // namespace zinf::kernels::detail
