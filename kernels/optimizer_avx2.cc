// The AVX2 + FMA + F16C variant of the CPU kernels: 8 fp32 lanes. Compiled with
// -mavx2 -mfma -mf16c -ffp-contract=off (kernels/CMakeLists.txt); called only on CPUs that
// have them. Its arithmetic is operation for operation that of the AVX-512 variant.
#include "kernels/detail/kernel_table.h"
#include "kernels/detail/ops_avx2.h"
#include "kernels/detail/optimizer_body.h"

namespace zinf::kernels::detail {
namespace {

constexpr KernelTable kAvx2Table = make_kernel_table<Avx2Ops>();

}  // namespace

const KernelTable& avx2_kernel_table() noexcept {
    return kAvx2Table;
}

}  // namespace zinf::kernels::detail
