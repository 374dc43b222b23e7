// Span conversions between fp32 and bf16/fp16, through the chosen variant's chunk functions.
#include "kernels/cast.h"

#include "kernels/detail/kernel_table.h"
#include "kernels/optimizer.h"

namespace zinf::kernels {

std::string_view dtype_name(Dtype dtype) noexcept {
    switch (dtype) {
        case Dtype::kFp32:
            return "fp32";
        case Dtype::kBf16:
            return "bf16";
        case Dtype::kFp16:
            return "fp16";
    }
    return "unknown";
}

std::size_t dtype_size_bytes(Dtype dtype) noexcept {
    return dtype == Dtype::kFp32 ? 4 : 2;
}

void cast_from_fp32(Isa isa, std::span<const float> src, std::span<std::uint16_t> dst,
                    Dtype dst_dtype) noexcept {
    ZINF_ASSERT_EQ(src.size(), dst.size());
    ZINF_ASSERT(dst_dtype != Dtype::kFp32);
    const auto& table = kernel_table(isa);
    table.from_fp32[dst_dtype == Dtype::kBf16 ? 0 : 1](src.data(), dst.data(), src.size());
}

void cast_to_fp32(Isa isa, std::span<const std::uint16_t> src, Dtype src_dtype,
                  std::span<float> dst) noexcept {
    ZINF_ASSERT_EQ(src.size(), dst.size());
    ZINF_ASSERT(src_dtype != Dtype::kFp32);
    const auto& table = kernel_table(isa);
    table.to_fp32[src_dtype == Dtype::kBf16 ? 0 : 1](src.data(), dst.data(), src.size());
}

}  // namespace zinf::kernels
