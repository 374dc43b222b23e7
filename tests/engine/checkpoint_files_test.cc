// Checkpoint files: the directory written to must be trusted, nothing inside is reached through a
// symbolic link, the `latest` pointer is checked when read, and a fault in any file call of a
// save leaves the last complete checkpoint as `latest`, readable, with no temporary left behind.
#include "src/engine/checkpoint_files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "src/base/log.h"
#include "tests/support/test_seed.h"

namespace zinf::engine {
namespace {

namespace fs = std::filesystem;

using zinf::test::read_text;

std::span<const std::byte> bytes_of(const std::string& s) {
    return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// Saves a checkpoint `tag` holding one small file and one streamed file, through `fs`.
Status save(io::FileSystem& fs, const std::string& dir, const std::string& tag,
            const std::string& payload) {
    ZINF_ASSIGN_OR_RETURN(auto w, CheckpointWriter::create(fs, dir, tag));
    ZINF_TRY(w.write_file("small", bytes_of(payload)));
    ZINF_ASSIGN_OR_RETURN(auto f, w.begin_file("streamed"));
    ZINF_TRY(f.append(bytes_of(payload)));
    ZINF_TRY(f.append(bytes_of(payload)));
    ZINF_TRY(w.end_file(f));
    w.set("payload", payload);
    return w.commit();
}

// Reads checkpoint `tag` back and checks every file against its manifest; returns the payload.
Result<std::string> load(const std::string& dir, const std::string& tag) {
    io::FileSystem& fs = io::posix_file_system();
    ZINF_ASSIGN_OR_RETURN(auto r, CheckpointReader::open(fs, dir, tag));
    ZINF_ASSIGN_OR_RETURN(std::string payload, r.get("payload"));
    std::string small(payload.size(), '\0');
    ZINF_TRY(
        r.read_file("small", std::as_writable_bytes(std::span<char>(small.data(), small.size()))));
    std::string streamed(2 * payload.size(), '\0');
    ZINF_TRY(r.read_file(
        "streamed", std::as_writable_bytes(std::span<char>(streamed.data(), streamed.size()))));
    if (small != payload || streamed != payload + payload) return Status::corruption("payload");
    return payload;
}

TEST(CheckpointFiles, SaveAndLoadRoundTrip) {
    zinf::test::TempDir tmp("ckpt");
    ASSERT_TRUE(save(io::posix_file_system(), tmp.path(), "a", "hello").is_ok());
    auto got = load(tmp.path(), "a");
    ASSERT_TRUE(got.has_value()) << got.status().to_string();
    EXPECT_EQ(*got, "hello");
    auto latest = read_latest_tag(io::posix_file_system(), tmp.path());
    ASSERT_TRUE(latest.has_value());
    EXPECT_EQ(*latest, "a");
}

TEST(CheckpointFiles, WorldWritableDirectoryIsRefusedBeforeWriting) {
    zinf::test::TempDir tmp("ckpt");
    const std::string dir = tmp.file("open");
    ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
    ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
    const Status s = save(io::posix_file_system(), dir, "a", "x");
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("checkpoint directory"), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find("mode 0777"), std::string::npos) << s.to_string();
    EXPECT_TRUE(fs::is_empty(dir));
}

TEST(CheckpointFiles, ForeignOwnedDirectoryIsRefused) {
    if (!zinf::test::is_root()) GTEST_SKIP() << "needs root to give a directory to another user";
    zinf::test::TempDir tmp("ckpt");
    const std::string dir = tmp.file("theirs");
    ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
    ASSERT_EQ(::chown(dir.c_str(), 65534, 65534), 0);
    const Status s = save(io::posix_file_system(), dir, "a", "x");
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("uid 65534"), std::string::npos) << s.to_string();
    EXPECT_TRUE(fs::is_empty(dir));
}

TEST(CheckpointFiles, PlantedLatestLinkIsReplacedNotWrittenThrough) {
    zinf::test::TempDir tmp("ckpt");
    std::ofstream(tmp.file("victim")) << "precious";
    const std::string dir = tmp.file("ckpt");
    ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
    ASSERT_EQ(::symlink(tmp.file("victim").c_str(), (dir + "/latest").c_str()), 0);
    // Reading it is refused, not followed.
    auto latest = read_latest_tag(io::posix_file_system(), dir);
    ASSERT_FALSE(latest.has_value());
    EXPECT_NE(latest.error().message().find("symbolic link"), std::string::npos);
    ASSERT_TRUE(save(io::posix_file_system(), dir, "a", "x").is_ok());
    EXPECT_EQ(read_text(tmp.file("victim")), "precious");
    struct stat st {};
    ASSERT_EQ(::lstat((dir + "/latest").c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(read_text(dir + "/latest"), "a");
}

TEST(CheckpointFiles, LatestNamingAnythingButATagIsRefused) {
    zinf::test::TempDir tmp("ckpt");
    for (const std::string bad : {"../../etc", "/etc", ".hidden", "", "a/b", "x\x01y"}) {
        std::ofstream(tmp.file("latest"), std::ios::trunc) << bad;
        auto latest = read_latest_tag(io::posix_file_system(), tmp.path());
        ASSERT_FALSE(latest.has_value()) << bad;
        EXPECT_EQ(latest.error().code(), StatusCode::kInvalidArgument) << bad;
        EXPECT_NE(latest.error().message().find(tmp.file("latest")), std::string::npos);
    }
    fs::remove(tmp.file("latest"));
    EXPECT_EQ(read_latest_tag(io::posix_file_system(), tmp.path()).error().code(),
              StatusCode::kNotFound);
}

TEST(CheckpointFiles, TagDirectoryOrFileThatIsALinkIsRefused) {
    zinf::test::TempDir tmp("ckpt");
    ASSERT_TRUE(save(io::posix_file_system(), tmp.path(), "real", "x").is_ok());
    ASSERT_EQ(::symlink(tmp.file("real").c_str(), tmp.file("alias").c_str()), 0);
    auto r = CheckpointReader::open(io::posix_file_system(), tmp.path(), "alias");
    ASSERT_FALSE(r.has_value());
    EXPECT_NE(r.error().message().find("symbolic link"), std::string::npos)
        << r.error().to_string();
    // A file of the checkpoint replaced by a link (to an identical copy) is refused too.
    fs::copy_file(tmp.file("real/small"), tmp.file("copy"));
    fs::remove(tmp.file("real/small"));
    ASSERT_EQ(::symlink(tmp.file("copy").c_str(), tmp.file("real/small").c_str()), 0);
    auto got = load(tmp.path(), "real");
    ASSERT_FALSE(got.has_value());
    EXPECT_NE(got.error().message().find("symbolic link"), std::string::npos);
}

TEST(CheckpointFiles, AFaultInAnyFileCallOfASaveKeepsTheLastCompleteCheckpoint) {
    zinf::test::TempDir tmp("ckpt");
    const std::string dir = tmp.path();
    ASSERT_TRUE(save(io::posix_file_system(), dir, "good", "first").is_ok());
    std::uint64_t calls = 0;
    {
        io::FaultyFileSystem counting(io::posix_file_system(), io::FileFaultPlan{});
        ASSERT_TRUE(save(counting, dir, "probe", "probe").is_ok());
        calls = counting.ops_counted();
        fs::remove_all(tmp.file("probe"));
        ASSERT_TRUE(save(io::posix_file_system(), dir, "good", "first").is_ok());  // latest: good
    }
    ASSERT_GE(calls, 10u);
    std::uint64_t surfaced = 0;
    for (std::uint64_t n = 1; n <= calls; ++n) {
        io::FileFaultPlan plan;
        plan.fail_nth_op = n;
        plan.errno_to_inject = n % 3 == 0 ? ENOSPC : EIO;
        io::FaultyFileSystem faulty(io::posix_file_system(), plan);
        const Status s = save(faulty, dir, "next", "second");
        ASSERT_EQ(faulty.faults_injected(), 1u) << "n=" << n;
        if (!s.is_ok()) {
            ++surfaced;
            EXPECT_EQ(s.errno_value(), plan.errno_to_inject) << "n=" << n << ": " << s.to_string();
            EXPECT_NE(s.message().find(dir), std::string::npos)
                << "n=" << n << ": " << s.to_string();
        }
        // Whatever failed, `latest` names a complete checkpoint that reads back verified.
        auto latest = read_latest_tag(io::posix_file_system(), dir);
        ASSERT_TRUE(latest.has_value()) << "n=" << n << ": " << latest.status().to_string();
        auto got = load(dir, *latest);
        ASSERT_TRUE(got.has_value()) << "n=" << n << ": " << got.status().to_string();
        EXPECT_EQ(*got, *latest == "next" ? "second" : "first") << "n=" << n;
        if (s.is_ok()) {
            EXPECT_EQ(*latest, "next") << "n=" << n;
        }
        // No temporary directory or file is left behind.
        for (const auto& e : fs::directory_iterator(dir)) {
            const std::string name = e.path().filename().string();
            EXPECT_TRUE(name == "good" || name == "next" || name == "latest")
                << "n=" << n << ": left " << name;
        }
        fs::remove_all(tmp.file("next"));
        ASSERT_TRUE(save(io::posix_file_system(), dir, "good", "first").is_ok());
    }
    // Only the cleanup removals may swallow a fault; every other call surfaces it.
    EXPECT_GE(surfaced, calls - 3) << calls << " calls";
}

}  // namespace
}  // namespace zinf::engine
