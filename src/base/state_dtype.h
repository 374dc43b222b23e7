// How an optimizer's moments are stored: fp32 (exact, the default), bf16 with stochastic rounding,
// or int8 codes with one fp32 scale per block of kStateBlockNumel elements. The fp32 master
// parameters stay fp32 in every case. In src/base so that the config parser can name them; the
// arithmetic lives in kernels/ (kernels/README.md, "Compressed optimizer states").
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace zinf {

enum class StateDType : std::uint8_t { kFp32 = 0, kBf16 = 1, kInt8 = 2 };
inline constexpr int kStateDTypeCount = 3;

// Elements per int8 block, counted on the global flat index: block b holds elements
// [b * 2048, (b + 1) * 2048) of the whole flattened model. A span updated on its own (a
// partition, a sub-group) starts at a multiple of it, so that N ranks and re-partitioning give
// the same values as one rank. bf16 states keep the same rule (one rule for both).
inline constexpr std::size_t kStateBlockNumel = 2048;

constexpr std::string_view state_dtype_name(StateDType dtype) noexcept {
    switch (dtype) {
        case StateDType::kFp32:
            return "fp32";
        case StateDType::kBf16:
            return "bf16";
        case StateDType::kInt8:
            return "int8";
    }
    return "?";
}

// The dtype named `name` ("fp32", "bf16", "int8"), or nullopt.
constexpr std::optional<StateDType> find_state_dtype(std::string_view name) noexcept {
    for (const StateDType d : {StateDType::kFp32, StateDType::kBf16, StateDType::kInt8}) {
        if (state_dtype_name(d) == name) return d;
    }
    return std::nullopt;
}

// Bytes of one stored moment element (the int8 scales come on top: state_scale_count).
constexpr std::size_t state_element_size_bytes(StateDType dtype) noexcept {
    return dtype == StateDType::kFp32 ? 4 : dtype == StateDType::kBf16 ? 2 : 1;
}

// The fp32 scales one int8 moment of `numel` elements keeps (one per started block); 0 for the
// other dtypes.
constexpr std::size_t state_scale_count(StateDType dtype, std::size_t numel) noexcept {
    if (dtype != StateDType::kInt8) return 0;
    return (numel + kStateBlockNumel - 1) / kStateBlockNumel;
}

// Bytes one moment of `numel` elements takes as stored: its elements and its scales.
constexpr std::size_t state_moment_size_bytes(StateDType dtype, std::size_t numel) noexcept {
    return numel * state_element_size_bytes(dtype) + state_scale_count(dtype, numel) * 4;
}

// Where a stored moment of `numel` elements keeps its scales (int8): after its elements, at the
// next multiple of 4 bytes. A moment as the stores lay it out (host memory, swap files,
// checkpoints): elements, padding to 4 bytes, scales; state_moment_stored_bytes in all.
constexpr std::size_t state_scales_offset_bytes(StateDType dtype, std::size_t numel) noexcept {
    return (numel * state_element_size_bytes(dtype) + 3) / 4 * 4;
}
constexpr std::size_t state_moment_stored_bytes(StateDType dtype, std::size_t numel) noexcept {
    return dtype == StateDType::kInt8
               ? state_scales_offset_bytes(dtype, numel) + state_scale_count(dtype, numel) * 4
               : numel * state_element_size_bytes(dtype);
}

}  // namespace zinf
