// Status, Result and the assertion macros.
#include "src/base/status.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace zinf {
namespace {

Status fails() {
    return Status::io_error("read /x at 4096+512", EIO);
}
Status chain() {
    ZINF_TRY(fails());
    return Status::ok();
}
Result<int> make(int v) {
    if (v < 0) return Status::invalid_argument("negative");
    return v * 2;
}
Result<int> twice(int v) {
    ZINF_ASSIGN_OR_RETURN(int x, make(v));
    return x + 1;
}

TEST(StatusTest, OkHoldsNothing) {
    Status s;
    EXPECT_TRUE(s.is_ok());
    EXPECT_EQ(s.code(), StatusCode::kOk);
    EXPECT_EQ(s.to_string(), "OK");
    EXPECT_TRUE(s.message().empty());
}

TEST(StatusTest, ErrorsCarryCodeErrnoAndContext) {
    Status s = chain();
    ASSERT_FALSE(s.is_ok());
    EXPECT_EQ(s.code(), StatusCode::kIo);
    EXPECT_EQ(s.errno_value(), EIO);
    EXPECT_NE(s.to_string().find("read /x at 4096+512"), std::string::npos);
    Status c = s.with_context("swap in partition 3");
    EXPECT_EQ(c.message(), "swap in partition 3: read /x at 4096+512");
    EXPECT_EQ(c.errno_value(), EIO);
    Status copy = c;
    EXPECT_EQ(copy.message(), c.message());
}

TEST(StatusTest, AnInjectedFaultIsKnownByItsMarkThroughContextAndCopies) {
    const Status real = Status::io_error("injected-looking text from the system", EIO);
    EXPECT_FALSE(real.is_injected()) << "the message does not make a fault injected";
    EXPECT_FALSE(Status().is_injected());
    Status injected = Status::io_error("read /x", EIO).mark_injected();
    EXPECT_TRUE(injected.is_injected());
    EXPECT_EQ(injected.code(), StatusCode::kIo);
    EXPECT_EQ(injected.errno_value(), EIO);
    EXPECT_EQ(injected.message(), "read /x");
    const Status wrapped = injected.with_context("swap in partition 3");
    EXPECT_TRUE(wrapped.is_injected());
    const Status copy = wrapped;
    EXPECT_TRUE(copy.is_injected());
    Result<int> result = copy;
    EXPECT_TRUE(result.error().is_injected());
    EXPECT_TRUE(result.status().is_injected());
    const Status moved = std::move(injected);
    EXPECT_TRUE(moved.is_injected());
}

TEST(StatusTest, EnospcIsNoSpace) {
    EXPECT_EQ(Status::io_error("w", ENOSPC).code(), StatusCode::kNoSpace);
    EXPECT_EQ(Status::from_errno(ENOSPC, "w").code(), StatusCode::kNoSpace);
    EXPECT_EQ(Status::from_errno(ENOENT, "open").code(), StatusCode::kNotFound);
    EXPECT_NE(Status::from_errno(ENOENT, "open /a").message().find("No such file"),
              std::string::npos);
}

TEST(ResultTest, ValueOrError) {
    auto ok = twice(3);
    ASSERT_TRUE(ok.has_value());
    EXPECT_EQ(*ok, 7);
    auto bad = twice(-1);
    ASSERT_FALSE(bad.has_value());
    EXPECT_EQ(bad.error().code(), StatusCode::kInvalidArgument);
}

TEST(AssertDeathTest, AssertAbortsWithValues) {
    EXPECT_DEATH({ ZINF_ASSERT_EQ(1 + 1, 3); }, "values: 2 vs 3");
    EXPECT_DEATH({ ZINF_ASSERT(false); }, "assertion failed");
}

}  // namespace
}  // namespace zinf
