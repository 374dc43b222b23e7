// Child processes for the lock and kill -9 tests: this binary, re-executed (fork + exec, so the
// child does not inherit the parent's threads or locks half-held).
#include "tests/swap/swap_test_util.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "swap/swap_store.h"

namespace zinf::swap::test {

Child spawn_child(const std::string& mode, const std::string& dir) {
    Child child;
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return child;
    // Everything the child needs is built before fork: after it only exec-safe calls run.
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
        if (std::strncmp(*e, "ZINF_SWAP_CHILD", 15) != 0) env_strings.emplace_back(*e);
    }
    env_strings.push_back("ZINF_SWAP_CHILD=" + mode);
    env_strings.push_back("ZINF_SWAP_CHILD_DIR=" + dir);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe";
    std::string filter = "--gtest_filter=SwapChild.Main";
    char* argv[] = {exe.data(), filter.data(), nullptr};
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::dup2(fds[1], STDOUT_FILENO);  // dup2 clears O_CLOEXEC on the copy
        ::execve(exe.c_str(), argv, envp.data());
        ::_exit(127);
    }
    ::close(fds[1]);
    child.pid = pid;
    child.read_fd = fds[0];
    return child;
}

bool wait_child_ready(const Child& child) {
    std::string seen;
    for (int i = 0; i < 300; ++i) {
        pollfd p{child.read_fd, POLLIN, 0};
        if (::poll(&p, 1, 100) > 0) {
            char buf[256];
            const ssize_t n = ::read(child.read_fd, buf, sizeof(buf));
            if (n <= 0) return false;
            seen.append(buf, static_cast<std::size_t>(n));
            if (seen.find("ready ") != std::string::npos) return true;
        }
    }
    return false;
}

void kill_child(Child& child) {
    if (child.pid > 0) {
        ::kill(child.pid, SIGKILL);
        int st = 0;
        ::waitpid(child.pid, &st, 0);
        child.pid = -1;
    }
    if (child.read_fd >= 0) {
        ::close(child.read_fd);
        child.read_fd = -1;
    }
}

}  // namespace zinf::swap::test

namespace {

// The child's side. Modes: "store": create a swap store with real files in the directory,
// write a partition, and hold it.
TEST(SwapChild, Main) {
    const char* mode = std::getenv("ZINF_SWAP_CHILD");
    const char* dir = std::getenv("ZINF_SWAP_CHILD_DIR");
    if (mode == nullptr || dir == nullptr) GTEST_SKIP() << "only runs as a child of the lock tests";
    auto engine = zinf::swap::test::make_file_engine();
    ASSERT_NE(engine, nullptr);
    zinf::swap::SwapStoreOptions options;
    options.paths = {dir};
    options.name = "child";
    auto store = zinf::swap::SwapStore::create(*engine, options);
    ASSERT_TRUE(store.has_value()) << store.status().to_string();
    ASSERT_TRUE((*store)->reserve(7, 1 << 20).is_ok());
    ASSERT_TRUE((*store)->commit().is_ok());
    std::vector<std::byte> data(1 << 20, std::byte{0x5a});
    zinf::swap::SwapHandle handle;
    ASSERT_TRUE((*store)->swap_out(7, data, handle).is_ok());
    ASSERT_TRUE(handle.wait().is_ok());
    std::printf("ready %d\n", static_cast<int>(::getpid()));
    std::fflush(stdout);
    for (;;) ::pause();  // until SIGKILL
}

}  // namespace
