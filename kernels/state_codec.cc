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

StoredMoment split_stored_moment(StateDType dtype, std::span<std::byte> laid_out,
                                 std::size_t numel) noexcept {
    ZINF_ASSERT_EQ(laid_out.size(), state_moment_stored_bytes(dtype, numel));
    StoredMoment m;
    m.elements = laid_out.first(numel * state_element_size_bytes(dtype));
    const std::size_t scales = state_scale_count(dtype, numel);
    if (scales > 0) {
        std::byte* at = laid_out.data() + state_scales_offset_bytes(dtype, numel);
        ZINF_ASSERT(reinterpret_cast<std::uintptr_t>(at) % alignof(float) == 0);
        m.scales = std::span<float>(reinterpret_cast<float*>(at), scales);
    }
    return m;
}

void encode_stored_moment(StateDType dtype, bool non_negative, std::span<const float> values,
                          std::span<std::byte> laid_out) noexcept {
    const StoredMoment m = split_stored_moment(dtype, laid_out, values.size());
    // The padding between the elements and the scales is written too (no stale bytes on disk).
    const std::size_t pad_from = m.elements.size();
    const std::size_t pad_to = state_scales_offset_bytes(dtype, values.size());
    if (m.scales.data() != nullptr && pad_to > pad_from) {
        std::memset(laid_out.data() + pad_from, 0, pad_to - pad_from);
    }
    encode_moment(dtype, non_negative, values, m.elements, m.scales);
}

void decode_stored_moment(StateDType dtype, bool non_negative, std::span<const std::byte> laid_out,
                          std::span<float> values) noexcept {
    // split_stored_moment only reads through the spans it returns here.
    const StoredMoment m = split_stored_moment(
        dtype, std::span<std::byte>(const_cast<std::byte*>(laid_out.data()), laid_out.size()),
        values.size());
    decode_moment(dtype, non_negative, m.elements, m.scales, values);
}

}  // namespace zinf::kernels
