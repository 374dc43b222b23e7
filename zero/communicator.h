// zero::Communicator: collectives over the data-parallel ranks. Implementations: the single-rank
// communicator (identity over one rank; the CPU path and every test), NCCL (GPUs), and later MPI.
// Buffers are device memory of the Device the communicator was created for; operations are
// ordered on `stream` of that device.
#pragma once

#include <cstddef>
#include <string_view>

#include "src/base/device.h"
#include "src/base/dtype.h"
#include "src/base/status.h"

namespace zinf::zero {

enum class ReduceOp : unsigned char { kSum, kAvg, kMax };

class Communicator {
public:
    virtual ~Communicator() = default;
    virtual std::string_view name() const noexcept = 0;
    virtual int rank() const noexcept = 0;
    virtual int world_size() const noexcept = 0;

    // recv holds world_size() * send_numel elements; rank r's send lands at r * send_numel.
    virtual Status all_gather(const void* send, void* recv, std::size_t send_numel, DType dtype,
                              StreamId stream) = 0;
    // send holds world_size() * recv_numel elements; rank r receives the reduction of slice r.
    virtual Status reduce_scatter(const void* send, void* recv, std::size_t recv_numel, DType dtype,
                                  ReduceOp op, StreamId stream) = 0;
    // In place is allowed (send == recv).
    virtual Status all_reduce(const void* send, void* recv, std::size_t numel, DType dtype,
                              ReduceOp op, StreamId stream) = 0;
    virtual Status broadcast(void* buffer, std::size_t numel, DType dtype, int root,
                             StreamId stream) = 0;
    virtual Status barrier() = 0;
};

}  // namespace zinf::zero
