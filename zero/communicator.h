// zero::Communicator: collectives over the data-parallel ranks. Implementations: the single-rank
// communicator (identity over one rank), MPI (CPU-device ranks, zero/mpi_communicator.h) and NCCL
// (GPU ranks). Buffers are device memory of the Device the communicator was created for;
// operations are ordered on `stream` of that device. all_gather_host is the control plane: a few
// host bytes per rank (losses, norms, flags), from which the rank-order helpers below agree on
// values every rank computes bit for bit the same.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

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
    // Host memory: recv (world_size() * send.size() bytes) receives rank r's send at
    // r * send.size(). Blocking.
    virtual Status all_gather_host(std::span<const std::byte> send, std::span<std::byte> recv) = 0;
};

// Element-wise sums over the ranks of host values, added in rank order on every rank (so every
// rank gets the same bits). In place.
Status sum_over_ranks(Communicator& comm, std::span<double> values);
Status sum_over_ranks(Communicator& comm, std::span<std::uint64_t> values);
// True on every rank when `flag` is true on any.
Result<bool> any_over_ranks(Communicator& comm, bool flag);
// The error of a rank that stops only because another rank failed (the ranks agreed on a failure
// with any_over_ranks): "<what>: another rank failed (its error names why)". The failing rank's
// own error names the cause; a launcher leaves ending the job to that rank, so that its error is
// printed before the job is torn down (is_peer_failure recognises these).
Status peer_failure(std::string_view what);
bool is_peer_failure(const Status& s) noexcept;
// Every rank's value, in rank order.
Result<std::vector<std::uint64_t>> gather_over_ranks(Communicator& comm, std::uint64_t value);

}  // namespace zinf::zero
