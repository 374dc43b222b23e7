// The NCCL data type and reduction for a Communicator's DType and ReduceOp. Private to zero/
// (and its tests).
#pragma once

#include <nccl.h>

#include "src/base/dtype.h"
#include "zero/communicator.h"

namespace zinf::zero::detail {

inline ncclDataType_t nccl_type(DType dtype) noexcept {
    switch (dtype) {
        case DType::kFloat32:
            return ncclFloat32;
        case DType::kBFloat16:
            return ncclBfloat16;
        case DType::kFloat16:
            return ncclFloat16;
    }
    return ncclFloat32;
}

// The reduction NCCL runs for `op` in a world of `world_size` ranks. With one rank the average
// is the sum, and it is asked for as ncclSum: NCCL before 2.29.7 runs a one-rank ncclAvg through
// a kernel that splits the elements over its blocks with a floor division and leaves the last
// (count mod blocks) elements of the output unwritten (the GPU check caught it with 2^20 + 3
// elements: reduce_scatter and out-of-place all_reduce in fp32 and bf16). A one-rank ncclSum is
// a plain copy and has no such kernel.
inline ncclRedOp_t nccl_reduction(ReduceOp op, int world_size) noexcept {
    switch (op) {
        case ReduceOp::kSum:
            return ncclSum;
        case ReduceOp::kAvg:
            return world_size == 1 ? ncclSum : ncclAvg;
        case ReduceOp::kMax:
            return ncclMax;
    }
    return ncclSum;
}

}  // namespace zinf::zero::detail
