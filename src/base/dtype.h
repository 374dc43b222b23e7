// Element types of tensors and partitions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zinf {

enum class DType : std::uint8_t { kFloat32, kBFloat16, kFloat16 };

constexpr std::size_t dtype_size_bytes(DType dtype) noexcept {
    return dtype == DType::kFloat32 ? 4 : 2;
}

constexpr std::string_view dtype_name(DType dtype) noexcept {
    switch (dtype) {
        case DType::kFloat32: return "fp32";
        case DType::kBFloat16: return "bf16";
        case DType::kFloat16: return "fp16";
    }
    return "?";
}

}  // namespace zinf
