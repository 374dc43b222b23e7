// state_step: checks the call and fills the StateStepArgs with the CPU step's own functions
// (kernels/detail/state_args.h), then launches the kernel (optimizer_states.cu).
#include "kernels/cuda/optimizer_states.h"

#include <climits>
#include <cstdint>

#include "kernels/cuda/detail/optimizer_states_launch.h"
#include "kernels/detail/kernel_table.h"
#include "kernels/detail/state_args.h"
#include "kernels/detail/state_table.h"
#include "kernels/state_codec.h"
#include "src/base/assert.h"
#include "src/base/log.h"

namespace zinf::kernels::cuda {
namespace {

static_assert(static_cast<int>(StateDType::kBf16) - 1 == kernels::detail::kStateBf16);
static_assert(static_cast<int>(StateDType::kInt8) - 1 == kernels::detail::kStateInt8);
static_assert(kernels::detail::kKindCount == kBuiltinOptimizerCount);

}  // namespace

Status state_step(const OptimizerParams& params, const StoredState& state, GradView grads,
                  ParamCopy copy, Stream stream) {
    if (state.dtype == StateDType::kFp32) {
        return Status::not_supported(
            "cuda state_step: fp32 moments have no compressed-state kernel (use adam_step)");
    }
    ZINF_TRY(validate(params));
    const std::size_t numel = state.params.size();
    const std::size_t kept = optimizer_descriptor(params.kind).kept_moment_count(params.amsgrad);
    kernels::detail::assert_stored_state(state, kept);
    ZINF_ASSERT_EQ(grads.numel, numel);
    if (numel > 0) ZINF_ASSERT(grads.data != nullptr);
    const int copy_index = kernels::detail::copy_index_for(copy, numel);
    // As the CPU step: Adam without weight decay takes AdamW's path (no L2 term at all).
    OptimizerKind kind = params.kind;
    if (kind == OptimizerKind::kAdam && params.weight_decay == 0.0) kind = OptimizerKind::kAdamW;
    const auto index = static_cast<std::size_t>(kind);
    if (index >= kBuiltinOptimizerCount) {
        return Status::not_supported(
            str_cat("cuda state_step: optimizer ", optimizer_kind_name(kind), ": no ",
                    state_dtype_name(state.dtype), " state kernel (built-in optimizers only)"));
    }
    if (numel == 0) return Status::ok();
    // One thread block per 2048-element block.
    ZINF_ASSERT_LE(state_scale_count(StateDType::kInt8, numel), std::size_t{INT_MAX});
    detail::StateLaunch launch{};
    launch.args = kernels::detail::state_step_args(params, state, grads, copy, kept);
    launch.numel = numel;
    launch.state = static_cast<int>(state.dtype) - 1;
    launch.kind = static_cast<int>(index);
    launch.amsgrad = params.amsgrad;
    launch.grad_dtype = grads.dtype;
    launch.copy_index = copy_index;
    return detail::launch_state_step(launch, stream);
}

}  // namespace zinf::kernels::cuda
