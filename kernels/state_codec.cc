// The span conversions of compressed moments (checkpoints, the swapper, tests), in scalar code.
#include "kernels/state_codec.h"

#include <algorithm>
#include <cstring>

#include "src/base/assert.h"

namespace zinf::kernels {
namespace {

float block_scale(std::span<const float> block) noexcept {
    float scale = 0.0f;
    for (const float x : block) {
        const float magnitude = bits_float(float_bits(x) & 0x7fffffffu);
        if (magnitude != magnitude) return bits_float(kCanonicalNanBits);
        if (magnitude > scale) scale = magnitude;
    }
    return scale;
}

void check_sizes(StateDType dtype, std::size_t numel, std::size_t stored_bytes,
                 std::size_t scale_count) noexcept {
    ZINF_ASSERT_EQ(stored_bytes, numel * state_element_size_bytes(dtype));
    ZINF_ASSERT_EQ(scale_count, state_scale_count(dtype, numel));
}

}  // namespace

void encode_moment(StateDType dtype, bool non_negative, std::span<const float> values,
                   std::span<std::byte> stored, std::span<float> scales) noexcept {
    check_sizes(dtype, values.size(), stored.size(), scales.size());
    if (dtype == StateDType::kFp32) {
        if (!values.empty()) std::memcpy(stored.data(), values.data(), stored.size());
        return;
    }
    if (dtype == StateDType::kBf16) {
        for (std::size_t i = 0; i < values.size(); ++i) {
            const std::uint16_t h = float_to_bf16(values[i]);
            std::memcpy(stored.data() + 2 * i, &h, sizeof h);
        }
        return;
    }
    auto* codes = reinterpret_cast<std::uint8_t*>(stored.data());
    for (std::size_t b = 0; b < scales.size(); ++b) {
        const std::size_t begin = b * kStateBlockNumel;
        const std::span<const float> block =
            values.subspan(begin, std::min(kStateBlockNumel, values.size() - begin));
        scales[b] = block_scale(block);
        const float inverse = int8_inverse_scale(scales[b]);
        for (std::size_t j = 0; j < block.size(); ++j) {
            codes[begin + j] = encode_int8(block[j], inverse, non_negative);
        }
    }
}

void decode_moment(StateDType dtype, bool non_negative, std::span<const std::byte> stored,
                   std::span<const float> scales, std::span<float> values) noexcept {
    check_sizes(dtype, values.size(), stored.size(), scales.size());
    if (dtype == StateDType::kFp32) {
        if (!values.empty()) std::memcpy(values.data(), stored.data(), stored.size());
        return;
    }
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (dtype == StateDType::kBf16) {
            std::uint16_t h;
            std::memcpy(&h, stored.data() + 2 * i, sizeof h);
            values[i] = bf16_to_float(h);
        } else {
            const auto code = static_cast<std::uint8_t>(stored[i]);
            values[i] = decode_int8(code, scales[i / kStateBlockNumel], non_negative);
        }
    }
}

}  // namespace zinf::kernels
