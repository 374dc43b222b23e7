// NcclCommunicator: Communicator collectives through NCCL on a CudaDevice's streams.
#include "zero/nccl_communicator.h"

#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "kernels/cuda/cuda_status.h"
#include "zero/detail/nccl_ops.h"
#include "zero/detail/nccl_status.h"

namespace zinf::zero {
namespace {

static_assert(sizeof(NcclUniqueId::bytes) == NCCL_UNIQUE_ID_BYTES);

// Polling period of barrier()'s bounded wait: short against a collective's latency (tens of
// microseconds) and long enough not to keep a core busy.
constexpr auto kBarrierPoll = std::chrono::microseconds(100);

}  // namespace

Result<NcclUniqueId> NcclCommunicator::make_unique_id() {
    ncclUniqueId id;
    ZINF_NCCL_TRY(ncclGetUniqueId(&id), nullptr);
    NcclUniqueId out;
    std::memcpy(out.bytes.data(), id.internal, out.bytes.size());
    return out;
}

Result<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create(
    device::CudaDevice& device, const NcclUniqueId& id, int rank, int world_size,
    const NcclCommunicatorOptions& options) {
    if (world_size < 1 || rank < 0 || rank >= world_size) {
        return Status::invalid_argument(
            str_cat("NcclCommunicator: rank ", rank, " outside a world of ", world_size));
    }
    ZINF_TRY(device.make_current());
    ZINF_ASSIGN_OR_RETURN(DeviceBuffer barrier_buffer,
                          DeviceBuffer::allocate(device, sizeof(float), "NCCL barrier"));
    ncclUniqueId nccl_id;
    std::memcpy(nccl_id.internal, id.bytes.data(), id.bytes.size());
    ncclComm_t comm = nullptr;
    const ncclResult_t result = ncclCommInitRank(&comm, world_size, nccl_id, rank);
    if (result != ncclSuccess) {
        return detail::nccl_error_status(result, "ncclCommInitRank", nullptr)
            .with_context(str_cat("NcclCommunicator: rank ", rank, " of ", world_size, " on ",
                                  device.name()));
    }
    log::info("NcclCommunicator: rank ", rank, " of ", world_size, " on ", device.name());
    return std::unique_ptr<NcclCommunicator>(
        new NcclCommunicator(device, comm, rank, world_size, std::move(barrier_buffer), options));
}

Result<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create_single_rank(
    device::CudaDevice& device, const NcclCommunicatorOptions& options) {
    ZINF_ASSIGN_OR_RETURN(NcclUniqueId id, make_unique_id());
    return create(device, id, 0, 1, options);
}

NcclCommunicator::NcclCommunicator(device::CudaDevice& device, ncclComm* comm, int rank,
                                   int world_size, DeviceBuffer barrier_buffer,
                                   const NcclCommunicatorOptions& options) noexcept
    : device_(device),
      comm_(comm),
      rank_(rank),
      world_size_(world_size),
      barrier_buffer_(std::move(barrier_buffer)),
      options_(options) {}

NcclCommunicator::~NcclCommunicator() {
    static_cast<void>(device_.make_current());
    // A failed communicator may have operations that never finish: abort rather than destroy,
    // which would wait for them.
    const ncclResult_t result = failed_ ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
    if (result != ncclSuccess) {
        log::error("NcclCommunicator: ", failed_ ? "ncclCommAbort" : "ncclCommDestroy", ": ",
                   ncclGetErrorString(result));
    }
    // barrier_buffer_ frees itself after the communicator is gone.
}

Status NcclCommunicator::check_async_error() {
    ncclResult_t async_error = ncclSuccess;
    ZINF_NCCL_TRY(ncclCommGetAsyncError(comm_, &async_error), comm_);
    if (async_error != ncclSuccess) {
        failed_ = true;
        return detail::nccl_error_status(async_error, "NCCL asynchronous error", comm_);
    }
    return Status::ok();
}

Status NcclCommunicator::all_gather(const void* send, void* recv, std::size_t send_numel,
                                    DType dtype, StreamId stream) {
    if (send_numel == 0) return Status::ok();
    ZINF_ASSERT(send != nullptr);
    ZINF_ASSERT(recv != nullptr);
    ZINF_TRY(device_.make_current());
    ZINF_NCCL_TRY(ncclAllGather(send, recv, send_numel, detail::nccl_type(dtype), comm_,
                                device_.cuda_stream(stream)),
                  comm_);
    return Status::ok();
}

Status NcclCommunicator::reduce_scatter(const void* send, void* recv, std::size_t recv_numel,
                                        DType dtype, ReduceOp op, StreamId stream) {
    if (recv_numel == 0) return Status::ok();
    ZINF_ASSERT(send != nullptr);
    ZINF_ASSERT(recv != nullptr);
    ZINF_TRY(device_.make_current());
    ZINF_NCCL_TRY(ncclReduceScatter(send, recv, recv_numel, detail::nccl_type(dtype),
                                    detail::nccl_reduction(op, world_size_), comm_,
                                    device_.cuda_stream(stream)),
                  comm_);
    return Status::ok();
}

Status NcclCommunicator::all_reduce(const void* send, void* recv, std::size_t numel, DType dtype,
                                    ReduceOp op, StreamId stream) {
    if (numel == 0) return Status::ok();
    ZINF_ASSERT(send != nullptr);
    ZINF_ASSERT(recv != nullptr);
    ZINF_TRY(device_.make_current());
    ZINF_NCCL_TRY(
        ncclAllReduce(send, recv, numel, detail::nccl_type(dtype),
                      detail::nccl_reduction(op, world_size_), comm_, device_.cuda_stream(stream)),
        comm_);
    return Status::ok();
}

Status NcclCommunicator::broadcast(void* buffer, std::size_t numel, DType dtype, int root,
                                   StreamId stream) {
    ZINF_ASSERT_GE(root, 0);
    ZINF_ASSERT_LT(root, world_size_);
    if (numel == 0) return Status::ok();
    ZINF_ASSERT(buffer != nullptr);
    ZINF_TRY(device_.make_current());
    ZINF_NCCL_TRY(ncclBroadcast(buffer, buffer, numel, detail::nccl_type(dtype), root, comm_,
                                device_.cuda_stream(stream)),
                  comm_);
    return Status::ok();
}

Status NcclCommunicator::barrier() {
    ZINF_TRY(device_.make_current());
    ZINF_NCCL_TRY(ncclAllReduce(barrier_buffer_.data(), barrier_buffer_.data(), 1, ncclFloat32,
                                ncclSum, comm_, device_.cuda_stream(0)),
                  comm_);
    ZINF_ASSIGN_OR_RETURN(EventId event, device_.record_event(0));
    const auto deadline = std::chrono::steady_clock::now() + options_.barrier_timeout;
    // Bounded: the loop ends at the deadline at the latest.
    for (;;) {
        auto done = device_.event_done(event);
        if (!done.has_value()) {
            device_.release_event(event);
            return done.error();
        }
        if (*done) break;
        if (Status async = check_async_error(); !async.is_ok()) {
            device_.release_event(event);
            return async;
        }
        if (std::chrono::steady_clock::now() >= deadline) {
            device_.release_event(event);
            failed_ = true;
            return Status::timeout(str_cat("NcclCommunicator: barrier on rank ", rank_, " of ",
                                           world_size_, " timed out after ",
                                           options_.barrier_timeout.count(),
                                           " ms; the communicator is aborted at destruction"));
        }
        std::this_thread::sleep_for(kBarrierPoll);
    }
    device_.release_event(event);
    return Status::ok();
}

Status NcclCommunicator::all_gather_host(std::span<const std::byte> send,
                                         std::span<std::byte> recv) {
    ZINF_ASSERT_EQ(recv.size(), send.size() * static_cast<std::size_t>(world_size_));
    if (send.empty()) return Status::ok();
    // Kept between calls (a few hundred bytes per step): cudaMalloc waits for the device.
    if (host_staging_.size_bytes() < recv.size()) {
        ZINF_ASSIGN_OR_RETURN(
            host_staging_, DeviceBuffer::allocate(device_, std::max<std::size_t>(recv.size(), 4096),
                                                  "NCCL host all-gather"));
    }
    auto* base = static_cast<std::byte*>(host_staging_.data());
    std::byte* own = base + static_cast<std::size_t>(rank_) * send.size();
    ZINF_TRY(device_.copy_to_device(own, send.data(), send.size(), 0));
    ZINF_TRY(device_.make_current());
    ZINF_NCCL_TRY(ncclAllGather(own, base, send.size(), ncclInt8, comm_, device_.cuda_stream(0)),
                  comm_);
    ZINF_TRY(device_.copy_to_host(recv.data(), base, recv.size(), 0));
    return device_.synchronize(0);
}

}  // namespace zinf::zero
