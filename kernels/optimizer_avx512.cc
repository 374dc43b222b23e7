// The AVX-512 variant of the CPU kernels: 16 fp32 lanes. Compiled with AVX-512 F/BW/VL/DQ
// flags and -ffp-contract=off (kernels/CMakeLists.txt); called only on CPUs that have them.
// Its arithmetic is operation for operation that of the AVX2 variant.

#include "kernels/detail/kernel_table.h"
#include "kernels/detail/ops_avx512.h"
#include "kernels/detail/optimizer_body.h"

namespace zinf::kernels::detail {
namespace {

constexpr KernelTable kAvx512Table = make_kernel_table<Avx512Ops>();

}  // namespace

const KernelTable& avx512_kernel_table() noexcept {
    return kAvx512Table;
}

}  // namespace zinf::kernels::detail
