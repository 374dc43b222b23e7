// The scalar variant of the compressed-state step (kernels/detail/state_body.h). Unlike the fp32
// scalar step it fuses a*b+c (std::fma), so that its results are bitwise those of the SIMD
// variants: a compressed state is the same whatever machine resumes it.
#include <cmath>

#include "kernels/detail/ops_scalar.h"
#include "kernels/detail/state_body.h"
#include "kernels/detail/state_table.h"
#include "kernels/state_codec.h"

namespace zinf::kernels::detail {
namespace {

struct ScalarStateOps : ScalarOps {
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
    using W = std::uint32_t;
    static W rounding_words(std::uint32_t run_key, std::uint32_t index_low) noexcept {
        return rounding_word(run_key, index_low);
    }
    struct R {
        std::uint32_t run_key;
        std::uint32_t index_low;
    };
    static R rounding_base(std::uint32_t run_key, std::uint32_t index_low) noexcept {
        return {run_key, index_low};
    }
    template <int kVector>
    static W rounding_words_at(R base) noexcept {
        return rounding_word(base.run_key, base.index_low + kVector);
    }
    template <bool kUnsigned>
    static F load_int8(const std::uint8_t* p, F scale) noexcept {
        return decode_int8(*p, scale, kUnsigned);
    }
    template <bool kUnsigned, int kShift>
    static void store_int8(std::uint8_t* p, F x, F inv_scale, W words) noexcept {
        *p = encode_int8_stochastic(x, inv_scale, kUnsigned, words >> kShift);
    }
    template <bool kUnsigned, int kShift>
    static void store_int8_x4(std::uint8_t* p, const float* x, F inv_scale,
                              const W* words) noexcept {
        for (int v = 0; v < 4; ++v) {
            p[v] = encode_int8_stochastic(x[v], inv_scale, kUnsigned, words[v] >> kShift);
        }
    }
    template <int kShift>
    static void store_bf16_stochastic(std::uint16_t* p, F x, W words) noexcept {
        *p = float_to_bf16_stochastic(x, words >> kShift);
    }
    static void store_bf16_stochastic_pair(std::uint16_t* p0, std::uint16_t* p1, F x0, F x1,
                                           W words) noexcept {
        *p0 = float_to_bf16_stochastic(x0, words);
        *p1 = float_to_bf16_stochastic(x1, words >> 16);
    }
};

constexpr StateKernelTable kScalarStateTable = make_state_kernel_table<ScalarStateOps>();

}  // namespace

const StateKernelTable& scalar_state_kernel_table() noexcept {
    return kScalarStateTable;
}

}  // namespace zinf::kernels::detail
