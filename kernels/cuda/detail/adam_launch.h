// Private to kernels/cuda: the launch of the Adam kernel (adam.cu) with the constants the host
// wrapper (adam.cc) derived through the CPU optimizer's own step_constants.
#pragma once

#include <cstddef>

#include "kernels/cuda/stream.h"
#include "kernels/detail/kernel_table.h"
#include "src/base/dtype.h"
#include "src/base/status.h"

namespace zinf::kernels::cuda::detail {

// `l2`: add l2_weight_decay * p to the gradient (Adam with weight decay); otherwise the term is
// not computed at all. `max_exp_avg_sq` not null: AMSGrad, keeping the running maximum there.
// numel > 0; pointers checked by the caller.
Status launch_adam(float* params, const void* grads, DType grad_dtype, float* exp_avg,
                   float* exp_avg_sq, float* max_exp_avg_sq, std::size_t numel,
                   const kernels::detail::StepConstants& constants, bool l2, void* param_copy,
                   DType param_copy_dtype, Stream stream);

}  // namespace zinf::kernels::cuda::detail
