// Cases that need a file system of their own, mounted by the test as root (skipped otherwise):
// a real full disk (4 MiB tmpfs), a file system that refuses O_DIRECT (ramfs), a read-only
// directory (tmpfs remounted read-only) and a 4 KiB logical block size (loop device).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "io/block_size.h"
#include "io/engine.h"
#include "src/base/file.h"
#include "tests/io/io_test_util.h"

namespace zinf::io::test {
namespace {

using Tristate = io::DirectMode;

// Mounts a file system on a fresh directory; unmounts (lazily) on destruction.
class Mount {
public:
    Mount(const char* source, const char* type, const char* data) : dir_("mnt") {
        ok_ = ::mount(source, dir_.path().c_str(), type, 0, data) == 0;
        if (!ok_) error_ = std::strerror(errno);
    }
    ~Mount() {
        if (ok_) ::umount2(dir_.path().c_str(), MNT_DETACH);
    }
    bool ok() const { return ok_; }
    const std::string& error() const { return error_; }
    std::string file(const std::string& name) const { return dir_.file(name); }
    const std::string& path() const { return dir_.path(); }

private:
    zinf::test::TempDir dir_;
    bool ok_ = false;
    std::string error_;
};

std::string run(const std::string& command) {
    std::string out;
    std::FILE* p = ::popen((command + " 2>/dev/null").c_str(), "r");
    if (p == nullptr) return out;
    char line[512];
    while (std::fgets(line, sizeof line, p) != nullptr) out += line;
    if (::pclose(p) != 0) return "";
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return out;
}

#define REQUIRE_ROOT()                                           \
    do {                                                         \
        if (!zinf::test::is_root()) {                            \
            GTEST_SKIP() << "needs root to mount a file system"; \
        }                                                        \
    } while (0)

TEST(Mounted, FullTmpfsGivesANoSpaceErrorWithContext) {
    REQUIRE_ROOT();
    Mount m("tmpfs", "tmpfs", "size=4m");
    if (!m.ok()) {
        GTEST_SKIP() << "mount tmpfs: " << m.error();
    }
    for (const char* backend : {"io_uring", "libaio", "posix"}) {
        std::string skip;
        auto engine = make_engine(backend, Tristate::kAuto, &skip);
        if (!engine) continue;
        FileOptions fo;
        fo.create = true;
        fo.truncate = true;
        const std::string path = m.file("full");
        auto file = engine->open(path, fo);
        // Older kernels refuse O_DIRECT on tmpfs, newer accept it: auto copes with either.
        ASSERT_TRUE(file.has_value()) << file.error().to_string();
        AlignedBuffer buf = must_allocate(8 << 20);
        IoHandle h;
        ASSERT_TRUE(engine->submit_write(h, *file, 0, buf.span()).is_ok());
        const Status st = h.wait_for(kHangTimeout);
        ASSERT_FALSE(st.is_ok()) << backend;
        EXPECT_EQ(st.code(), StatusCode::kNoSpace) << st.to_string();
        EXPECT_NE(st.message().find(path), std::string::npos) << st.to_string();
        EXPECT_NE(st.message().find("No space left on device"), std::string::npos)
            << st.to_string();
        ASSERT_TRUE(engine->close(*file).is_ok());
        ::unlink(path.c_str());
        // Up front: preallocating more than the file system holds.
        fo.preallocate_bytes = 8 << 20;
        auto big = engine->open(m.file("big"), fo);
        ASSERT_FALSE(big.has_value());
        EXPECT_EQ(big.error().code(), StatusCode::kNoSpace) << big.error().to_string();
        EXPECT_NE(big.error().message().find(m.file("big")), std::string::npos);
    }
}

TEST(Mounted, RamfsRefusesODirect) {
    REQUIRE_ROOT();
    Mount m("ramfs", "ramfs", nullptr);
    if (!m.ok()) {
        GTEST_SKIP() << "mount ramfs: " << m.error();
    }
    std::string skip;
    auto strict = make_engine("io_uring", Tristate::kOn, &skip);
    if (!strict) {
        GTEST_SKIP() << skip;
    }
    FileOptions fo;
    fo.create = true;
    auto refused = strict->open(m.file("f"), fo);
    ASSERT_FALSE(refused.has_value());
    EXPECT_EQ(refused.error().code(), StatusCode::kNotSupported);
    EXPECT_NE(refused.error().message().find("O_DIRECT"), std::string::npos)
        << refused.error().to_string();
    EXPECT_NE(::access(m.file("f").c_str(), F_OK), 0) << "a refused open left its file behind";

    auto lenient = make_engine("io_uring", Tristate::kAuto, &skip);
    ASSERT_TRUE(lenient);
    auto file = lenient->open(m.file("f"), fo);
    ASSERT_TRUE(file.has_value()) << file.error().to_string();
    EXPECT_FALSE(lenient->is_direct(*file));
    EXPECT_EQ(lenient->alignment_bytes(*file), 1u);
    AlignedBuffer out = must_allocate(300000), in = must_allocate(300000);
    std::mt19937_64 rng(zinf::test::seed());
    fill_random(out.span(), rng);
    ASSERT_TRUE(lenient->write(*file, 17, out.span()).is_ok());
    ASSERT_TRUE(lenient->read(*file, 17, in.span()).is_ok());
    EXPECT_EQ(std::memcmp(in.data(), out.data(), out.size()), 0);
}

TEST(Mounted, ReadOnlyDirectory) {
    REQUIRE_ROOT();
    Mount m("tmpfs", "tmpfs", "size=1m");
    if (!m.ok()) {
        GTEST_SKIP() << "mount tmpfs: " << m.error();
    }
    std::ofstream(m.file("existing")) << "data";
    ASSERT_EQ(::mount(nullptr, m.path().c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr), 0)
        << std::strerror(errno);
    EXPECT_FALSE(check_writable_directory(m.path()).is_ok());
    std::string skip;
    auto engine = make_engine("posix", Tristate::kAuto, &skip);
    ASSERT_TRUE(engine);
    FileOptions fo;
    fo.create = true;
    auto f = engine->open(m.file("new"), fo);
    ASSERT_FALSE(f.has_value());
    EXPECT_NE(f.error().message().find("read-only file system"), std::string::npos)
        << f.error().to_string();
    EXPECT_NE(f.error().message().find(m.file("new")), std::string::npos);
    // An existing file can be opened for writing only if the file system allows it.
    auto rw = engine->open(m.file("existing"), FileOptions{});
    ASSERT_FALSE(rw.has_value());
    EXPECT_EQ(rw.error().errno_value(), EROFS);
    FileOptions ro;
    ro.read_only = true;
    EXPECT_TRUE(engine->open(m.file("existing"), ro).has_value());
}

TEST(Mounted, FourKibLogicalBlocks) {
    REQUIRE_ROOT();
    zinf::test::TempDir backing("loop");
    const std::string image = backing.file("disk.img");
    { std::ofstream f(image); }
    if (::truncate(image.c_str(), 64 << 20) != 0) {
        GTEST_SKIP() << "cannot size the image";
    }
    const std::string dev = run("losetup -f --show --sector-size 4096 " + image);
    if (dev.empty()) {
        GTEST_SKIP() << "losetup with 4 KiB sectors unavailable";
    }
    struct Detach {
        std::string dev;
        ~Detach() { (void)!std::system(("losetup -d " + dev + " 2>/dev/null").c_str()); }
    } detach{dev};
    if (std::system(("mkfs.ext4 -q -F " + dev + " >/dev/null 2>&1").c_str()) != 0) {
        GTEST_SKIP() << "mkfs.ext4 failed";
    }
    Mount m(dev.c_str(), "ext4", nullptr);
    if (!m.ok()) {
        GTEST_SKIP() << "mount " << dev << ": " << m.error();
    }

    {
        std::ofstream(m.file("probe")) << "x";
        FileDescriptor fd(::open(m.file("probe").c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
        ASSERT_TRUE(fd.valid());
        auto a = query_direct_io_alignment(fd.get(), m.file("probe"));
        ASSERT_TRUE(a.has_value());
        EXPECT_EQ(a->alignment_bytes, 4096u) << a->source;
    }

    io::AioOptions aio = small_aio("io_uring", Tristate::kOn);
    aio.block_size_bytes = 6144;
    std::string skip;
    auto bad = make_engine("io_uring", Tristate::kOn, &skip, std::nullopt, &aio);
    if (!bad) {
        GTEST_SKIP() << skip;
    }
    FileOptions fo;
    fo.create = true;
    auto refused = bad->open(m.file("f"), fo);
    ASSERT_FALSE(refused.has_value());
    EXPECT_NE(refused.error().message().find("aio.block_size"), std::string::npos)
        << refused.error().to_string();
    EXPECT_NE(refused.error().message().find("4096"), std::string::npos);

    aio.block_size_bytes = 64 * 1024;
    auto engine = make_engine("io_uring", Tristate::kOn, &skip, std::nullopt, &aio);
    ASSERT_TRUE(engine);
    auto file = engine->open(m.file("f"), fo);
    ASSERT_TRUE(file.has_value()) << file.error().to_string();
    EXPECT_EQ(engine->alignment_bytes(*file), 4096u);
    // 512-aligned but not 4096-aligned offsets and lengths go through the buffered descriptor.
    AlignedBuffer out = must_allocate(1 << 20), in = must_allocate(1 << 20);
    std::mt19937_64 rng(zinf::test::seed());
    fill_random(out.span(), rng);
    ASSERT_TRUE(engine->write(*file, 512, out.span().subspan(0, 200000)).is_ok());
    ASSERT_TRUE(engine->write(*file, 262144, out.span().subspan(4096, 4096 * 50)).is_ok());
    ASSERT_TRUE(engine->read(*file, 512, in.span().subspan(0, 200000)).is_ok());
    EXPECT_EQ(std::memcmp(in.data(), out.data(), 200000), 0);
    ASSERT_TRUE(engine->read(*file, 262144, in.span().subspan(0, 4096 * 50)).is_ok());
    EXPECT_EQ(std::memcmp(in.data(), out.data() + 4096, 4096 * 50), 0);
    ASSERT_TRUE(engine->close(*file).is_ok());
}

TEST(BlockSize, QueriedOnTheTestFileSystem) {
    zinf::test::TempDir dir("lbs");
    std::ofstream(dir.file("f")) << std::string(16384, 'x');
    FileDescriptor fd(::open(dir.file("f").c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
    if (!fd.valid()) {
        GTEST_SKIP() << "O_DIRECT refused here";
    }
    auto a = query_direct_io_alignment(fd.get(), dir.file("f"));
    ASSERT_TRUE(a.has_value()) << a.error().to_string();
    EXPECT_TRUE(a->direct_supported);
    if (std::string(a->source) == "tmpfs") {
        EXPECT_EQ(a->alignment_bytes, 1u);  // tmpfs serves O_DIRECT from its page cache
        return;
    }
    EXPECT_GE(a->alignment_bytes, 512u);
    EXPECT_LE(a->alignment_bytes, 65536u);
    EXPECT_EQ(a->alignment_bytes & (a->alignment_bytes - 1), 0u);
}

}  // namespace
}  // namespace zinf::io::test
