// The checks and operands of a step over compressed states (StoredState), shared by the CPU step
// (kernels/optimizer.cc) and the CUDA one (kernels/cuda/optimizer_states.cc), so that both refuse
// the same calls and take the same constants and rounding streams.
#pragma once

#include <cstddef>

#include "kernels/optimizer.h"
#include "kernels/step_args.h"

namespace zinf::kernels::detail {

// The copy's index in the tables (0 none, 1 bf16, 2 fp16), its size asserted.
int copy_index_for(ParamCopy copy, std::size_t numel) noexcept;

// The sizes, alignment and first index a compressed StoredState with `kept` moments must have
// (asserted).
void assert_stored_state(const StoredState& state, std::size_t kept) noexcept;

// The operands of a compressed step but for the chunk range.
StateStepArgs state_step_args(const OptimizerParams& params, const StoredState& state,
                              GradView grads, ParamCopy copy, std::size_t kept) noexcept;

}  // namespace zinf::kernels::detail
