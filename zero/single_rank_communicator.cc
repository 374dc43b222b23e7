// SingleRankCommunicator: collectives over one rank are copies.
#include "zero/single_rank_communicator.h"

#include <cstring>

namespace zinf::zero {

Status SingleRankCommunicator::copy(const void* send, void* recv, std::size_t numel, DType dtype,
                                    StreamId stream) {
    if (numel == 0 || send == recv) return Status::ok();
    ZINF_ASSERT(send != nullptr);
    ZINF_ASSERT(recv != nullptr);
    return device_.copy_on_device(recv, send, numel * dtype_size_bytes(dtype), stream);
}

Status SingleRankCommunicator::all_gather(const void* send, void* recv, std::size_t send_numel,
                                          DType dtype, StreamId stream) {
    return copy(send, recv, send_numel, dtype, stream);
}

Status SingleRankCommunicator::reduce_scatter(const void* send, void* recv, std::size_t recv_numel,
                                              DType dtype, ReduceOp, StreamId stream) {
    return copy(send, recv, recv_numel, dtype, stream);
}

Status SingleRankCommunicator::all_reduce(const void* send, void* recv, std::size_t numel,
                                          DType dtype, ReduceOp, StreamId stream) {
    return copy(send, recv, numel, dtype, stream);
}

Status SingleRankCommunicator::broadcast(void*, std::size_t, DType, int root, StreamId) {
    ZINF_ASSERT_EQ(root, 0);
    return Status::ok();
}

Status SingleRankCommunicator::all_gather_host(std::span<const std::byte> send,
                                               std::span<std::byte> recv) {
    ZINF_ASSERT_EQ(recv.size(), send.size());
    if (!send.empty() && send.data() != recv.data()) {
        std::memcpy(recv.data(), send.data(), send.size());
    }
    return Status::ok();
}

}  // namespace zinf::zero
