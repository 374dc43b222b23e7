// The Adam / AdamW step on the GPU, for partitions whose optimizer states stay in device memory.
// The math is PyTorch's (torch.optim.Adam / AdamW) and DeepSpeed's: bias-corrected moments,
// decoupled weight decay in AdamW mode, L2 added to the gradient otherwise, and AMSGrad.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/stream.h"
#include "src/base/dtype.h"
#include "src/base/status.h"

namespace zinf::kernels::cuda {

// The hyperparameters in double, as kernels::OptimizerParams holds them: the fp32 constants of
// the step come from the CPU optimizer's own step_constants, and the operation order is that of
// kernels/detail/optimizer_body.h with every rounding explicit, so that the GPU gives bitwise
// the results of the CPU's fused-multiply-add variants (AVX2, AVX-512), NaNs aside (the GPU
// makes one canonical NaN).
struct AdamStepParams {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.0;
    bool adam_w_mode = true;  // decoupled weight decay (AdamW); false: L2 added to the gradient
    std::int64_t step = 1;    // 1-based count of this step, for bias correction
    double grad_scale = 1.0;  // multiplies each gradient first (1 / loss scale, clipping factor)
    bool bias_correction = true;  // false: the moments are used as they are (step ignored)
    // Divide by the square root of the running maximum of exp_avg_sq (max_exp_avg_sq) instead
    // of exp_avg_sq's own, as torch's amsgrad=True.
    bool amsgrad = false;
};

// One step over `numel` elements, in place on device memory: fp32 `params`, `exp_avg`,
// `exp_avg_sq` and, when p.amsgrad, `max_exp_avg_sq` (else it is ignored and may be
// null); `grads` of dtype `grad_dtype`. When `param_copy` is not null, the updated parameters are
// also written there as `param_copy_dtype` (the bf16/fp16 working copy the model reads). All
// buffers have numel elements and do not overlap. Asynchronous on `stream`; numel 0 launches
// nothing; does not block or allocate. Returns kCuda when the launch fails.
Status adam_step(float* params, const void* grads, DType grad_dtype, float* exp_avg,
                 float* exp_avg_sq, float* max_exp_avg_sq, std::size_t numel,
                 const AdamStepParams& p, void* param_copy, DType param_copy_dtype, Stream stream);

}  // namespace zinf::kernels::cuda
