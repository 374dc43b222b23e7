// adam_step: checks the call and derives the step's fp32 constants with the CPU optimizer's
// step_constants, then launches the kernel (adam.cu).
#include "kernels/cuda/adam.h"

#include "kernels/cuda/detail/adam_launch.h"
#include "kernels/detail/kernel_table.h"
#include "kernels/optimizer.h"
#include "src/base/assert.h"

namespace zinf::kernels::cuda {

Status adam_step(float* params, const void* grads, DType grad_dtype, float* exp_avg,
                 float* exp_avg_sq, float* max_exp_avg_sq, std::size_t numel,
                 const AdamStepParams& p, void* param_copy, DType param_copy_dtype, Stream stream) {
    if (numel == 0) return Status::ok();
    ZINF_ASSERT(params != nullptr);
    ZINF_ASSERT(grads != nullptr);
    ZINF_ASSERT(exp_avg != nullptr);
    ZINF_ASSERT(exp_avg_sq != nullptr);
    if (p.amsgrad) ZINF_ASSERT(max_exp_avg_sq != nullptr);
    ZINF_ASSERT_GE(p.step, std::int64_t{1});
    ZINF_ASSERT_GE(p.beta1, 0.0);
    ZINF_ASSERT_LT(p.beta1, 1.0);
    ZINF_ASSERT_GE(p.beta2, 0.0);
    ZINF_ASSERT_LT(p.beta2, 1.0);
    // Adam without weight decay is AdamW without it: no L2 term, as the CPU optimizer does.
    const bool l2 = !p.adam_w_mode && p.weight_decay != 0.0;
    OptimizerParams op;
    op.kind = l2 ? OptimizerKind::kAdam : OptimizerKind::kAdamW;
    op.step = static_cast<std::uint64_t>(p.step);
    op.lr = p.lr;
    op.beta1 = p.beta1;
    op.beta2 = p.beta2;
    op.eps = p.eps;
    op.weight_decay = p.weight_decay;
    op.grad_scale = p.grad_scale;
    op.bias_correction = p.bias_correction;
    op.amsgrad = p.amsgrad;
    const kernels::detail::StepConstants constants = kernels::detail::step_constants(op);
    return detail::launch_adam(params, grads, grad_dtype, exp_avg, exp_avg_sq,
                               p.amsgrad ? max_exp_avg_sq : nullptr, numel, constants, l2,
                               param_copy, param_copy_dtype, stream);
}

}  // namespace zinf::kernels::cuda
