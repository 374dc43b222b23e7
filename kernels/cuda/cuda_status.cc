// CUDA runtime errors turned into zinf::Status.
#include "kernels/cuda/cuda_status.h"

#include <string>

#include "src/base/log.h"

namespace zinf::kernels::cuda {

bool is_sticky_error(cudaError_t error) noexcept {
    // The errors CUDA documents as corrupting the context: it must be destroyed (the process
    // restarted) before the device can be used again.
    switch (error) {
        case cudaErrorIllegalAddress:
        case cudaErrorLaunchFailure:
        case cudaErrorHardwareStackError:
        case cudaErrorIllegalInstruction:
        case cudaErrorMisalignedAddress:
        case cudaErrorInvalidAddressSpace:
        case cudaErrorInvalidPc:
        case cudaErrorAssert:
        case cudaErrorECCUncorrectable:
        case cudaErrorLaunchTimeout:
            return true;
        default:
            return false;
    }
}

Status cuda_error_status(cudaError_t error, const char* what, const char* file, int line) {
    ZINF_ASSERT(error != cudaSuccess);
    // Reset the per-thread last error (a no-op for sticky errors, which persist regardless).
    static_cast<void>(cudaGetLastError());
    std::string message = str_cat(what, ": ", cudaGetErrorName(error), ": ",
                                  cudaGetErrorString(error), " (", file, ":", line, ")");
    if (is_sticky_error(error)) {
        message += "; sticky: the CUDA context is unusable, stop the step and restart the process";
    }
    if (error == cudaErrorMemoryAllocation) return Status::no_space(std::move(message), 0);
    return Status::cuda(std::move(message));
}

Status probe_device() {
    int count = 0;
    const cudaError_t error = cudaGetDeviceCount(&count);
    if (error != cudaSuccess) {
        static_cast<void>(cudaGetLastError());
        return Status::cuda(str_cat("no CUDA device: ", cudaGetErrorString(error)));
    }
    if (count == 0) return Status::cuda("no CUDA device: cudaGetDeviceCount found 0 devices");
    return Status::ok();
}

}  // namespace zinf::kernels::cuda
