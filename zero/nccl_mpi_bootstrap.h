// Bootstrap of an NcclCommunicator over MPI: rank 0 of MPI_COMM_WORLD makes the NCCL id and
// broadcasts it; every rank then joins with its MPI rank. Compiled only where MPI is found (target
// zinf_zero_nccl_mpi). UNTESTED on several GPUs: it is compiled and linked on every CI run, and
// tests/zero/nccl_mpi_check runs it once a machine with several GPUs is available.
#pragma once

#include <memory>

#include "zero/nccl_communicator.h"

namespace zinf::zero {

// Collective over MPI_COMM_WORLD; the caller has called MPI_Init (and calls MPI_Finalize after
// the communicator is gone). `device` should be the GPU of this rank's local rank
// (CudaDevice::local_rank_from_environment()). Errors: kInternal for an MPI failure, else those
// of NcclCommunicator::create.
Result<std::unique_ptr<NcclCommunicator>> create_nccl_communicator_with_mpi(
    device::CudaDevice& device, const NcclCommunicatorOptions& options = {});

}  // namespace zinf::zero
