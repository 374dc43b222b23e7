// The bound kernel in AVX-512 (built with AVX-512 F/BW/VL/DQ flags; see tools/CMakeLists.txt).
// GCC 12 warns inside its own AVX-512 headers (GCC PR 105593); silenced for them alone.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "tools/bench/adam_bound_body.h"

namespace zinf::bench {
namespace {

struct Avx512Ops {
    using F = __m512;
    static constexpr std::size_t kLanes = 16;
    static F load(const float* p) noexcept { return _mm512_loadu_ps(p); }
    static void store(float* p, F x) noexcept { _mm512_storeu_ps(p, x); }
    static F set1(float x) noexcept { return _mm512_set1_ps(x); }
    static F fmadd(F a, F b, F c) noexcept { return _mm512_fmadd_ps(a, b, c); }
    static F load_16bit(const std::uint16_t* p) noexcept {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    static void store_16bit(std::uint16_t* p, F x) noexcept {
        const __m512i high = _mm512_srli_epi32(_mm512_castps_si512(x), 16);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(high));
    }
    static F load_8bit(const std::uint8_t* p) noexcept {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
    }
    static void store_8bit(std::uint8_t* p, F x) noexcept {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                         _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(x)));
    }
};

}  // namespace

BoundChunkFn bound_chunk_avx512() noexcept {
    return &detail::bound_chunk<Avx512Ops>;
}

}  // namespace zinf::bench
