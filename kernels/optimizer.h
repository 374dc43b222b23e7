// The CPU optimizers for offloaded steps (Adam, AdamW, Adagrad, Lion) over fp32 master
// parameters and states, with fp32, bf16 or fp16 gradients, an optional bf16 or fp16 copy of the
// new parameters written in the same pass, and the gradient inf/NaN and sum-of-squares pass.
// One OptimizerKernel picks its SIMD variant and threads at init; see kernels/README.md.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "kernels/chunk_loop.h"
#include "kernels/cpu_features.h"
#include "kernels/step_args.h"
#include "src/base/dtype.h"
#include "src/base/optimizer_descriptor.h"
#include "src/base/state_dtype.h"
#include "src/base/status.h"

namespace zinf::kernels {

namespace detail {
struct KernelTable;
}

// The optimizers' ids and descriptors live in src/base/optimizer_descriptor.h (the config
// parser reads them too); the kernels attach the arithmetic.
using zinf::OptimizerKind;

// The hyperparameters of one step. Double precision here; the kernel rounds the derived
// per-step constants to fp32 once per call.
struct OptimizerParams {
    OptimizerKind kind = OptimizerKind::kAdamW;
    std::uint64_t step = 1;  // 1-based number of this step, for bias correction
    double lr = 1e-3;
    double beta1 = 0.9;    // Adam: first moment; Lion: interpolation of the update
    double beta2 = 0.999;  // Adam: second moment; Lion: momentum decay
    double eps = 1e-8;     // Adam, Adagrad
    double weight_decay = 0.0;
    // Multiplies every gradient before use: 1/loss_scale times the clipping coefficient, so
    // unscaling and clipping cost no extra pass.
    double grad_scale = 1.0;
    bool bias_correction = true;  // Adam and AdamW
    // Adam and AdamW (torch's amsgrad=True): divide by the square root of the running maximum
    // of exp_avg_sq, kept in OptimizerState::max_exp_avg_sq, instead of exp_avg_sq's own.
    bool amsgrad = false;
    // Adam and AdamW: round as torch.optim.Adam / AdamW do on the CPU (torch 1.13's
    // single-tensor and foreach paths: a separate multiply before each fused add, addcmul as
    // one multiply and a fused add, true divisions by the bias correction and the denominator),
    // so that a run gives torch's results bit for bit. Two more divisions per element, still
    // memory-bound (kernels/README.md). Off: the kernel's own order, the one the CUDA step copies.
    bool torch_rounding = false;
};

// Checks ranges: step >= 1, lr >= 0, betas in [0, 1), eps >= 0, weight_decay >= 0, all finite,
// grad_scale finite; amsgrad and torch_rounding only where the optimizer's descriptor has them
// (torch's Adagrad and Lion have no amsgrad, and a flag that silently did nothing would hide a
// config mistake). Returns kInvalidArgument naming the field and value.
Status validate(const OptimizerParams& params);

// The fp32 master parameters and the optimizer's moments, borrowed for one call: moments[i] is
// the i-th kept moment of the optimizer's descriptor (Adam and AdamW: exp_avg, exp_avg_sq, then
// max_exp_avg_sq with amsgrad, which starts at zero as torch's does; Adagrad: its running sum;
// Lion: exp_avg); the spans past the kept ones are empty.
struct OptimizerState {
    std::span<float> params;
    std::array<std::span<float>, kMaxMoments> moments{};
};

// The master parameters and the moments as stored, fp32, bf16 or int8 (src/base/state_dtype.h;
// kernels/README.md, "Compressed optimizer states"), borrowed for one call. The moments are in
// the descriptor's order, as in OptimizerState; bytes, so that a swapper moves them as it reads
// them. The master parameters are fp32 in every case.
struct StoredState {
    std::span<float> params;
    StateDType dtype = StateDType::kFp32;
    // Moment i: numel * state_element_size_bytes(dtype) bytes, aligned to its element size (bf16
    // bits; int8 codes, two's complement for signed moments, plain for never-negative ones).
    std::array<std::span<std::byte>, kMaxMoments> moments{};
    // int8: moment i's block scales, state_scale_count(kInt8, numel) each; else empty.
    std::array<std::span<float>, kMaxMoments> scales{};
    // The global flat index of params[0] (its place in the whole flattened model): a multiple of
    // kStateBlockNumel for bf16 and int8, so that blocks and rounding words do not depend on how
    // the model is partitioned.
    std::uint64_t first_index = 0;
    // The seed of the stochastic rounding (bf16 and int8); one value for the whole run and every
    // rank (the step and the element's global index make each word distinct).
    std::uint64_t rounding_seed = 0;
};

// Gradients of one of the three dtypes, borrowed for one call.
struct GradView {
    const void* data = nullptr;
    std::size_t numel = 0;
    DType dtype = DType::kFloat32;

    static GradView fp32(std::span<const float> grads) noexcept {
        return {grads.data(), grads.size(), DType::kFloat32};
    }
    static GradView bf16(std::span<const std::uint16_t> grads) noexcept {
        return {grads.data(), grads.size(), DType::kBFloat16};
    }
    static GradView fp16(std::span<const std::uint16_t> grads) noexcept {
        return {grads.data(), grads.size(), DType::kFloat16};
    }
};

// Where to write a bf16 or fp16 copy of the updated parameters (for the next forward pass);
// by default none is written.
struct ParamCopy {
    std::uint16_t* data = nullptr;
    std::size_t numel = 0;
    DType dtype = DType::kBFloat16;  // kBf16 or kFp16

    static ParamCopy none() noexcept { return {}; }
    static ParamCopy bf16(std::span<std::uint16_t> copy) noexcept {
        return {copy.data(), copy.size(), DType::kBFloat16};
    }
    static ParamCopy fp16(std::span<std::uint16_t> copy) noexcept {
        return {copy.data(), copy.size(), DType::kFloat16};
    }
};

struct GradStats {
    bool has_inf_nan = false;  // some gradient is +-inf or NaN
    // The sum of the gradients' squares as stored (before grad_scale), in double; +inf or NaN
    // when has_inf_nan. The global norm of unscaled gradients is sqrt(sum) / loss_scale.
    double sum_squares = 0.0;
};

// A run of an optimizer domain (a rank's flat partition, or the whole flat layout) whose elements
// have consecutive global flat indices: one parameter's slice on this rank, or several adjacent
// ones. Compressed states key their blocks and rounding words on the global index, which does not
// depend on the number of ranks (src/engine/offload_plan.h, state_segments).
struct StateSegment {
    std::uint64_t offset = 0;        // the first element's place in the domain
    std::uint64_t numel = 0;         // a multiple of kStateBlockNumel
    std::uint64_t global_index = 0;  // the first element's global flat index, ditto
};

// A CPU optimizer bound to one SIMD variant and one thread count for its life. Move-only.
// step() and grad_stats() may be called from one thread at a time.
class OptimizerKernel {
public:
    // Runs `isa` on `threads` threads (0: all cores). Returns kNotSupported when the CPU lacks
    // `isa` and kInvalidArgument for a negative thread count.
    static Result<OptimizerKernel> create(Isa isa, int threads);
    // Resolves the variant from ZINF_CPU_ISA and `isa_request` ("auto", "avx512", "avx2",
    // "scalar"; see resolve_isa) and runs on `threads` threads; logs the variant chosen at info
    // level.
    static Result<OptimizerKernel> create(std::string_view isa_request, int threads);

    OptimizerKernel(OptimizerKernel&&) noexcept;
    OptimizerKernel& operator=(OptimizerKernel&&) noexcept;
    OptimizerKernel(const OptimizerKernel&) = delete;
    OptimizerKernel& operator=(const OptimizerKernel&) = delete;
    ~OptimizerKernel();

    Isa isa() const noexcept { return isa_; }
    int threads() const noexcept { return loop_.threads(); }
    // How many lanes the sum of squares keeps per chunk (see kernels/README.md): 1, 8 or 16.
    int sum_lanes() const noexcept;

    // Applies one optimizer step in place to every element, and writes `copy` when it has data.
    // Preconditions (asserted): state.params, the moments the optimizer keeps (its descriptor's,
    // with amsgrad's when params.amsgrad), grads and copy (when given) have the same numel; copy
    // is bf16 or fp16; no output overlaps another array.
    // Returns kInvalidArgument (from validate) and changes nothing when params are out of range.
    // Elements are independent: the result of each is bitwise the same for any thread count,
    // chunking or alignment. Allocates nothing of its own; blocks until done.
    Status step(const OptimizerParams& params, const OptimizerState& state, GradView grads,
                ParamCopy copy = ParamCopy::none()) const noexcept;

    // The same step over moments stored as `state.dtype` says: fp32 runs the step above; bf16
    // and int8 decode each block of 2048 elements, run the same element code in fp32 and encode
    // it back in one pass, rounding stochastically with words keyed by (rounding_seed, step,
    // global index): bf16 to one of its two neighbours, int8 dithered to a code of the block's new
    // largest magnitude. Preconditions (asserted) as above, plus the moment and scale sizes of
    // StoredState and first_index a multiple of kStateBlockNumel. Every variant and thread count
    // gives the same bits; so does any split of the span at block boundaries. Returns
    // kInvalidArgument as above, and kNotSupported for a compressed dtype on an optimizer
    // registered from outside kernels/.
    Status step(const OptimizerParams& params, const StoredState& state, GradView grads,
                ParamCopy copy = ParamCopy::none()) const noexcept;

    // Reads the gradients once and reports inf/NaN and the sum of squares. The sum is
    // bitwise the same for any thread count (fixed chunk partials added in chunk order).
    GradStats grad_stats(GradView grads) const noexcept;

private:
    OptimizerKernel(Isa isa, const detail::KernelTable& table, ChunkLoop loop) noexcept;
    detail::StepChunkFn step_function(OptimizerKind kind, bool amsgrad, DType grad_dtype,
                                      int copy_index) const noexcept;

    Isa isa_;
    const detail::KernelTable* table_;
    ChunkLoop loop_;
};

// The StoredState of params.size() elements whose moments are laid out as the stores keep them
// (src/base/state_dtype.h: elements, then the int8 scales; `moments[i]` of
// state_moment_stored_bytes each, the kept ones only). first_index is left 0.
StoredState stored_state_view(StateDType dtype, std::span<float> params,
                              std::span<const std::span<std::byte>> moments,
                              std::uint64_t rounding_seed) noexcept;

// Steps elements [chunk_offset, chunk_offset + chunk.params.size()) of a domain cut into
// `segments` (sorted by offset, covering the chunk, offsets and lengths multiples of
// kStateBlockNumel; chunk_offset too): one kernel step per segment the chunk overlaps, with its
// global index. `chunk` holds the chunk's stored state from its first element (its first_index is
// ignored); grads and copy cover the chunk. Empty `segments`: the domain offset is the global
// index. fp32 states take one fp32 step (no segments needed). Errors: the kernel's.
Status step_segments(const OptimizerKernel& kernel, const OptimizerParams& params,
                     const StoredState& chunk, std::uint64_t chunk_offset,
                     std::span<const StateSegment> segments, GradView grads,
                     ParamCopy copy = ParamCopy::none()) noexcept;

// The arithmetic of an optimizer registered from outside kernels/: its chunk functions per
// [amsgrad][gradient dtype][copy: none, bf16, fp16] (null where unsupported, e.g. amsgrad on an
// optimizer without it). The constants a chunk function gets are detail::step_constants' generic
// ones: step_size -lr, decay_factor 1 - lr * weight_decay, the betas, eps and grad_scale.
struct OptimizerKernelEntries {
    detail::StepChunkFn step[2][kDTypeCount][3] = {};
};

// Registers `descriptor` (register_optimizer_descriptor) with its arithmetic: `scalar` serves
// every variant, unless `avx2` / `avx512` give that variant's own. The entries must outlive the
// process (static tables). Call before other threads use optimizers (start-up, or a test
// binary's static initialisation). Returns the optimizer's kind. Errors: the descriptor's.
Result<OptimizerKind> register_optimizer(const OptimizerDescriptor& descriptor,
                                         const OptimizerKernelEntries& scalar,
                                         const OptimizerKernelEntries* avx2 = nullptr,
                                         const OptimizerKernelEntries* avx512 = nullptr);

// The table of `isa`'s chunk functions; asserts isa_supported(isa). For casts and tests.
const detail::KernelTable& kernel_table(Isa isa) noexcept;

namespace detail {
struct StepConstants;
// The fp32 constants of one step, derived in double from `params` (bias corrections from the
// 64-bit step). Shared with the GPU Adam step (kernels/cuda/adam.h), so that both devices use
// the same constants (and the GPU matches the FMA variants bit for bit).
StepConstants step_constants(const OptimizerParams& params) noexcept;
}  // namespace detail

}  // namespace zinf::kernels
