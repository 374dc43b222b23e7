// RunDir and SwapStore start-up: locks against a second run (in this process and in another),
// stale directories after kill -9, files removed at exit.
#include "swap/run_dir.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

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
        auto dir = RunDir::create(io::posix_file_system(), std::vector<std::string>{tmp.path()});
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
    auto first = RunDir::create(io::posix_file_system(), std::vector<std::string>{tmp.path()});
    ASSERT_TRUE(first.has_value());
    auto second = RunDir::create(io::posix_file_system(), std::vector<std::string>{tmp.path()});
    ASSERT_FALSE(second.has_value());
    EXPECT_EQ(second.error().code(), StatusCode::kBusy);
    EXPECT_NE(second.error().message().find(tmp.path()), std::string::npos);
    EXPECT_NE(second.error().message().find(std::to_string(::getpid())), std::string::npos)
        << second.error().message();
}

TEST(RunDir, PathGivenTwiceIsRejected) {
    zinf::test::TempDir tmp("rundir");
    auto dir = RunDir::create(io::posix_file_system(),
                              std::vector<std::string>{tmp.path(), tmp.path() + "/."});
    ASSERT_FALSE(dir.has_value());
    EXPECT_EQ(dir.error().code(), StatusCode::kInvalidArgument);
}

TEST(RunDir, MissingDirectoryIsAnError) {
    auto dir =
        RunDir::create(io::posix_file_system(), std::vector<std::string>{"/nonexistent/zinf-swap"});
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

// A RunDir moved twice (construction, assignment) keeps its directory and lock until its last
// owner goes, and the moved-from ones remove nothing.
TEST(RunDir, AMovedRunDirectoryIsRemovedOnlyByItsLastOwner) {
    zinf::test::TempDir tmp("rundir-move");
    std::string run_path;
    {
        auto made = RunDir::create(io::posix_file_system(), std::vector<std::string>{tmp.path()});
        ASSERT_TRUE(made.has_value()) << made.status().to_string();
        run_path = made->run_paths().at(0);
        RunDir assigned;
        {
            RunDir constructed(std::move(*made));
            EXPECT_TRUE(fs::exists(run_path));
            assigned = std::move(constructed);
        }
        EXPECT_TRUE(fs::exists(run_path));
        EXPECT_EQ(assigned.run_paths(), std::vector<std::string>{run_path});
        auto second = RunDir::create(io::posix_file_system(), std::vector<std::string>{tmp.path()});
        ASSERT_FALSE(second.has_value());
        EXPECT_EQ(second.error().code(), StatusCode::kBusy);  // the lock moved with it
    }
    EXPECT_FALSE(fs::exists(run_path));
    EXPECT_TRUE(
        RunDir::create(io::posix_file_system(), std::vector<std::string>{tmp.path()}).has_value());
}

// The first failed check of the exit path's child, or "" (the child cannot use gtest's asserts).
std::string exit_path_failure(const std::string& a, const std::string& b, const std::string& c) {
    auto one = RunDir::create(io::posix_file_system(), std::vector<std::string>{a});
    auto two = RunDir::create(io::posix_file_system(), std::vector<std::string>{b, c});
    if (!one.has_value() || !two.has_value()) return "could not create the run directories";
    std::vector<std::string> paths = one->run_paths();
    paths.insert(paths.end(), two->run_paths().begin(), two->run_paths().end());
    const std::size_t removed_count = remove_live_run_dirs_before_exit();
    if (removed_count != 3) return "removed " + std::to_string(removed_count) + ", expected 3";
    for (const std::string& p : paths) {
        if (fs::exists(p)) return p + " is still there";
    }
    // Closed: a run directory made now would outlive the process.
    fs::create_directory(c + "/late");
    auto late = RunDir::create(io::posix_file_system(), std::vector<std::string>{c + "/late"});
    if (late.has_value()) return "a RunDir was created after the exit path";
    if (late.error().code() != StatusCode::kBusy) return "not kBusy: " + late.error().to_string();
    if (!run_dirs_in(c + "/late").empty()) return "the refused RunDir left a directory";
    return "";
}

// What a process ending on a signal runs (tools/cli/termination.h): every live run directory
// goes, with its files, whichever RunDir holds it, and none is made afterwards. In a child
// process: the exit path closes the registry for good.
TEST(RunDirDeathTest, TheExitPathRemovesEveryLiveRunDirectoryAndRefusesNewOnes) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    zinf::test::TempDir a("exit-a"), b("exit-b"), c("exit-c");
    EXPECT_EXIT(
        {
            const std::string failure = exit_path_failure(a.path(), b.path(), c.path());
            std::fprintf(stderr, "exit path: %s\n", failure.empty() ? "ok" : failure.c_str());
            // _Exit skips the destructors, as a signal would: the child's own directories go here.
            for (const auto* dir : {&a, &b, &c}) fs::remove_all(dir->path());
            std::_Exit(failure.empty() ? 0 : 1);
        },
        ::testing::ExitedWithCode(0), "exit path: ok");
}

// ---- the swap directory cannot be turned against its user ------------------------------------

// Another user's uid for chown (nobody); the tests that need it run as root and skip otherwise.
constexpr uid_t kOtherUid = 65534;

using zinf::test::read_text;

// A directory `name` in `parent` with `mode` (chmod after mkdir: the umask does not apply).
std::string make_dir(const std::string& parent, const std::string& name, mode_t mode) {
    std::string path = parent + "/" + name;
    EXPECT_EQ(::mkdir(path.c_str(), 0700), 0) << path;
    EXPECT_EQ(::chmod(path.c_str(), mode), 0) << path;
    return path;
}

// A file outside the swap directory that an attacker would like the run to overwrite.
struct Victim {
    explicit Victim(const std::string& dir) : path(dir + "/victim") {
        std::ofstream(path) << "precious\n";
    }
    bool untouched() const { return read_text(path) == "precious\n"; }
    std::string path;
};

TEST(RunDirSecurity, PlantedLockSymlinkInAStickyDirectoryIsRefusedAndItsTargetUntouched) {
    zinf::test::TempDir tmp("sec");
    Victim victim(tmp.path());
    const std::string base = make_dir(tmp.path(), "shared", 01777);  // like /tmp
    ASSERT_EQ(::symlink(victim.path.c_str(), (base + "/" + std::string(kLockFileName)).c_str()), 0);
    auto dir = RunDir::create(io::posix_file_system(), std::vector<std::string>{base});
    ASSERT_FALSE(dir.has_value());
    EXPECT_EQ(dir.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(dir.error().message().find("symbolic link"), std::string::npos)
        << dir.error().message();
    EXPECT_NE(dir.error().message().find(std::string(kLockFileName)), std::string::npos);
    EXPECT_TRUE(victim.untouched());
    EXPECT_TRUE(run_dirs_in(base).empty());
}

TEST(RunDirSecurity, WorldWritableDirectoryIsRefusedNamingItsOwnerAndMode) {
    zinf::test::TempDir tmp("sec");
    Victim victim(tmp.path());
    const std::string base = make_dir(tmp.path(), "open", 0777);
    const std::string lock = base + "/" + std::string(kLockFileName);
    ASSERT_EQ(::symlink(victim.path.c_str(), lock.c_str()), 0);
    auto dir = RunDir::create(io::posix_file_system(), std::vector<std::string>{base});
    ASSERT_FALSE(dir.has_value());
    const std::string& m = dir.error().message();
    EXPECT_NE(m.find(base), std::string::npos) << m;
    EXPECT_NE(m.find("mode 0777"), std::string::npos) << m;
    EXPECT_NE(m.find("every user"), std::string::npos) << m;
    EXPECT_TRUE(victim.untouched());
    EXPECT_TRUE(run_dirs_in(base).empty());  // nothing written inside either
}

TEST(RunDirSecurity, GroupWritableDirectoryIsRefused) {
    zinf::test::TempDir tmp("sec");
    const std::string base = make_dir(tmp.path(), "group", 0770);
    auto dir = RunDir::create(io::posix_file_system(), std::vector<std::string>{base});
    ASSERT_FALSE(dir.has_value());
    EXPECT_NE(dir.error().message().find("its group"), std::string::npos) << dir.error().message();
    EXPECT_FALSE(fs::exists(base + "/" + std::string(kLockFileName)));
}

TEST(RunDirSecurity, ForeignOwnedDirectoryIsRefusedNamingItsOwner) {
    if (!zinf::test::is_root()) GTEST_SKIP() << "needs root to give a directory to another user";
    zinf::test::TempDir tmp("sec");
    const std::string base = make_dir(tmp.path(), "theirs", 0755);
    ASSERT_EQ(::chown(base.c_str(), kOtherUid, kOtherUid), 0);
    auto dir = RunDir::create(io::posix_file_system(), std::vector<std::string>{base});
    ASSERT_FALSE(dir.has_value());
    const std::string& m = dir.error().message();
    EXPECT_NE(m.find(base), std::string::npos) << m;
    EXPECT_NE(m.find("uid 65534"), std::string::npos) << m;
    EXPECT_NE(m.find("mode 0755"), std::string::npos) << m;
    EXPECT_FALSE(fs::exists(base + "/" + std::string(kLockFileName)));
    EXPECT_TRUE(run_dirs_in(base).empty());
}

TEST(RunDirSecurity, DirectoryInsideAWorldWritableOneIsRefused) {
    zinf::test::TempDir tmp("sec");
    const std::string open = make_dir(tmp.path(), "open", 0777);
    const std::string base = make_dir(open, "swap", 0700);  // ours, but its parent is not safe
    auto dir = RunDir::create(io::posix_file_system(), std::vector<std::string>{base});
    ASSERT_FALSE(dir.has_value());
    const std::string& m = dir.error().message();
    EXPECT_NE(m.find("lies in"), std::string::npos) << m;
    EXPECT_NE(m.find(open), std::string::npos) << m;
    EXPECT_FALSE(fs::exists(base + "/" + std::string(kLockFileName)));
}

TEST(RunDirSecurity, LockFileOfAnotherUserInAStickyDirectoryIsRefusedUntouched) {
    if (!zinf::test::is_root()) GTEST_SKIP() << "needs root to give a file to another user";
    zinf::test::TempDir tmp("sec");
    const std::string base = make_dir(tmp.path(), "shared", 01777);
    const std::string lock = base + "/" + std::string(kLockFileName);
    std::ofstream(lock) << "theirs\n";
    ASSERT_EQ(::chown(lock.c_str(), kOtherUid, kOtherUid), 0);
    auto dir = RunDir::create(io::posix_file_system(), std::vector<std::string>{base});
    ASSERT_FALSE(dir.has_value());
    EXPECT_NE(dir.error().message().find("uid 65534"), std::string::npos) << dir.error().message();
    EXPECT_EQ(read_text(lock), "theirs\n");
    EXPECT_TRUE(run_dirs_in(base).empty());
}

TEST(RunDirSecurity, HardLinkedLockFileIsRefusedAndTheLinkedFileUntouched) {
    zinf::test::TempDir tmp("sec");
    Victim victim(tmp.path());
    const std::string base = make_dir(tmp.path(), "shared", 01777);
    ASSERT_EQ(::link(victim.path.c_str(), (base + "/" + std::string(kLockFileName)).c_str()), 0);
    auto dir = RunDir::create(io::posix_file_system(), std::vector<std::string>{base});
    ASSERT_FALSE(dir.has_value());
    EXPECT_NE(dir.error().message().find("2 link"), std::string::npos) << dir.error().message();
    EXPECT_TRUE(victim.untouched());
}

TEST(RunDirSecurity, StickySharedDirectoryWorksAndRunDirectoryIsPrivate) {
    zinf::test::TempDir tmp("sec");
    const std::string base = make_dir(tmp.path(), "shared", 01777);
    const mode_t old_umask = ::umask(0);  // the run directory is 0700 whatever the umask
    auto dir = RunDir::create(io::posix_file_system(), std::vector<std::string>{base});
    ::umask(old_umask);
    ASSERT_TRUE(dir.has_value()) << dir.status().to_string();
    struct stat st {};
    ASSERT_EQ(::stat(dir->run_paths()[0].c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0700u);
    EXPECT_EQ(st.st_uid, ::geteuid());
    ASSERT_EQ(::stat((base + "/" + std::string(kLockFileName)).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST(RunDirSecurity, PlantedStaleLookalikeIsLeftAloneAndItsTargetKept) {
    zinf::test::TempDir tmp("sec");
    const std::string outside = make_dir(tmp.path(), "outside", 0700);
    std::ofstream(outside + "/keep") << "keep\n";
    const std::string base = make_dir(tmp.path(), "shared", 01777);
    const std::string planted = base + "/" + std::string(kRunDirPrefix) + "1-1";
    ASSERT_EQ(::symlink(outside.c_str(), planted.c_str()), 0);
    {
        auto dir = RunDir::create(io::posix_file_system(), std::vector<std::string>{base});
        ASSERT_TRUE(dir.has_value()) << dir.status().to_string();
    }
    EXPECT_EQ(read_text(outside + "/keep"), "keep\n");
    struct stat st {};
    EXPECT_EQ(::lstat(planted.c_str(), &st), 0);  // not ours: not removed either
}

TEST(RunDirSecurity, SwapFilesArePrivateAndRunPathsHaveNoLinks) {
    zinf::test::TempDir tmp("sec");
    const std::string real = make_dir(tmp.path(), "real", 0700);
    const std::string link = tmp.path() + "/link";
    ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0);  // a link of our own: allowed
    auto engine = test::make_file_engine();
    SwapStoreOptions options;
    options.paths = {link};
    auto store = SwapStore::create(*engine, options);
    ASSERT_TRUE(store.has_value()) << store.status().to_string();
    ASSERT_TRUE((*store)->reserve(1, 1 << 16).is_ok());
    ASSERT_TRUE((*store)->commit().is_ok());
    const auto dirs = run_dirs_in(real);
    ASSERT_EQ(dirs.size(), 1u);
    for (const auto& e : fs::directory_iterator(dirs[0])) {
        struct stat st {};
        ASSERT_EQ(::lstat(e.path().c_str(), &st), 0);
        EXPECT_TRUE(S_ISREG(st.st_mode)) << e.path();
        EXPECT_EQ(st.st_mode & 07777, 0600u) << e.path();
    }
}

}  // namespace
}  // namespace zinf::swap
