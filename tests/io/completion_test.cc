// io::detail::classify_completion on hand-made inputs: every branch of the rule the io_uring,
// libaio and posix backends (and the simulated device) share, and its bounds. The conformance
// suite reaches the same branches through each backend.
#include "io/detail/completion.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace zinf::io::detail {
namespace {

Request piece(OpKind op, std::uint32_t length, std::uint32_t done = 0) {
    Request r;
    r.op = op;
    r.fd = 3;
    r.length_bytes = length;
    r.done_bytes = done;
    return r;
}

TEST(Completion, EveryByteMovedCompletes) {
    const Request r = piece(OpKind::kWrite, 4096);
    const Verdict v = classify_completion(r, 4096);
    EXPECT_EQ(v.next, Next::kComplete);
    EXPECT_EQ(v.done_bytes, 4096u);
    EXPECT_EQ(v.error, 0);
    // The rest of a resubmitted piece completes it too.
    const Verdict rest = classify_completion(piece(OpKind::kRead, 4096, 1000), 3096);
    EXPECT_EQ(rest.next, Next::kComplete);
    EXPECT_EQ(rest.done_bytes, 4096u);
}

TEST(Completion, ShortTransferResubmitsTheRestFromTheNewProgress) {
    for (const OpKind op : {OpKind::kRead, OpKind::kWrite}) {
        const Verdict v = classify_completion(piece(op, 65536, 4096), 8192);
        EXPECT_EQ(v.next, Next::kResubmit);
        EXPECT_EQ(v.done_bytes, 12288u);
        EXPECT_EQ(v.error, 0);
    }
    // One byte is progress too.
    EXPECT_EQ(classify_completion(piece(OpKind::kRead, 2), 1).next, Next::kResubmit);
}

TEST(Completion, ZeroByteReadIsEndOfFileAndKeepsWhatWasRead) {
    const Verdict v = classify_completion(piece(OpKind::kRead, 16384, 10000), 0);
    EXPECT_EQ(v.next, Next::kEndOfFile);
    EXPECT_EQ(v.done_bytes, 10000u);
    EXPECT_EQ(classify_completion(piece(OpKind::kRead, 512), 0).next, Next::kEndOfFile);
}

TEST(Completion, ZeroByteWriteIsRetriedThenFailsWithEio) {
    Request r = piece(OpKind::kWrite, 4096);
    for (int i = 0; i < kMaxRetries; ++i) {
        const Verdict v = classify_completion(r, 0);
        ASSERT_EQ(v.next, Next::kRetry) << i;
        EXPECT_EQ(apply_verdict(r, v), Next::kRetry);
    }
    EXPECT_EQ(r.retries, kMaxRetries);
    const Verdict last = classify_completion(r, 0);
    EXPECT_EQ(last.next, Next::kError);
    EXPECT_EQ(last.error, EIO);
}

TEST(Completion, EagainAndEintrAreRetriedUpToTheBoundThenReported) {
    for (const int err : {EAGAIN, EINTR}) {
        for (const OpKind op : {OpKind::kRead, OpKind::kWrite}) {
            Request r = piece(op, 4096, 512);
            r.short_transfers = 1;
            for (int i = 0; i < kMaxRetries; ++i) {
                const Verdict v = classify_completion(r, -err);
                ASSERT_EQ(v.next, Next::kRetry) << err << " " << i;
                EXPECT_EQ(v.done_bytes, 512u);
                apply_verdict(r, v);
            }
            const Verdict last = classify_completion(r, -err);
            EXPECT_EQ(last.next, Next::kError) << err;
            EXPECT_EQ(last.error, err);
            EXPECT_EQ(last.done_bytes, 512u);
        }
    }
}

TEST(Completion, EinvalAfterAShortReadIsEndOfFile) {
    // A short O_DIRECT read at the end of the file leaves an unaligned rest; the kernel refuses
    // to read it with EINVAL.
    Request r = piece(OpKind::kRead, 16384);
    apply_verdict(r, classify_completion(r, 10000));
    EXPECT_EQ(r.short_transfers, 1);
    const Verdict v = classify_completion(r, -EINVAL);
    EXPECT_EQ(v.next, Next::kEndOfFile);
    EXPECT_EQ(v.done_bytes, 10000u);
}

TEST(Completion, EinvalWithoutAShortReadOrOnAWriteIsAnError) {
    const Verdict first = classify_completion(piece(OpKind::kRead, 4096), -EINVAL);
    EXPECT_EQ(first.next, Next::kError);
    EXPECT_EQ(first.error, EINVAL);
    Request w = piece(OpKind::kWrite, 16384, 8192);
    w.short_transfers = 1;
    const Verdict write = classify_completion(w, -EINVAL);
    EXPECT_EQ(write.next, Next::kError);
    EXPECT_EQ(write.error, EINVAL);
}

TEST(Completion, OtherErrorsAreReportedAtOnceWithTheirErrno) {
    for (const int err : {EIO, ENOSPC, EBADF, EFAULT, EROFS, EDQUOT}) {
        Request r = piece(OpKind::kWrite, 4096);
        const Verdict v = classify_completion(r, -err);
        EXPECT_EQ(v.next, Next::kError) << err;
        EXPECT_EQ(v.error, err);
        EXPECT_EQ(apply_verdict(r, v), Next::kError);
        EXPECT_EQ(r.retries, 0);
    }
}

TEST(Completion, ApplyVerdictRecordsProgressRetriesAndShortTransfers) {
    Request r = piece(OpKind::kRead, 65536);
    EXPECT_EQ(apply_verdict(r, classify_completion(r, 4096)), Next::kResubmit);
    EXPECT_EQ(apply_verdict(r, classify_completion(r, -EINTR)), Next::kRetry);
    EXPECT_EQ(apply_verdict(r, classify_completion(r, 8192)), Next::kResubmit);
    EXPECT_EQ(apply_verdict(r, classify_completion(r, -EAGAIN)), Next::kRetry);
    EXPECT_EQ(apply_verdict(r, classify_completion(r, 65536 - 12288)), Next::kComplete);
    EXPECT_EQ(r.done_bytes, 65536u);
    EXPECT_EQ(r.short_transfers, 2);
    EXPECT_EQ(r.retries, 2);
    // The verdicts of end of file and errors leave the request as it was.
    Request e = piece(OpKind::kRead, 4096, 100);
    EXPECT_EQ(apply_verdict(e, classify_completion(e, 0)), Next::kEndOfFile);
    EXPECT_EQ(e.done_bytes, 100u);
    EXPECT_EQ(e.retries, 0);
    EXPECT_EQ(e.short_transfers, 0);
}

}  // namespace
}  // namespace zinf::io::detail
