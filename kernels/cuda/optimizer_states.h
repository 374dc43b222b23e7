// The optimizer step over compressed moments (bf16 with stochastic rounding, int8 blockwise
// codes) on the GPU, for partitions whose states stay in device memory: the CPU's
// OptimizerKernel::step over a StoredState (kernels/optimizer.h; kernels/README.md, "Compressed
// optimizer states"), bit for bit, for Adam, AdamW (with AMSGrad and torch_rounding), Adagrad
// and Lion.
#pragma once

#include "kernels/cuda/stream.h"
#include "kernels/optimizer.h"
#include "src/base/status.h"

namespace zinf::kernels::cuda {

// One step in place over state.params.size() elements, as OptimizerKernel::step(params, state,
// grads, copy) does on the CPU, but with every array in device memory: the spans of `state`, the
// data of `grads` and of `copy` are device pointers with their element counts (nothing reads them
// on the host). Per block of 2048 elements of the global flat index (state.first_index, a
// multiple of 2048, is where params[0] sits) each element decodes its moments, runs the fp32
// step's element code with fused multiply-adds and encodes them back with the rounding words of
// (rounding_seed, step, global index) (kernels/state_codec.h's rounding_word): bf16 stochastically,
// int8 dithered, with the block's largest new magnitude as its scale. The results are bitwise those
// of the CPU variants for every input without a NaN; a NaN stays a NaN (and an int8 scale of a
// block with one is the quiet NaN 0x7fc00000, as on the CPU), but its bits may differ, since the
// GPU makes one canonical NaN where x86 keeps an operand's. Preconditions (asserted): those of the
// CPU step (sizes of params, kept moments, scales, grads and copy; first_index a multiple of 2048;
// copy bf16 or fp16), and no output overlapping another array. Asynchronous on `stream`; numel 0
// launches nothing; does not block or allocate. Returns kInvalidArgument (from kernels::validate)
// and launches nothing when params are out of range; kNotSupported for fp32 moments (adam_step in
// kernels/cuda/adam.h keeps fp32 states) and for optimizers registered from outside kernels/; kCuda
// when the launch fails.
Status state_step(const OptimizerParams& params, const StoredState& state, GradView grads,
                  ParamCopy copy, Stream stream);

}  // namespace zinf::kernels::cuda
