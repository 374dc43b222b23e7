// RunDir and SwapStore start-up: locks against a second run (in this process and in another),
// stale directories after kill -9, files removed at exit.
#include "swap/run_dir.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "swap/swap_store.h"
#include "tests/support/test_seed.h"
#include "tests/swap/swap_test_util.h"

namespace zinf::swap {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> run_dirs_in(const std::string& base) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(base)) {
        if (e.path().filename().string().rfind(kRunDirPrefix, 0) == 0)
            out.push_back(e.path().string());
    }
    return out;
}

TEST(RunDir, CreatesLocksAndRemoves) {
    zinf::test::TempDir tmp("rundir");
    std::string run_path;
    {
        auto dir = RunDir::create(std::vector<std::string>{tmp.path()});
        ASSERT_TRUE(dir.has_value()) << dir.status().to_string();
        ASSERT_EQ(dir->run_paths().size(), 1u);
        run_path = dir->run_paths()[0];
        struct stat st {};
        ASSERT_EQ(::stat(run_path.c_str(), &st), 0);
        EXPECT_EQ(st.st_mode & 0777, 0700u);
        std::ifstream lock(tmp.path() + "/" + std::string(kLockFileName));
        long pid = 0;
        lock >> pid;
        EXPECT_EQ(pid, ::getpid());
    }
    EXPECT_FALSE(fs::exists(run_path));
}

TEST(RunDir, SecondRunInThisProcessIsRefused) {
    zinf::test::TempDir tmp("rundir");
    auto first = RunDir::create(std::vector<std::string>{tmp.path()});
    ASSERT_TRUE(first.has_value());
    auto second = RunDir::create(std::vector<std::string>{tmp.path()});
    ASSERT_FALSE(second.has_value());
    EXPECT_EQ(second.error().code(), StatusCode::kBusy);
    EXPECT_NE(second.error().message().find(tmp.path()), std::string::npos);
    EXPECT_NE(second.error().message().find(std::to_string(::getpid())), std::string::npos)
        << second.error().message();
}

TEST(RunDir, PathGivenTwiceIsRejected) {
    zinf::test::TempDir tmp("rundir");
    auto dir = RunDir::create(std::vector<std::string>{tmp.path(), tmp.path() + "/."});
    ASSERT_FALSE(dir.has_value());
    EXPECT_EQ(dir.error().code(), StatusCode::kInvalidArgument);
}

TEST(RunDir, MissingDirectoryIsAnError) {
    auto dir = RunDir::create(std::vector<std::string>{"/nonexistent/zinf-swap"});
    ASSERT_FALSE(dir.has_value());
    EXPECT_NE(dir.error().message().find("/nonexistent/zinf-swap"), std::string::npos);
}

TEST(RunDir, SecondProcessIsRefusedNamingTheHolder) {
    zinf::test::TempDir tmp("lock");
    auto child = test::spawn_child("store", tmp.path());
    ASSERT_GT(child.pid, 0);
    ASSERT_TRUE(test::wait_child_ready(child)) << "child did not start";
    auto engine = test::make_file_engine();
    SwapStoreOptions options;
    options.paths = {tmp.path()};
    auto store = SwapStore::create(*engine, options);
    const int child_pid = child.pid;
    test::kill_child(child);
    ASSERT_FALSE(store.has_value());
    EXPECT_EQ(store.error().code(), StatusCode::kBusy);
    const std::string& m = store.error().message();
    EXPECT_NE(m.find("swap directory " + tmp.path()), std::string::npos) << m;
    EXPECT_NE(m.find("pid " + std::to_string(child_pid)), std::string::npos) << m;
}

TEST(RunDir, AfterKill9ANewRunStartsCleanAndTrustsNothing) {
    zinf::test::TempDir tmp("kill9");
    auto child = test::spawn_child("store", tmp.path());
    ASSERT_GT(child.pid, 0);
    ASSERT_TRUE(test::wait_child_ready(child)) << "child did not start";
    test::kill_child(child);
    const auto stale = run_dirs_in(tmp.path());
    ASSERT_EQ(stale.size(), 1u);  // kill -9 left its directory and swap file behind
    EXPECT_TRUE(fs::exists(stale[0] + "/" + std::string(SwapStore::kDataFileName)));

    auto engine = test::make_file_engine();
    SwapStoreOptions options;
    options.paths = {tmp.path()};
    auto store = SwapStore::create(*engine, options);
    ASSERT_TRUE(store.has_value()) << store.status().to_string();
    EXPECT_FALSE(fs::exists(stale[0]));  // removed at start
    ASSERT_EQ(run_dirs_in(tmp.path()).size(), 1u);
    // The same partition id and size as the dead run: nothing of it is valid here.
    ASSERT_TRUE((*store)->reserve(7, 1 << 20).is_ok());
    ASSERT_TRUE((*store)->commit().is_ok());
    EXPECT_FALSE((*store)->is_valid(7));
    std::vector<std::byte> buffer(1 << 20);
    SwapHandle handle;
    const Status s = (*store)->swap_in(7, buffer, handle);
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.to_string();
    store->reset();
    EXPECT_TRUE(run_dirs_in(tmp.path()).empty());  // removed at exit
}

}  // namespace
}  // namespace zinf::swap
