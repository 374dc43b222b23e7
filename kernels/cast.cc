// Span conversions between fp32 and bf16/fp16, through the chosen variant's chunk functions.
#include "kernels/cast.h"

#include "kernels/detail/kernel_table.h"
#include "kernels/optimizer.h"

namespace zinf::kernels {

void cast_from_fp32(Isa isa, std::span<const float> src, std::span<std::uint16_t> dst,
                    DType dst_dtype) noexcept {
    ZINF_ASSERT_EQ(src.size(), dst.size());
    ZINF_ASSERT(dst_dtype != DType::kFloat32);
    const auto& table = kernel_table(isa);
    table.from_fp32[dst_dtype == DType::kBFloat16 ? 0 : 1](src.data(), dst.data(), src.size());
}

void cast_to_fp32(Isa isa, std::span<const std::uint16_t> src, DType src_dtype,
                  std::span<float> dst) noexcept {
    ZINF_ASSERT_EQ(src.size(), dst.size());
    ZINF_ASSERT(src_dtype != DType::kFloat32);
    const auto& table = kernel_table(isa);
    table.to_fp32[src_dtype == DType::kBFloat16 ? 0 : 1](src.data(), dst.data(), src.size());
}

}  // namespace zinf::kernels
