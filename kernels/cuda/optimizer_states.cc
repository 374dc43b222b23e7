// state_step: checks the call as the CPU step over a StoredState does (kernels/optimizer.cc),
// fills the same StateStepArgs with the CPU's step_constants and rounding streams, then launches
// the kernel (optimizer_states.cu).
#include "kernels/cuda/optimizer_states.h"

#include <climits>
#include <cstdint>

#include "kernels/cuda/detail/optimizer_states_launch.h"
#include "kernels/detail/kernel_table.h"
#include "kernels/detail/state_table.h"
#include "kernels/state_codec.h"
#include "src/base/assert.h"
#include "src/base/log.h"

namespace zinf::kernels::cuda {
namespace {

static_assert(static_cast<int>(StateDType::kBf16) - 1 == kernels::detail::kStateBf16);
static_assert(static_cast<int>(StateDType::kInt8) - 1 == kernels::detail::kStateInt8);
static_assert(kernels::detail::kKindCount == kBuiltinOptimizerCount);

// The sizes, alignment and first index of a compressed StoredState: the CPU step's checks
// (assert_stored_state in kernels/optimizer.cc), on the spans' sizes and addresses only.
void assert_stored_state(const StoredState& state, std::size_t kept) noexcept {
    const std::size_t numel = state.params.size();
    ZINF_ASSERT(state.first_index % kStateBlockNumel == 0);
    for (std::size_t i = 0; i < kMaxMoments; ++i) {
        if (i >= kept) {
            ZINF_ASSERT(state.moments[i].empty());
            ZINF_ASSERT(state.scales[i].empty());
            continue;
        }
        ZINF_ASSERT_EQ(state.moments[i].size(), numel * state_element_size_bytes(state.dtype));
        ZINF_ASSERT_EQ(state.scales[i].size(), state_scale_count(state.dtype, numel));
        const auto address = reinterpret_cast<std::uintptr_t>(state.moments[i].data());
        ZINF_ASSERT(address % state_element_size_bytes(state.dtype) == 0);
    }
}

// The copy's index (0 none, 1 bf16, 2 fp16), its size asserted.
int copy_index_for(ParamCopy copy, std::size_t numel) noexcept {
    if (copy.data == nullptr) return 0;
    ZINF_ASSERT_EQ(copy.numel, numel);
    ZINF_ASSERT(copy.dtype != DType::kFloat32);
    return copy.dtype == DType::kBFloat16 ? 1 : 2;
}

// The operands of the step, as the CPU's state_step_args (kernels/optimizer.cc) fills them.
kernels::detail::StateStepArgs state_step_args(const OptimizerParams& params,
                                               const StoredState& state, GradView grads,
                                               ParamCopy copy, std::size_t kept) noexcept {
    const OptimizerDescriptor& d = optimizer_descriptor(params.kind);
    kernels::detail::StateStepArgs args{};
    args.step.params = state.params.data();
    args.step.grads = grads.data;
    args.step.param_copy = copy.data;
    args.step.c = kernels::detail::step_constants(params);
    for (std::size_t i = 0; i < kept; ++i) {
        args.stored[i] = state.moments[i].data();
        args.scales[i] = state.dtype == StateDType::kInt8 ? state.scales[i].data() : nullptr;
        if (d.moments[i].non_negative) args.unsigned_mask |= 1u << i;
    }
    args.moment_count = static_cast<int>(kept);
    args.first_index = state.first_index;
    args.rounding_seed = state.rounding_seed;
    args.rounding_streams[0] = rounding_stream(0, params.step);
    args.rounding_streams[1] = rounding_stream(1, params.step);
    return args;
}

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
    assert_stored_state(state, kept);
    ZINF_ASSERT_EQ(grads.numel, numel);
    if (numel > 0) ZINF_ASSERT(grads.data != nullptr);
    const int copy_index = copy_index_for(copy, numel);
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
    launch.args = state_step_args(params, state, grads, copy, kept);
    launch.numel = numel;
    launch.state = static_cast<int>(state.dtype) - 1;
    launch.kind = static_cast<int>(index);
    launch.amsgrad = params.amsgrad;
    launch.grad_dtype = grads.dtype;
    launch.copy_index = copy_index;
    return detail::launch_state_step(launch, stream);
}

}  // namespace zinf::kernels::cuda
