// NcclCommunicator: the Communicator of GPU ranks, over NCCL. Collectives are enqueued on the
// CUDA stream behind the StreamId of the CudaDevice the communicator was made for, and so are
// ordered with the kernels and copies of that stream. Compiled only where NCCL is found (target
// zinf_zero_nccl).
//
// Bootstrap: all ranks must share one NcclUniqueId made by one of them. A world of one rank needs
// none (create_single_rank); several ranks pass the id around with MPI
// (zero/nccl_mpi_bootstrap.h) or any other channel.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "src/base/device_buffer.h"
#include "src/device/cuda_device.h"
#include "zero/communicator.h"

struct ncclComm;  // ncclComm_t is ncclComm*

namespace zinf::zero {

// The bytes of NCCL's ncclUniqueId (NCCL_UNIQUE_ID_BYTES), plain data to send between ranks.
struct NcclUniqueId {
    std::array<char, 128> bytes{};
};

struct NcclCommunicatorOptions {
    // Bound on barrier()'s wait: a rank that never arrives (crashed, hung) turns into kTimeout
    // and the communicator is aborted, instead of a hang.
    std::chrono::milliseconds barrier_timeout{std::chrono::minutes(5)};
};

// Thread-compatible: one thread issues the collectives of one communicator (NCCL requires the
// same order of collectives on every rank).
class NcclCommunicator final : public Communicator {
public:
    // Makes a fresh id (on the rank that bootstraps the others). kNccl on failure.
    static Result<NcclUniqueId> make_unique_id();
    // Joins the world of `world_size` ranks named by `id` as `rank`; blocks until every rank has
    // joined (a collective). `device` is borrowed and must outlive the communicator. Errors:
    // kInvalidArgument (rank out of range), kNccl (init failed), kCuda, kNoSpace (the barrier's
    // 4 bytes of device memory).
    static Result<std::unique_ptr<NcclCommunicator>> create(
        device::CudaDevice& device, const NcclUniqueId& id, int rank, int world_size,
        const NcclCommunicatorOptions& options = {});
    // A world of one rank on `device`: no bootstrap, no MPI.
    static Result<std::unique_ptr<NcclCommunicator>> create_single_rank(
        device::CudaDevice& device, const NcclCommunicatorOptions& options = {});
    // Destroys the NCCL communicator (aborts it if it failed), then frees the barrier buffer.
    ~NcclCommunicator() override;
    NcclCommunicator(const NcclCommunicator&) = delete;
    NcclCommunicator& operator=(const NcclCommunicator&) = delete;

    std::string_view name() const noexcept override { return "nccl"; }
    int rank() const noexcept override { return rank_; }
    int world_size() const noexcept override { return world_size_; }

    // Enqueue NCCL's collective on `stream` and return; kNccl when NCCL rejects it (a failed
    // peer shows here, or in check_async_error). send/recv are device memory of the device.
    Status all_gather(const void* send, void* recv, std::size_t send_numel, DType dtype,
                      StreamId stream) override;
    Status reduce_scatter(const void* send, void* recv, std::size_t recv_numel, DType dtype,
                          ReduceOp op, StreamId stream) override;
    Status all_reduce(const void* send, void* recv, std::size_t numel, DType dtype, ReduceOp op,
                      StreamId stream) override;
    Status broadcast(void* buffer, std::size_t numel, DType dtype, int root,
                     StreamId stream) override;
    // An all-reduce of one value on stream 0, waited for with a bound (options.barrier_timeout):
    // kTimeout after aborting the communicator, kNccl on an asynchronous error.
    Status barrier() override;
    // Through a device buffer: copy in, ncclAllGather of bytes on stream 0, copy out, wait.
    Status all_gather_host(std::span<const std::byte> send, std::span<std::byte> recv) override;

    // NCCL's asynchronous error state (a peer or network failure): kNccl when set.
    Status check_async_error();

private:
    NcclCommunicator(device::CudaDevice& device, ncclComm* comm, int rank, int world_size,
                     DeviceBuffer barrier_buffer, const NcclCommunicatorOptions& options) noexcept;

    device::CudaDevice& device_;
    ncclComm* comm_;
    int rank_;
    int world_size_;
    DeviceBuffer barrier_buffer_;  // 4 bytes of device memory
    DeviceBuffer host_staging_;    // all_gather_host's device copy, grown on demand
    NcclCommunicatorOptions options_;
    bool failed_ = false;  // aborted, or an asynchronous error was seen
};

}  // namespace zinf::zero
