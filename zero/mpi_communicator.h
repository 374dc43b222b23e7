// MpiCommunicator: the Communicator of CPU-device ranks, over MPI (Open MPI from Debian), and the
// launch facts of an MPI job (rank, world size, local rank). Compiled where MPI is found (target
// zinf_zero_mpi); the CPU device's memory is host memory, so MPI reads and writes the buffers in
// place.
//
// Every collective first waits for `stream` (the device's work on the buffers), then runs MPI's
// blocking collective on a private duplicate of MPI_COMM_WORLD. A watchdog bounds each one: a
// collective that has not completed after `timeout` (a rank crashed, hung or took another path)
// prints which collective on which rank and ends the process with exit code 3, which makes mpirun
// stop every rank, instead of a hang.
//
// Reductions: by default MPI's own (MPI_Allreduce, MPI_Reduce_scatter_block; for bf16/fp16 a
// user-defined sum that adds in fp32 and rounds per step). `deterministic` replaces the sums by
// an exchange (MPI_Alltoallv) and a sum in rank order in fp32 on the rank that owns each piece,
// then an all-gather: every run with the same inputs gives the same bits, and a 16-bit sum is
// rounded once.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/device.h"
#include "src/base/status.h"
#include "zero/communicator.h"

namespace zinf::zero {

// Where this process sits in the job, before MPI is initialised: an MPI launcher (Open MPI's
// OMPI_COMM_WORLD_*, PMI_*, PMIX_RANK, or srun's SLURM_PROCID / SLURM_NTASKS) means MPI must be
// initialised, and MpiSession then has the authoritative rank, size and local rank; else
// RANK / WORLD_SIZE / LOCAL_RANK; else a world of one.
struct LaunchInfo {
    int rank = 0;
    int world_size = 1;
    int local_rank = 0;
    bool under_mpi = false;  // launched by an MPI launcher: MPI must be initialised
    std::string source;      // "mpirun", "environment" or "single process", for messages
};

// Reads the launch variables without initialising MPI. Errors: kInvalidArgument naming the
// variable for a malformed or inconsistent value (RANK outside [0, WORLD_SIZE), RANK disagreeing
// with MPI's rank), and for WORLD_SIZE > 1 without an MPI launcher (zinfinity's transport between
// CPU ranks is MPI: launch with mpirun).
Result<LaunchInfo> detect_launch();

// MPI_Init_thread (funneled) once per process, MPI_Finalize at destruction. Errors: kInternal
// with MPI's message.
class MpiSession {
public:
    static Result<std::unique_ptr<MpiSession>> init(int* argc, char*** argv);
    ~MpiSession();
    MpiSession(const MpiSession&) = delete;
    MpiSession& operator=(const MpiSession&) = delete;
    int rank() const noexcept { return rank_; }
    int world_size() const noexcept { return world_size_; }
    // Among the ranks of this node (MPI_COMM_TYPE_SHARED): which GPU a GPU rank takes.
    int local_rank() const noexcept { return local_rank_; }
    // Stops every rank of the job with `code` (MPI_Abort): for a rank that failed while the
    // others may be waiting for it in a collective. Does not return.
    [[noreturn]] static void abort_job(int code);

private:
    MpiSession() = default;
    int rank_ = 0;
    int world_size_ = 1;
    int local_rank_ = 0;
};

// True on every rank when `failed` is true on any (MPI_Allreduce on MPI_COMM_WORLD); false when
// MPI is not initialised and `failed` is false.
bool mpi_any_failed(bool failed);

struct MpiCommunicatorOptions {
    bool deterministic = false;
    std::chrono::milliseconds timeout{std::chrono::minutes(10)};
};

// Thread-compatible: one thread issues the collectives (every rank must issue the same ones in
// the same order).
class MpiCommunicator final : public Communicator {
public:
    // Duplicates MPI_COMM_WORLD. `device` is borrowed and must outlive the communicator.
    // Errors: kInvalidArgument when MPI is not initialised, kNotSupported for a non-CPU device
    // (GPU ranks use NCCL), kInternal for MPI errors.
    static Result<std::unique_ptr<MpiCommunicator>> create(
        Device& device, const MpiCommunicatorOptions& options = {});
    ~MpiCommunicator() override;
    MpiCommunicator(const MpiCommunicator&) = delete;
    MpiCommunicator& operator=(const MpiCommunicator&) = delete;

    std::string_view name() const noexcept override {
        return options_.deterministic ? "mpi, deterministic" : "mpi";
    }
    int rank() const noexcept override { return rank_; }
    int world_size() const noexcept override { return world_size_; }

    Status all_gather(const void* send, void* recv, std::size_t send_numel, DType dtype,
                      StreamId stream) override;
    Status reduce_scatter(const void* send, void* recv, std::size_t recv_numel, DType dtype,
                          ReduceOp op, StreamId stream) override;
    Status all_reduce(const void* send, void* recv, std::size_t numel, DType dtype, ReduceOp op,
                      StreamId stream) override;
    Status broadcast(void* buffer, std::size_t numel, DType dtype, int root,
                     StreamId stream) override;
    Status barrier() override;
    Status all_gather_host(std::span<const std::byte> send, std::span<std::byte> recv) override;

    struct Impl;  // opaque: keeps mpi.h out of this header

private:
    MpiCommunicator(Device& device, const MpiCommunicatorOptions& options,
                    std::unique_ptr<Impl> impl, int rank, int world_size);
    Status rank_order_all_reduce(const void* send, void* recv, std::size_t numel, DType dtype,
                                 ReduceOp op);
    Status rank_order_reduce_scatter(const void* send, void* recv, std::size_t recv_numel,
                                     DType dtype, ReduceOp op);

    Device& device_;
    MpiCommunicatorOptions options_;
    std::unique_ptr<Impl> impl_;  // the MPI communicator, the 16-bit operations, the watchdog
    int rank_;
    int world_size_;
    std::vector<float> scratch_;  // the rank-order sums
    std::vector<float> convert_;  // one 16-bit piece in fp32
    std::vector<std::byte> exchange_;
};

}  // namespace zinf::zero
