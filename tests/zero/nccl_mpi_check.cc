// The NCCL bootstrap over MPI on several GPUs: `mpiexec -n <GPUs> nccl_mpi_check`. Each rank
// all-reduces its rank number and checks the sum. Not part of CI (labels gpu;slow;mpi): it needs
// as many GPUs as ranks, and skips (exit 0, "skipped: ...") when a rank has none.
#include <mpi.h>

#include <cstdio>
#include <vector>

#include "src/device/cuda_device.h"
#include "zero/nccl_mpi_bootstrap.h"

int main(int argc, char** argv) {
    using namespace zinf;
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) return 1;
    int rank = 0;
    int world = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    int rc = 0;
    {
        device::CudaDeviceOptions options;
        options.local_rank = device::CudaDevice::local_rank_from_environment();
        options.budget_bytes = std::size_t{64} << 20;
        auto device = device::CudaDevice::create(options);
        int have = device.has_value() ? 1 : 0;
        int all_have = 0;
        MPI_Allreduce(&have, &all_have, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (all_have == 0) {
            if (rank == 0) {
                std::printf(
                    "skipped: not every rank has a GPU (%s)\n",
                    device.has_value() ? "another rank failed" : device.error().message().c_str());
            }
        } else {
            auto comm = zero::create_nccl_communicator_with_mpi(**device);
            if (!comm.has_value()) {
                std::fprintf(stderr, "rank %d: %s\n", rank, comm.error().to_string().c_str());
                rc = 1;
            } else {
                const std::size_t n = 1 << 20;
                auto buffer = (*device)->allocate(n * sizeof(float), "test");
                std::vector<float> host(n, static_cast<float>(rank));
                Status s = (*device)->copy_to_device(*buffer, host.data(), n * sizeof(float), 0);
                if (s.is_ok())
                    s = (*comm)->all_reduce(*buffer, *buffer, n, DType::kFloat32,
                                            zero::ReduceOp::kSum, 0);
                if (s.is_ok())
                    s = (*device)->copy_to_host(host.data(), *buffer, n * sizeof(float), 0);
                if (s.is_ok()) s = (*device)->synchronize(0);
                const float expected = static_cast<float>(world * (world - 1) / 2);
                if (!s.is_ok() || host[0] != expected || host[n - 1] != expected) {
                    std::fprintf(stderr, "rank %d: all_reduce gave %g, expected %g (%s)\n", rank,
                                 host[0], expected, s.to_string().c_str());
                    rc = 1;
                } else if (rank == 0) {
                    std::printf("ok: NCCL over MPI, %d ranks\n", world);
                }
                (*device)->free(*buffer);
            }
        }
    }
    MPI_Finalize();
    return rc;
}
