// CUDA runtime errors as zinf::Status (STYLE.md §4): ZINF_CUDA_TRY and the probe that GPU tests
// and tools use to tell "no GPU here" from a failure. Compiled only where CUDA is enabled.
#pragma once

#include <cuda_runtime_api.h>

#include "src/base/status.h"

namespace zinf::kernels::cuda {

// Whether `error` leaves the CUDA context unusable: every later call of the process fails too,
// so the engine must report it and stop the step (STYLE.md §4).
bool is_sticky_error(cudaError_t error) noexcept;

// Builds the Status for a failed CUDA call: "<what>: <cudaGetErrorName>: <cudaGetErrorString>
// (<file>:<line>)", with "; sticky: ..." appended for sticky errors. Out of memory is kNoSpace (an
// operating error callers can handle by evicting), everything else kCuda. Clears the calling
// thread's last-error slot so that a later cudaGetLastError does not report it twice.
Status cuda_error_status(cudaError_t error, const char* what, const char* file, int line);

// OK when at least one CUDA device is usable; otherwise a kCuda Status whose message is
// "no CUDA device: <cudaGetDeviceCount's error string>" (tests pass it to GTEST_SKIP).
Status probe_device();

}  // namespace zinf::kernels::cuda

// Returns a Status from the enclosing function when the CUDA runtime call `expr` fails.
#define ZINF_CUDA_TRY(expr)                                                                    \
    do {                                                                                       \
        const cudaError_t zinf_cuda_error_ = (expr);                                           \
        if (zinf_cuda_error_ != cudaSuccess)                                                   \
            return ::zinf::kernels::cuda::cuda_error_status(zinf_cuda_error_, #expr, __FILE__, \
                                                            __LINE__);                         \
    } while (0)

// After a kernel launch: reports a bad launch configuration (or an earlier sticky error).
#define ZINF_CUDA_TRY_LAUNCH(what) ZINF_CUDA_TRY((static_cast<void>(what), cudaGetLastError()))
