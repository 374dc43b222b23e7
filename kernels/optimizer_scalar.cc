// The scalar variant of the CPU kernels: one element at a time, for any x86-64. Compiled with
// the baseline flags plus -ffp-contract=off, so a*b+c is always two roundings here (the SIMD
// variants fuse it), whatever flags a packager adds.
#include "kernels/detail/kernel_table.h"
#include "kernels/detail/ops_scalar.h"
#include "kernels/detail/optimizer_body.h"

namespace zinf::kernels::detail {
namespace {

constexpr KernelTable kScalarTable = make_kernel_table<ScalarOps>();

}  // namespace

const KernelTable& scalar_kernel_table() noexcept {
    return kScalarTable;
}

}  // namespace zinf::kernels::detail
