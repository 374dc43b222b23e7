// The one rule by which the io_uring, libaio and posix backends (and the simulated device) turn
// the raw result of a transfer (bytes moved, or -errno) into what happens to the piece next. It
// used to be written out in each backend, and the copies had drifted apart (only io_uring read an
// EINVAL after a short O_DIRECT read as the end of the file).
#pragma once

#include <cerrno>
#include <cstdint>
#include <limits>

#include "io/backend.h"
#include "src/base/assert.h"

namespace zinf::io::detail {

enum class Next : std::uint8_t {
    kComplete,   // every byte has moved: complete with OK
    kResubmit,   // a short transfer: send the rest, from the new done_bytes
    kRetry,      // EAGAIN, EINTR or a zero-byte write, within kMaxRetries: send the rest again
    kEndOfFile,  // a read met the end of the file: complete with "unexpected end of file"
    kError,      // complete with `error`
};

struct Verdict {
    Next next = Next::kError;
    std::uint32_t done_bytes = 0;  // the piece's progress once this result counts
    int error = 0;                 // the errno to report with kError; 0 otherwise
};

// Classifies `result`, the kernel's answer for the transfer of [offset_bytes + done_bytes,
// offset_bytes + length_bytes) of `request`: bytes moved (>= 0) or a negative errno. Pure; the
// request is not changed (apply_verdict does the bookkeeping). The rule, in order:
//   result > 0   progress; all of it → kComplete, else kResubmit (the rest, from done_bytes).
//                More bytes than asked is a broken kernel or backend: asserted.
//   result == 0  a read → kEndOfFile (keeps what was read in done_bytes; the engine reports it as
//                an error, it never zero-fills); a write made no progress → kRetry, bounded like
//                EAGAIN, then kError(EIO).
//   EAGAIN/EINTR kRetry while retries < kMaxRetries, then kError with that errno.
//   EINVAL       on a read after a short transfer → kEndOfFile: a short O_DIRECT read at the end
//                of the file leaves an unaligned rest, which the kernel refuses with EINVAL.
//   other        kError.
inline Verdict classify_completion(const Request& request, long result) noexcept {
    ZINF_ASSERT_LT(request.done_bytes, request.length_bytes);
    const std::uint32_t left = request.length_bytes - request.done_bytes;
    if (result > 0) {
        ZINF_ASSERT_LE(static_cast<unsigned long>(result), left);
        const auto done = request.done_bytes + static_cast<std::uint32_t>(result);
        return {done == request.length_bytes ? Next::kComplete : Next::kResubmit, done, 0};
    }
    const bool may_retry = request.retries < kMaxRetries;
    if (result == 0) {
        if (request.op == OpKind::kRead) return {Next::kEndOfFile, request.done_bytes, 0};
        return may_retry ? Verdict{Next::kRetry, request.done_bytes, 0}
                         : Verdict{Next::kError, request.done_bytes, EIO};
    }
    const auto err = static_cast<int>(-result);
    if (err == EAGAIN || err == EINTR) {
        return may_retry ? Verdict{Next::kRetry, request.done_bytes, 0}
                         : Verdict{Next::kError, request.done_bytes, err};
    }
    if (err == EINVAL && request.op == OpKind::kRead && request.short_transfers > 0) {
        return {Next::kEndOfFile, request.done_bytes, 0};
    }
    return {Next::kError, request.done_bytes, err};
}

// Records a verdict in the request: its progress, and the retry and short-transfer counts that
// the engine adds to its statistics. Returns the verdict's next step.
inline Next apply_verdict(Request& request, const Verdict& verdict) noexcept {
    ZINF_ASSERT_GE(verdict.done_bytes, request.done_bytes);
    ZINF_ASSERT_LE(verdict.done_bytes, request.length_bytes);
    request.done_bytes = verdict.done_bytes;
    if (verdict.next == Next::kRetry) {
        ZINF_ASSERT_LT(request.retries, kMaxRetries);
        ++request.retries;
    }
    if (verdict.next == Next::kResubmit &&
        request.short_transfers < std::numeric_limits<std::uint16_t>::max()) {
        ++request.short_transfers;
    }
    return verdict.next;
}

}  // namespace zinf::io::detail
