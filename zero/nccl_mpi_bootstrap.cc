// NCCL bootstrap over MPI: the unique id travels by MPI_Bcast from rank 0.
#include "zero/nccl_mpi_bootstrap.h"

#include <mpi.h>

#include "src/base/log.h"

namespace zinf::zero {
namespace {

Status mpi_status(int code, const char* what) {
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
    return Status::internal(str_cat(what, ": MPI error ", code, ": ", std::string(text, length)));
}

}  // namespace

Result<std::unique_ptr<NcclCommunicator>> create_nccl_communicator_with_mpi(
    device::CudaDevice& device, const NcclCommunicatorOptions& options) {
    int initialized = 0;
    if (MPI_Initialized(&initialized) != MPI_SUCCESS || initialized == 0) {
        return Status::invalid_argument("NCCL bootstrap over MPI: MPI_Init has not been called");
    }
    int rank = 0;
    int world_size = 0;
    if (int rc = MPI_Comm_rank(MPI_COMM_WORLD, &rank); rc != MPI_SUCCESS) {
        return mpi_status(rc, "MPI_Comm_rank");
    }
    if (int rc = MPI_Comm_size(MPI_COMM_WORLD, &world_size); rc != MPI_SUCCESS) {
        return mpi_status(rc, "MPI_Comm_size");
    }
    NcclUniqueId id;
    // Rank 0's failure must reach the others, or they would wait in MPI_Bcast: it broadcasts a
    // flag first.
    int ok_flag = 1;
    Status make_status;
    if (rank == 0) {
        auto made = NcclCommunicator::make_unique_id();
        if (made.has_value()) {
            id = *made;
        } else {
            make_status = made.error();
            ok_flag = 0;
        }
    }
    if (int rc = MPI_Bcast(&ok_flag, 1, MPI_INT, 0, MPI_COMM_WORLD); rc != MPI_SUCCESS) {
        return mpi_status(rc, "MPI_Bcast(flag)");
    }
    if (ok_flag == 0) {
        if (rank == 0) return make_status;
        return Status::nccl("NCCL bootstrap over MPI: rank 0 could not make the unique id");
    }
    if (int rc = MPI_Bcast(id.bytes.data(), static_cast<int>(id.bytes.size()), MPI_BYTE, 0,
                           MPI_COMM_WORLD);
        rc != MPI_SUCCESS) {
        return mpi_status(rc, "MPI_Bcast(ncclUniqueId)");
    }
    return NcclCommunicator::create(device, id, rank, world_size, options);
}

}  // namespace zinf::zero
