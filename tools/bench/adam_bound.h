// The memory-bandwidth bound of `zinfinity-bench adam`: a kernel with an optimizer step's own
// memory pattern and almost no arithmetic. Adam reads four fp32 streams (params, exp_avg,
// exp_avg_sq, grads) and writes three back in place (28 B per parameter); in-place writes pay
// no write-allocate, which is why a STREAM triad is the wrong bound here.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zinf::bench {

// The streams of one bound pass, mirroring OptimizerKernel::step's: exp_avg_sq is null for the
// one-state optimizers (Adagrad reads exp_avg_sq only: pass it as exp_avg), grads are fp32 or
// 16-bit, copy is null or a 16-bit array written from the new params.
struct BoundArgs {
    float* params;
    void* exp_avg;     // state_bytes wide elements: fp32, 16-bit (bf16 states) or 8-bit (int8)
    void* exp_avg_sq;  // as exp_avg
    const void* grads;
    bool grads_16bit;
    std::uint16_t* copy;
    int state_bytes;  // 4, 2 or 1: the moments' element size (the int8 scales are not moved)
    float zero;  // 0 at run time: x += g * 0 keeps the data while the compiler must do the work
};

// Reads and writes elements [begin, end) of every stream with plain (not non-temporal) vector
// loads and stores, like the optimizer kernels.
using BoundChunkFn = void (*)(const BoundArgs& args, std::size_t begin, std::size_t end) noexcept;

// Each is defined in a unit built for its ISA; call one only on a CPU that has it.
BoundChunkFn bound_chunk_avx512() noexcept;
BoundChunkFn bound_chunk_avx2() noexcept;

}  // namespace zinf::bench
