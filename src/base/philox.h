// Philox4x32-10, the counter-based random generator of Salmon et al. (SC'11, "Parallel random
// numbers: as easy as 1, 2, 3"; the Random123 and cuRAND generator), and the two uses the
// project makes of it: dropout masks and parameter initialisation. A random word is a pure
// function of (key, counter), so any thread, any thread count and a GPU produce the same words
// for the same element: this header is the definition that CPU and CUDA code share.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ZINF_HOST_DEVICE __host__ __device__
#else
#define ZINF_HOST_DEVICE
#endif

namespace zinf::philox {

struct Counter {
    std::uint32_t v[4];
};
struct Key {
    std::uint32_t v[2];
};

inline constexpr std::uint32_t kMultiplier0 = 0xD2511F53u;
inline constexpr std::uint32_t kMultiplier1 = 0xCD9E8D57u;
inline constexpr std::uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
inline constexpr std::uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1
inline constexpr int kRounds = 10;

ZINF_HOST_DEVICE constexpr Counter philox4x32_10(Counter counter, Key key) noexcept {
    for (int round = 0; round < kRounds; ++round) {
        if (round > 0) {
            key.v[0] += kWeyl0;
            key.v[1] += kWeyl1;
        }
        const std::uint64_t product0 = std::uint64_t{kMultiplier0} * counter.v[0];
        const std::uint64_t product1 = std::uint64_t{kMultiplier1} * counter.v[2];
        const auto hi0 = static_cast<std::uint32_t>(product0 >> 32);
        const auto lo0 = static_cast<std::uint32_t>(product0);
        const auto hi1 = static_cast<std::uint32_t>(product1 >> 32);
        const auto lo1 = static_cast<std::uint32_t>(product1);
        counter = Counter{{hi1 ^ counter.v[1] ^ key.v[0], lo1, hi0 ^ counter.v[3] ^ key.v[1], lo0}};
    }
    return counter;
}

ZINF_HOST_DEVICE constexpr Key make_key(std::uint64_t seed) noexcept {
    return Key{{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
}

// The 32-bit word for element `index` of a stream identified by (seed, stream_hi): each Philox
// call yields four words, used by four consecutive elements. Counter layout:
// {index/4 low, index/4 high, stream low, stream high}.
ZINF_HOST_DEVICE constexpr std::uint32_t element_word(std::uint64_t seed, std::uint64_t stream,
                                                      std::uint64_t index) noexcept {
    const std::uint64_t group = index >> 2;
    const Counter out = philox4x32_10(
        Counter{{static_cast<std::uint32_t>(group), static_cast<std::uint32_t>(group >> 32),
                 static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)}},
        make_key(seed));
    return out.v[index & 3];
}

// A uniform float in [0, 1) from the top 24 bits of a word: exact in fp32, identical everywhere.
ZINF_HOST_DEVICE constexpr float word_to_unit_float(std::uint32_t word) noexcept {
    return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
}

// SplitMix64's finaliser: derives independent seeds (per module, per parameter) from one seed.
ZINF_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Dropout: element `index` of the mask for (seed, step) is kept when its word is at least
// dropout_threshold(p) = floor(p * 2^32), so P(drop) = p to within 2^-32. Kept elements are
// scaled by 1 / (1 - p) computed in fp32 (`1.0f / (1.0f - p)`), so y = x * scale is the same
// single rounding on every implementation.
ZINF_HOST_DEVICE constexpr std::uint32_t dropout_threshold(float p) noexcept {
    // p < 1 is a precondition of the callers; 4294967296.0 * p is then below 2^32.
    return static_cast<std::uint32_t>(static_cast<double>(p) * 4294967296.0);
}
ZINF_HOST_DEVICE constexpr bool dropout_keep(std::uint64_t seed, std::uint64_t step,
                                             std::uint64_t index,
                                             std::uint32_t threshold) noexcept {
    return element_word(seed, step, index) >= threshold;
}

}  // namespace zinf::philox
