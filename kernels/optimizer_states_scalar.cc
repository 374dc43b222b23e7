// The scalar variant of the compressed-state step (kernels/detail/state_body.h). Unlike the fp32
// scalar step it fuses a*b+c (std::fma), so that its results are bitwise those of the SIMD
// variants: a compressed state is the same whatever machine resumes it.
#include <cmath>

#include "kernels/detail/ops_scalar.h"
#include "kernels/detail/state_body.h"
#include "kernels/detail/state_table.h"
#include "kernels/state_codec.h"
#include "src/base/philox.h"

namespace zinf::kernels::detail {
namespace {

struct ScalarStateOps : ScalarOps {
    // Words per philox_words batch (count and first_index are multiples of it).
    static constexpr std::size_t kPhiloxBatch = 4;
    static F fmadd(F a, F b, F c) noexcept { return std::fma(a, b, c); }
    using U = std::uint32_t;
    static U max_magnitude_zero() noexcept { return 0; }
    static U max_magnitude(U acc, F x) noexcept {
        const std::uint32_t magnitude = float_bits(x) & 0x7fffffffu;
        return magnitude > acc ? magnitude : acc;
    }
    static F magnitude(F x) noexcept { return bits_float(float_bits(x) & 0x7fffffffu); }
    static U max_of_magnitudes(U acc, F magnitude) noexcept {
        return max_magnitude(acc, magnitude);
    }
    static float reduce_max_magnitude(U acc) noexcept {
        return bits_float(acc > 0x7f800000u ? kCanonicalNanBits : acc);
    }
    template <bool kUnsigned>
    static F load_int8(const std::uint8_t* p, F scale) noexcept {
        return decode_int8(*p, scale, kUnsigned);
    }
    template <bool kUnsigned>
    static void store_int8(std::uint8_t* p, F x, F inv_scale) noexcept {
        *p = encode_int8(x, inv_scale, kUnsigned);
    }
    template <bool kUnsigned>
    static void store_int8_x4(std::uint8_t* p, const float* x, F inv_scale) noexcept {
        for (int v = 0; v < 4; ++v) p[v] = encode_int8(x[v], inv_scale, kUnsigned);
    }
    template <int kShift>
    static void store_bf16_stochastic(std::uint16_t* p, F x, const std::uint32_t* words) noexcept {
        *p = float_to_bf16_stochastic(x, words[0] >> kShift);
    }
    static void store_bf16_stochastic_pair(std::uint16_t* p0, std::uint16_t* p1, F x0, F x1,
                                           const std::uint32_t* words) noexcept {
        *p0 = float_to_bf16_stochastic(x0, words[0]);
        *p1 = float_to_bf16_stochastic(x1, words[0] >> 16);
    }
    // The scalar unit is the definition: philox::philox4x32_10 itself, nothing precomputed.
    struct PhiloxSchedule {
        std::uint64_t seed, stream;
    };
    static PhiloxSchedule philox_schedule(std::uint64_t seed, std::uint64_t stream,
                                          std::uint64_t /*first_index*/) noexcept {
        return {seed, stream};
    }
    static void philox_words(std::uint32_t* out, const PhiloxSchedule& schedule,
                             std::uint64_t first_index, std::size_t count) noexcept {
        const philox::Key key = philox::make_key(schedule.seed);
        const std::uint64_t stream = schedule.stream;
        for (std::size_t i = 0; i < count; i += 4) {
            const std::uint64_t group = (first_index + i) >> 2;
            const philox::Counter words = philox::philox4x32_10(
                philox::Counter{
                    {static_cast<std::uint32_t>(group), static_cast<std::uint32_t>(group >> 32),
                     static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)}},
                key);
            for (int w = 0; w < 4; ++w) out[i + static_cast<std::size_t>(w)] = words.v[w];
        }
    }
};

constexpr StateKernelTable kScalarStateTable = make_state_kernel_table<ScalarStateOps>();

}  // namespace

const StateKernelTable& scalar_state_kernel_table() noexcept {
    return kScalarStateTable;
}

}  // namespace zinf::kernels::detail
