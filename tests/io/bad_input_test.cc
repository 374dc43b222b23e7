// Bad inputs give clear errors that name what is wrong: missing paths, files where directories
// are expected, sizes beyond free space, empty buffers, block sizes the file system cannot take.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "io/engine.h"
#include "tests/io/io_test_util.h"

namespace zinf::io::test {
namespace {

using Tristate = io::DirectMode;

class BadInput : public ::testing::Test {
protected:
    void SetUp() override {
        std::string skip;
        engine_ = make_engine("posix", Tristate::kAuto, &skip);
        ASSERT_TRUE(engine_);
    }
    zinf::test::TempDir dir_{"bad"};
    std::unique_ptr<Engine> engine_;
};

TEST_F(BadInput, MissingFileWithoutCreate) {
    auto f = engine_->open(dir_.file("nope"), FileOptions{});
    ASSERT_FALSE(f.has_value());
    EXPECT_EQ(f.error().code(), StatusCode::kNotFound);
    EXPECT_NE(f.error().message().find(dir_.file("nope")), std::string::npos)
        << f.error().to_string();
}

TEST_F(BadInput, MissingDirectory) {
    FileOptions fo;
    fo.create = true;
    const std::string path = dir_.file("no-such-dir/f");
    auto f = engine_->open(path, fo);
    ASSERT_FALSE(f.has_value());
    EXPECT_NE(f.error().message().find("does not exist"), std::string::npos)
        << f.error().to_string();
    EXPECT_NE(f.error().message().find(dir_.file("no-such-dir")), std::string::npos);
}

TEST_F(BadInput, FileWhereADirectoryIsExpected) {
    std::ofstream(dir_.file("plain")) << "x";
    FileOptions fo;
    fo.create = true;
    auto f = engine_->open(dir_.file("plain/f"), fo);
    ASSERT_FALSE(f.has_value());
    EXPECT_NE(f.error().message().find("where a directory is expected"), std::string::npos)
        << f.error().to_string();
}

TEST_F(BadInput, DirectoryWhereAFileIsExpected) {
    ASSERT_EQ(::mkdir(dir_.file("d").c_str(), 0700), 0);
    auto f = engine_->open(dir_.file("d"), FileOptions{});
    ASSERT_FALSE(f.has_value());
    EXPECT_NE(f.error().message().find("is a directory"), std::string::npos)
        << f.error().to_string();
}

// An error is taken for an injected fault by its mark, not by its text: a real EISDIR on a path
// that happens to contain "injected" is still explained.
TEST_F(BadInput, DirectoryNamedInjectedIsExplainedNotTakenForAFault) {
    ASSERT_EQ(::mkdir(dir_.file("injected").c_str(), 0700), 0);
    auto f = engine_->open(dir_.file("injected"), FileOptions{});
    ASSERT_FALSE(f.has_value());
    EXPECT_FALSE(f.error().is_injected());
    EXPECT_EQ(f.error().code(), StatusCode::kInvalidArgument) << f.error().to_string();
    EXPECT_NE(f.error().message().find("is a directory, expected a file"), std::string::npos)
        << f.error().to_string();
}

TEST_F(BadInput, ExclusiveCreateOfAnExistingFile) {
    std::ofstream(dir_.file("e")) << "x";
    FileOptions fo;
    fo.create = true;
    fo.exclusive = true;
    auto f = engine_->open(dir_.file("e"), fo);
    ASSERT_FALSE(f.has_value());
    EXPECT_EQ(f.error().errno_value(), EEXIST);
}

TEST_F(BadInput, PreallocationBeyondFreeSpace) {
    FileOptions fo;
    fo.create = true;
    fo.preallocate_bytes = 1ULL << 50;  // 1 PiB
    auto f = engine_->open(dir_.file("huge"), fo);
    ASSERT_FALSE(f.has_value());
    EXPECT_EQ(f.error().code(), StatusCode::kNoSpace) << f.error().to_string();
    EXPECT_NE(f.error().message().find("bytes free"), std::string::npos) << f.error().to_string();
    // The half-made file is not left behind.
    EXPECT_NE(::access(dir_.file("huge").c_str(), F_OK), 0);
}

TEST_F(BadInput, EmptyBufferUnknownFileAndWriteToReadOnly) {
    FileOptions fo;
    fo.create = true;
    auto f = engine_->open(dir_.file("z"), fo);
    ASSERT_TRUE(f.has_value());
    IoHandle h;
    const Status empty = engine_->submit_read(h, *f, 0, std::span<std::byte>());
    EXPECT_EQ(empty.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(empty.message().find("length 0"), std::string::npos) << empty.to_string();
    AlignedBuffer buf = must_allocate(4096);
    EXPECT_EQ(engine_->submit_read(h, 999, 0, buf.span()).code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(h.done());
    FileOptions ro;
    ro.read_only = true;
    auto r = engine_->open(dir_.file("z"), ro);
    ASSERT_TRUE(r.has_value());
    const Status w = engine_->write(*r, 0, buf.span());
    EXPECT_EQ(w.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(w.message().find("read-only"), std::string::npos);
    EXPECT_EQ(engine_->close(12345).code(), StatusCode::kInvalidArgument);
}

TEST(BadConfig, BlockSizeNotAMultipleOfTheLogicalBlockSize) {
    EngineOptions o;
    o.aio.block_size_bytes = 6144;  // a multiple of 512, not of 4096
    SimOptions sim;
    sim.logical_block_bytes = 4096;
    o.sim = sim;
    auto engine = Engine::create(o);
    ASSERT_TRUE(engine.has_value());
    FileOptions fo;
    fo.create = true;
    auto f = (*engine)->open("lbs", fo);
    ASSERT_FALSE(f.has_value());
    EXPECT_EQ(f.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(f.error().message().find("aio.block_size"), std::string::npos)
        << f.error().to_string();
    EXPECT_NE(f.error().message().find("4096"), std::string::npos);
}

TEST(BadConfig, OutOfRangeEngineOptions) {
    EngineOptions o;
    o.aio.queue_depth = 0;
    EXPECT_FALSE(Engine::create(o).has_value());
    o = EngineOptions{};
    o.aio.intra_op_parallelism = 0;
    EXPECT_FALSE(Engine::create(o).has_value());
    o = EngineOptions{};
    o.aio.block_size_bytes = 0;
    EXPECT_FALSE(Engine::create(o).has_value());
}

}  // namespace
}  // namespace zinf::io::test
