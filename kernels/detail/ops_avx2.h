// Private: the AVX2 + FMA + F16C vector operations (8 fp32 lanes) of the CPU kernels. Include only
// from units compiled with -mavx2 -mfma -mf16c -ffp-contract=off (kernels/CMakeLists.txt). The
// struct sits in an anonymous namespace, so every unit that includes this header gets its own copy
// and every template instantiated with it stays in that unit (see optimizer_body.h).
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace zinf::kernels::detail {
namespace {

// In an anonymous namespace so that every template instantiated with it stays in this unit.
struct Avx2Ops {
    using F = __m256;
    static constexpr std::size_t kLanes = 8;
    static constexpr int kAccLanes = 8;

    static F load(const float* p) noexcept { return _mm256_loadu_ps(p); }
    static void store(float* p, F x) noexcept { _mm256_storeu_ps(p, x); }
    // The 8 bf16 values loaded into both 128-bit halves (a load, no shuffle-port micro-op) and
    // one vpshufb that moves half j's four into the high 16 bits of its lanes and zeroes the low:
    // one micro-op instead of vpmovzxwd and a shift.
    static F load_bf16(const std::uint16_t* p) noexcept {
        const __m256i both =
            _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        const __m256i to_high =
            _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7,  //
                             -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1, -1, 14, 15);
        return _mm256_castsi256_ps(_mm256_shuffle_epi8(both, to_high));
    }
    static F load_fp16(const std::uint16_t* p) noexcept {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    }
    // Same rounding as float_to_bf16 in kernels/cast.h: add 0x7fff plus the lowest kept bit,
    // and for NaN set the quiet bit instead so that no NaN rounds into infinity.
    static void store_bf16(std::uint16_t* p, F x) noexcept {
        const __m256i bits = _mm256_castps_si256(x);
        const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
        const __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff));
        const __m256i rounded = _mm256_add_epi32(bits, bias);
        const __m256i quiet = _mm256_or_si256(bits, _mm256_set1_epi32(0x00400000));
        const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        const __m256i high = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
        // packus works within 128-bit halves; the permute gathers the two useful quarters.
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(high, high), 0x08);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
    }
    static void store_fp16(std::uint16_t* p, F x) noexcept {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                         _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    }
    static F set1(float x) noexcept { return _mm256_set1_ps(x); }
    static F add(F a, F b) noexcept { return _mm256_add_ps(a, b); }
    static F mul(F a, F b) noexcept { return _mm256_mul_ps(a, b); }
    static F div(F a, F b) noexcept { return _mm256_div_ps(a, b); }
    static F sqrt(F a) noexcept { return _mm256_sqrt_ps(a); }
    static F fmadd(F a, F b, F c) noexcept { return _mm256_fmadd_ps(a, b, c); }
    // VMAXPS returns b unless a > b, so a NaN in b comes through but one in a would be dropped:
    // the blend keeps it (NaN propagates from either side, like torch.maximum).
    static F max(F a, F b) noexcept {
        return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    }
    static F sign(F x) noexcept {
        const F magnitude_one =
            _mm256_or_ps(_mm256_and_ps(x, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(1.0f));
        const F nonzero = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_NEQ_UQ);
        const F nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
        return _mm256_blendv_ps(_mm256_and_ps(magnitude_one, nonzero), x, nan);
    }

    // Lane j of the accumulator takes element j of every 8-element vector.
    struct Acc {
        __m256d low;   // elements 0..3
        __m256d high;  // elements 4..7
    };
    static Acc acc_zero() noexcept { return {_mm256_setzero_pd(), _mm256_setzero_pd()}; }
    static void acc_add_squares(Acc& acc, F x) noexcept {
        // The square of an fp32 value is exact in double, so the FMA rounds only the sum.
        const __m256d low = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
        const __m256d high = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
        acc.low = _mm256_fmadd_pd(low, low, acc.low);
        acc.high = _mm256_fmadd_pd(high, high, acc.high);
    }
    static double acc_total(const Acc& acc) noexcept {
        alignas(32) double lanes[8];
        _mm256_store_pd(lanes, acc.low);
        _mm256_store_pd(lanes + 4, acc.high);
        double total = 0.0;
        for (const double lane : lanes) total += lane;
        return total;
    }
};

}  // namespace
}  // namespace zinf::kernels::detail
