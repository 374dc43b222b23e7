// SingleRankCommunicator: the Communicator of a world of one rank (the CPU path, single-GPU
// training without NCCL, and every test). Each collective reduces to a device copy or nothing.
#pragma once

#include <string_view>

#include "src/base/device.h"
#include "zero/communicator.h"

namespace zinf::zero {

// Thread-compatible. The device is borrowed and must outlive the communicator.
class SingleRankCommunicator final : public Communicator {
public:
    explicit SingleRankCommunicator(Device& device) noexcept : device_(device) {}

    std::string_view name() const noexcept override { return "single-rank"; }
    int rank() const noexcept override { return 0; }
    int world_size() const noexcept override { return 1; }

    // With one rank each collective's result is its input: a copy on `stream` when send and recv
    // differ (any ReduceOp of one value is that value), nothing when they are the same buffer.
    // Errors are the device's copy errors.
    Status all_gather(const void* send, void* recv, std::size_t send_numel, DType dtype,
                      StreamId stream) override;
    Status reduce_scatter(const void* send, void* recv, std::size_t recv_numel, DType dtype,
                          ReduceOp op, StreamId stream) override;
    Status all_reduce(const void* send, void* recv, std::size_t numel, DType dtype, ReduceOp op,
                      StreamId stream) override;
    // root must be 0 (asserted); nothing to move.
    Status broadcast(void* buffer, std::size_t numel, DType dtype, int root,
                     StreamId stream) override;
    Status barrier() override { return Status::ok(); }
    Status all_gather_host(std::span<const std::byte> send, std::span<std::byte> recv) override;

private:
    Status copy(const void* send, void* recv, std::size_t numel, DType dtype, StreamId stream);

    Device& device_;
};

}  // namespace zinf::zero
