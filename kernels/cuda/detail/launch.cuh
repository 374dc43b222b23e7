// Private helpers of the CUDA kernels: launch geometry and block reductions. Included by .cu
// files only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace zinf::kernels::cuda::detail {

constexpr int kBlockThreads = 256;
// Grid-stride loops: enough blocks to fill an H200 (132 SMs x 16 resident blocks of 256 threads
// = 2112) several times over, few enough that each thread handles a few elements.
constexpr std::size_t kGridBlocksMax = 8192;

inline unsigned int grid_for(std::size_t numel) {
    std::size_t blocks = (numel + kBlockThreads - 1) / kBlockThreads;
    if (blocks == 0) blocks = 1;
    if (blocks > kGridBlocksMax) blocks = kGridBlocksMax;
    return static_cast<unsigned int>(blocks);
}

// Sum over the block; every thread gets the result. `scratch` holds 32 values. Contains
// __syncthreads, so every thread of the block must call it.
template <typename T>
__device__ inline T block_sum(T value, T* scratch) {
    const unsigned int lane = threadIdx.x % 32u;
    const unsigned int warp = threadIdx.x / 32u;
    for (int offset = 16; offset > 0; offset /= 2)
        value += __shfl_xor_sync(0xffffffffu, value, offset);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    const unsigned int warps = (blockDim.x + 31u) / 32u;
    T total = T(0);
    for (unsigned int w = 0; w < warps; ++w) total += scratch[w];
    return total;
}

template <typename T>
__device__ inline T block_max(T value, T* scratch) {
    const unsigned int lane = threadIdx.x % 32u;
    const unsigned int warp = threadIdx.x / 32u;
    for (int offset = 16; offset > 0; offset /= 2) {
        const T other = __shfl_xor_sync(0xffffffffu, value, offset);
        value = other > value ? other : value;
    }
    __syncthreads();
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    const unsigned int warps = (blockDim.x + 31u) / 32u;
    T result = scratch[0];
    for (unsigned int w = 1; w < warps; ++w) result = scratch[w] > result ? scratch[w] : result;
    return result;
}

}  // namespace zinf::kernels::cuda::detail
