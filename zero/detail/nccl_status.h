// NCCL results as zinf::Status (STYLE.md §4). Private to zero/.
#pragma once

#include <nccl.h>

#include "src/base/log.h"
#include "src/base/status.h"

namespace zinf::zero::detail {

// "<what>: <ncclGetErrorString> (<ncclGetLastError>)" as kNccl.
inline Status nccl_error_status(ncclResult_t result, const char* what, ncclComm_t comm) {
    const char* last = ncclGetLastError(comm);
    return Status::nccl(str_cat(
        what, ": ", ncclGetErrorString(result), (last != nullptr && *last != '\0') ? " (" : "",
        last != nullptr ? last : "", (last != nullptr && *last != '\0') ? ")" : ""));
}

}  // namespace zinf::zero::detail

// Returns a Status from the enclosing function when the NCCL call `expr` fails. `comm` names
// the communicator whose last error is reported (may be nullptr).
#define ZINF_NCCL_TRY(expr, comm)                                                             \
    do {                                                                                      \
        const ncclResult_t zinf_nccl_result_ = (expr);                                        \
        if (zinf_nccl_result_ != ncclSuccess)                                                 \
            return ::zinf::zero::detail::nccl_error_status(zinf_nccl_result_, #expr, (comm)); \
    } while (0)
