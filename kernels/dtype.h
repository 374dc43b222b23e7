// The element types the CPU kernels read and write: fp32 master data, and bf16 or fp16 for
// gradients and for the low-precision copy of the parameters.
#pragma once

#include <cstdint>
#include <string_view>

namespace zinf::kernels {

// bf16 and fp16 values travel as their raw 16-bit patterns (std::uint16_t): C++20 has no
// arithmetic 16-bit float type, and the kernels only ever convert them.
enum class Dtype : std::uint8_t { kFp32 = 0, kBf16 = 1, kFp16 = 2 };
inline constexpr int kDtypeCount = 3;

std::string_view dtype_name(Dtype dtype) noexcept;
// Bytes per element: 4 for fp32, 2 for bf16 and fp16.
std::size_t dtype_size_bytes(Dtype dtype) noexcept;

}  // namespace zinf::kernels
