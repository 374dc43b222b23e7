// FaultyBackend and parse_fault_plan: every injected fault reaches the caller with its context,
// without a hang or a lost piece; sweeps fail the n-th piece of a scenario for every n.
#include "io/faulty_backend.h"

#include <gtest/gtest.h>

#include "io/fault.h"
#include "tests/io/io_test_util.h"

namespace zinf::io::test {
namespace {

using Tristate = io::DirectMode;

TEST(FaultPlan, ParsesEveryKey) {
    auto plan = parse_fault_plan(
        "fail_nth=5,errno=ENOSPC,short=0.1,latency_us=100-200,enospc_after=1GiB,read_error=0.01,"
        "write_error=0.02,corrupt=0.001,seed=7");
    ASSERT_TRUE(plan.has_value()) << plan.error().to_string();
    EXPECT_EQ(plan->fail_nth_op, 5u);
    EXPECT_EQ(plan->errno_to_inject, ENOSPC);
    EXPECT_DOUBLE_EQ(plan->short_transfer_probability, 0.1);
    EXPECT_EQ(plan->latency_us_min, 100u);
    EXPECT_EQ(plan->latency_us_max, 200u);
    EXPECT_EQ(plan->enospc_after_bytes, 1ULL << 30);
    EXPECT_DOUBLE_EQ(plan->read_error_probability, 0.01);
    EXPECT_DOUBLE_EQ(plan->write_error_probability, 0.02);
    EXPECT_DOUBLE_EQ(plan->corrupt_probability, 0.001);
    EXPECT_EQ(plan->seed, 7u);
    auto single = parse_fault_plan("latency_us=50,errno=5");
    ASSERT_TRUE(single.has_value());
    EXPECT_EQ(single->latency_us_min, 50u);
    EXPECT_EQ(single->latency_us_max, 50u);
    EXPECT_EQ(single->errno_to_inject, 5);
    EXPECT_TRUE(parse_fault_plan("").has_value());
}

TEST(FaultPlan, RejectsBadInput) {
    for (const char* bad : {"fail_nth=-1", "short=2", "errno=EWHAT", "latency_us=200-100",
                            "bogus=1", "fail_nth", "read_error=abc", "enospc_after=lots"}) {
        auto plan = parse_fault_plan(bad);
        ASSERT_FALSE(plan.has_value()) << bad;
        EXPECT_EQ(plan.error().code(), StatusCode::kInvalidArgument) << bad;
        EXPECT_NE(plan.error().message().find("fault plan"), std::string::npos) << bad;
    }
}

// The scenario of a sweep: one 1 MiB write (16 pieces of 64 KiB), one 256 KiB + 100 byte write,
// then reads of both. Returns the first error, or OK.
struct ScenarioResult {
    Status status;
    bool data_ok = true;
};

ScenarioResult run_scenario(Engine& engine, FileId file) {
    ScenarioResult result;
    AlignedBuffer out = must_allocate(2 << 20), in = must_allocate(2 << 20);
    std::mt19937_64 rng(11);
    fill_random(out.span(), rng);
    IoHandle a, b;
    Engine::BatchItem items[2] = {
        {&a, OpKind::kWrite, file, 0, out.span().subspan(0, 1 << 20)},
        {&b, OpKind::kWrite, file, 1 << 20, out.span().subspan(1 << 20, (256 << 10) + 100)}};
    EXPECT_TRUE(engine.submit(items).is_ok());
    Status sa = a.wait_for(kHangTimeout);
    Status sb = b.wait_for(kHangTimeout);
    EXPECT_NE(sa.code(), StatusCode::kTimeout);
    EXPECT_NE(sb.code(), StatusCode::kTimeout);
    if (!sa.is_ok()) result.status = sa;
    if (result.status.is_ok() && !sb.is_ok()) result.status = sb;
    if (!result.status.is_ok()) return result;
    items[0].op = items[1].op = OpKind::kRead;
    items[0].buffer = in.span().subspan(0, 1 << 20);
    items[1].buffer = in.span().subspan(1 << 20, (256 << 10) + 100);
    EXPECT_TRUE(engine.submit(items).is_ok());
    sa = a.wait_for(kHangTimeout);
    sb = b.wait_for(kHangTimeout);
    EXPECT_NE(sa.code(), StatusCode::kTimeout);
    EXPECT_NE(sb.code(), StatusCode::kTimeout);
    if (!sa.is_ok()) result.status = sa;
    if (result.status.is_ok() && !sb.is_ok()) result.status = sb;
    if (result.status.is_ok()) {
        result.data_ok = std::memcmp(in.data(), out.data(), (1 << 20) + (256 << 10) + 100) == 0;
    }
    return result;
}

class FaultSweep : public ::testing::TestWithParam<std::string> {};

TEST_P(FaultSweep, FailNthPieceSurfacesWithContext) {
    zinf::test::TempDir dir("sweep");
    // 16 + 5 write pieces, then 16 + 5 read pieces; n runs one past the end.
    constexpr int kPieces = 42;
    int failures = 0;
    for (int n = 1; n <= kPieces + 1; ++n) {
        FaultPlan plan;
        plan.fail_nth_op = static_cast<std::uint64_t>(n);
        plan.seed = zinf::test::seed();
        std::string skip;
        auto engine = make_engine(GetParam(), Tristate::kAuto, &skip, plan);
        if (!engine) {
            GTEST_SKIP() << skip;
        }
        FileOptions fo;
        fo.create = true;
        fo.truncate = true;
        const std::string path = GetParam() == "sim" ? "sweep-file" : dir.file("f");
        auto file = engine->open(path, fo);
        ASSERT_TRUE(file.has_value());
        const ScenarioResult r = run_scenario(*engine, *file);
        if (r.status.is_ok()) {
            EXPECT_TRUE(r.data_ok) << "n=" << n;
            EXPECT_GT(n, kPieces) << "the injected fault was lost";
            continue;
        }
        ++failures;
        const std::string& m = r.status.message();
        EXPECT_EQ(r.status.errno_value(), EIO) << m;
        EXPECT_TRUE(r.status.is_injected()) << "the engine lost the injected mark: " << m;
        EXPECT_NE(m.find(path), std::string::npos) << m;
        EXPECT_NE(m.find(" offset "), std::string::npos) << m;
        EXPECT_NE(m.find(" length "), std::string::npos) << m;
        EXPECT_TRUE(m.rfind("read ", 0) == 0 || m.rfind("write ", 0) == 0) << m;
        EXPECT_NE(m.find("Input/output error"), std::string::npos) << m;
        EXPECT_TRUE(engine->close(*file).is_ok());
    }
    EXPECT_EQ(failures, kPieces);
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultSweep, ::testing::Values("sim", "io_uring", "posix"));

class KernelSubmitFaults : public ::testing::TestWithParam<std::string> {};

class Faults : public ::testing::TestWithParam<std::string> {
protected:
    std::unique_ptr<Engine> make(const FaultPlan& plan, FileId* file) {
        std::string skip;
        auto engine = make_engine(GetParam(), Tristate::kAuto, &skip, plan);
        if (!engine) return nullptr;
        FileOptions fo;
        fo.create = true;
        auto f = engine->open(GetParam() == "sim" ? "faults" : dir_.file("f"), fo);
        EXPECT_TRUE(f.has_value());
        *file = f.has_value() ? *f : 0;
        return engine;
    }
    zinf::test::TempDir dir_{"faults"};
};

TEST_P(Faults, ShortTransfersAreResubmittedAndDataSurvives) {
    FaultPlan plan;
    plan.short_transfer_probability = 0.5;
    plan.seed = zinf::test::seed();
    FileId file = 0;
    auto engine = make(plan, &file);
    if (!engine) {
        GTEST_SKIP();
    }
    const ScenarioResult r = run_scenario(*engine, file);
    ASSERT_TRUE(r.status.is_ok()) << r.status.to_string();
    EXPECT_TRUE(r.data_ok);
    EXPECT_GT(engine->stats().short_transfers_resubmitted, 0u);
}

TEST_P(Faults, EnospcAfterBytesIsANoSpaceErrorWithContext) {
    FaultPlan plan;
    plan.enospc_after_bytes = 512 * 1024;
    FileId file = 0;
    auto engine = make(plan, &file);
    if (!engine) {
        GTEST_SKIP();
    }
    AlignedBuffer out = must_allocate(1 << 20);
    const Status st = engine->write(file, 0, out.span());
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.code(), StatusCode::kNoSpace) << st.to_string();
    EXPECT_NE(st.message().find("write "), std::string::npos);
    EXPECT_NE(st.message().find("No space left on device"), std::string::npos) << st.to_string();
}

TEST_P(Faults, ErrorProbabilityOneFailsEveryOperation) {
    FaultPlan plan;
    plan.read_error_probability = 1.0;
    plan.errno_to_inject = ENODEV;
    FileId file = 0;
    auto engine = make(plan, &file);
    if (!engine) {
        GTEST_SKIP();
    }
    AlignedBuffer buf = must_allocate(256 * 1024);
    ASSERT_TRUE(engine->write(file, 0, buf.span()).is_ok());  // only reads fail
    const Status st = engine->read(file, 0, buf.span());
    EXPECT_EQ(st.errno_value(), ENODEV) << st.to_string();
}

TEST_P(Faults, CorruptionFlipsAByteOfARead) {
    FaultPlan plan;
    plan.corrupt_probability = 1.0;
    FileId file = 0;
    auto engine = make(plan, &file);
    if (!engine) {
        GTEST_SKIP();
    }
    AlignedBuffer out = must_allocate(64 * 1024, true), in = must_allocate(64 * 1024, true);
    ASSERT_TRUE(engine->write(file, 0, out.span()).is_ok());
    ASSERT_TRUE(engine->read(file, 0, in.span()).is_ok());
    EXPECT_NE(std::memcmp(in.data(), out.data(), in.size()), 0);
}

TEST_P(Faults, LatencyIsAdded) {
    FaultPlan plan;
    plan.latency_us_min = 20000;
    plan.latency_us_max = 30000;
    FileId file = 0;
    auto engine = make(plan, &file);
    if (!engine) {
        GTEST_SKIP();
    }
    AlignedBuffer buf = must_allocate(4096);
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(engine->write(file, 0, buf.span()).is_ok());
    EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(20));
}

TEST_P(Faults, RandomFaultStormNeverHangs) {
    FaultPlan plan;
    plan.seed = zinf::test::seed();
    plan.read_error_probability = 0.05;
    plan.write_error_probability = 0.05;
    plan.short_transfer_probability = 0.2;
    plan.latency_us_max = 300;
    FileId file = 0;
    auto engine = make(plan, &file);
    if (!engine) {
        GTEST_SKIP();
    }
    int errors = 0;
    for (int i = 0; i < 10; ++i) {
        const ScenarioResult r = run_scenario(*engine, file);
        if (!r.status.is_ok()) {
            ++errors;
            EXPECT_NE(r.status.message().find(" offset "), std::string::npos)
                << r.status.to_string();
        } else {
            EXPECT_TRUE(r.data_ok);
        }
    }
    SUCCEED() << errors << " of 10 scenarios met a fault";
}

INSTANTIATE_TEST_SUITE_P(Backends, Faults, ::testing::Values("sim", "io_uring", "libaio", "posix"));

SubmitCall refuse_every_submit(void*, std::size_t) noexcept {
    return SubmitCall{0, EIO};
}

// The wrapper holds what its inner backend does not take and offers it again; a refusal (not
// busy) must fail a piece each time, or a lasting one would hold the pieces forever.
TEST_P(KernelSubmitFaults, RefusedSubmitFailsThePiecesThroughTheWrapperInsteadOfHanging) {
    FaultPlan plan;
    plan.seed = zinf::test::seed();
    Seams seams;
    seams.submit = &refuse_every_submit;
    std::string skip;
    auto engine = make_engine(GetParam(), Tristate::kAuto, &skip, plan, nullptr, seams);
    if (!engine) {
        GTEST_SKIP() << skip;
    }
    zinf::test::TempDir dir("refused");
    FileOptions fo;
    fo.create = true;
    auto file = engine->open(dir.file("f"), fo);
    ASSERT_TRUE(file.has_value());
    AlignedBuffer out = must_allocate(1 << 20);
    IoHandle h;
    ASSERT_TRUE(engine->submit_write(h, *file, 0, out.span()).is_ok());
    const Status st = h.wait_for(kHangTimeout);
    ASSERT_NE(st.code(), StatusCode::kTimeout) << "a refused piece was held forever";
    EXPECT_EQ(st.errno_value(), EIO) << st.to_string();
    EXPECT_NE(st.message().find("write " + dir.file("f") + " offset "), std::string::npos)
        << st.to_string();
}

INSTANTIATE_TEST_SUITE_P(Backends, KernelSubmitFaults, ::testing::Values("io_uring", "libaio"));

}  // namespace
}  // namespace zinf::io::test
