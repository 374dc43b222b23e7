// The bound kernel in AVX2 (built with -mavx2 -mfma -mf16c; see tools/CMakeLists.txt).
#include <immintrin.h>

#include "tools/bench/adam_bound_body.h"

namespace zinf::bench {
namespace {

struct Avx2Ops {
    using F = __m256;
    static constexpr std::size_t kLanes = 8;
    static F load(const float* p) noexcept { return _mm256_loadu_ps(p); }
    static void store(float* p, F x) noexcept { _mm256_storeu_ps(p, x); }
    static F set1(float x) noexcept { return _mm256_set1_ps(x); }
    static F fmadd(F a, F b, F c) noexcept { return _mm256_fmadd_ps(a, b, c); }
    // bf16-style widening and truncation: as many bytes as the optimizer moves, less work.
    static F load_16bit(const std::uint16_t* p) noexcept {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    static void store_16bit(std::uint16_t* p, F x) noexcept {
        const __m256i high = _mm256_srli_epi32(_mm256_castps_si256(x), 16);
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(high, high), 0x08);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
    }
    static F load_8bit(const std::uint8_t* p) noexcept {
        const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
        return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
    }
    static void store_8bit(std::uint8_t* p, F x) noexcept {
        const __m256i c = _mm256_and_si256(_mm256_cvttps_epi32(x), _mm256_set1_epi32(0xff));
        const __m256i bytes =
            _mm256_packus_epi16(_mm256_packus_epi32(c, c), _mm256_setzero_si256());
        const __m256i gathered =
            _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(gathered));
    }
};

}  // namespace

BoundChunkFn bound_chunk_avx2() noexcept {
    return &detail::bound_chunk<Avx2Ops>;
}

}  // namespace zinf::bench
