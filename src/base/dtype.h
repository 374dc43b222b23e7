// Element types of tensors, partitions, gradients and kernel operands.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zinf {

// The one element-type enum of the project: tensors, partitions, gradients and the kernels'
// 16-bit copies. bf16 and fp16 values travel as their raw 16-bit patterns (std::uint16_t): C++20
// has no arithmetic 16-bit float type, and the kernels only ever convert them. The values index
// the kernels' tables.
enum class DType : std::uint8_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };
inline constexpr int kDTypeCount = 3;

constexpr std::size_t dtype_size_bytes(DType dtype) noexcept {
    return dtype == DType::kFloat32 ? 4 : 2;
}

constexpr std::string_view dtype_name(DType dtype) noexcept {
    switch (dtype) {
        case DType::kFloat32:
            return "fp32";
        case DType::kBFloat16:
            return "bf16";
        case DType::kFloat16:
            return "fp16";
    }
    return "?";
}

}  // namespace zinf
