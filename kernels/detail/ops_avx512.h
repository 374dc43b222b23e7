// Private: the AVX-512 vector operations (16 fp32 lanes) of the CPU kernels. Include only from
// units compiled with the AVX-512 F/BW/VL/DQ flags and -ffp-contract=off (kernels/CMakeLists.txt).
// The struct sits in an anonymous namespace, so every unit that includes this header gets its own
// copy and every template instantiated with it stays in that unit (see optimizer_body.h).
#pragma once

// GCC 12 warns inside its own AVX-512 headers (the _mm512_undefined_* idiom, GCC PR 105593,
// fixed in GCC 13); the warning carries the header's location, so this scope silences it there
// and nowhere else.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstddef>
#include <cstdint>

namespace zinf::kernels::detail {
namespace {

// In an anonymous namespace so that every template instantiated with it stays in this unit.
struct Avx512Ops {
    using F = __m512;
    static constexpr std::size_t kLanes = 16;
    static constexpr int kAccLanes = 16;

    static F load(const float* p) noexcept { return _mm512_loadu_ps(p); }
    static void store(float* p, F x) noexcept { _mm512_storeu_ps(p, x); }
    static F load_bf16(const std::uint16_t* p) noexcept {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    static F load_fp16(const std::uint16_t* p) noexcept {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    }
    // Same rounding as float_to_bf16 in kernels/cast.h. VCVTNEPS2BF16 (AVX512_BF16) is not
    // used: it flushes denormals to zero, and not every AVX-512 CPU has it.
    static void store_bf16(std::uint16_t* p, F x) noexcept {
        const __m512i bits = _mm512_castps_si512(x);
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
        const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff));
        const __m512i rounded = _mm512_add_epi32(bits, bias);
        const __m512i quiet = _mm512_or_si512(bits, _mm512_set1_epi32(0x00400000));
        const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        const __m512i high = _mm512_srli_epi32(_mm512_mask_blend_epi32(nan, rounded, quiet), 16);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(high));
    }
    static void store_fp16(std::uint16_t* p, F x) noexcept {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                            _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    }
    static F set1(float x) noexcept { return _mm512_set1_ps(x); }
    static F add(F a, F b) noexcept { return _mm512_add_ps(a, b); }
    static F mul(F a, F b) noexcept { return _mm512_mul_ps(a, b); }
    static F div(F a, F b) noexcept { return _mm512_div_ps(a, b); }
    static F sqrt(F a) noexcept { return _mm512_sqrt_ps(a); }
    static F fmadd(F a, F b, F c) noexcept { return _mm512_fmadd_ps(a, b, c); }
    // As Avx2Ops::max: VMAXPS (b unless a > b), then a NaN in a is kept.
    static F max(F a, F b) noexcept {
        return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), _mm512_max_ps(a, b), a);
    }
    static F sign(F x) noexcept {
        const F magnitude_one =
            _mm512_or_ps(_mm512_and_ps(x, _mm512_set1_ps(-0.0f)), _mm512_set1_ps(1.0f));
        const __mmask16 nonzero = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_NEQ_UQ);
        const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        return _mm512_mask_blend_ps(nan, _mm512_maskz_mov_ps(nonzero, magnitude_one), x);
    }

    // Lane j of the accumulator takes element j of every 16-element vector.
    struct Acc {
        __m512d low;   // elements 0..7
        __m512d high;  // elements 8..15
    };
    static Acc acc_zero() noexcept { return {_mm512_setzero_pd(), _mm512_setzero_pd()}; }
    static void acc_add_squares(Acc& acc, F x) noexcept {
        // The square of an fp32 value is exact in double, so the FMA rounds only the sum.
        const __m512d low = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
        const __m512d high =
            _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
        acc.low = _mm512_fmadd_pd(low, low, acc.low);
        acc.high = _mm512_fmadd_pd(high, high, acc.high);
    }
    static double acc_total(const Acc& acc) noexcept {
        alignas(64) double lanes[16];
        _mm512_store_pd(lanes, acc.low);
        _mm512_store_pd(lanes + 8, acc.high);
        double total = 0.0;
        for (const double lane : lanes) total += lane;
        return total;
    }
};

}  // namespace
}  // namespace zinf::kernels::detail
