// The termination-signal watcher (tools/cli/termination.h): the clean-up runs in normal context on
// SIGTERM, SIGINT and SIGHUP, then the process dies of the signal; a signal that lands on a thread
// started before the watcher is forwarded to it; a signal ignored at start stays ignored. Every
// case runs in a child process (a death test): the watcher blocks signals for good.
#include "tools/cli/termination.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace zinf::cli {
namespace {

// The clean-up: says which signal it ran for and on which thread (the watcher's, never inside a
// handler on whichever thread the signal landed).
void report_cleanup(int signal) {
    char thread_name[16] = {};
    (void)::pthread_getname_np(::pthread_self(), thread_name, sizeof thread_name);
    std::fprintf(stderr, "clean-up for %s on %s\n",
                 std::string(termination_signal_name(signal)).c_str(), thread_name);
}

// Waits for the watcher to end the process; exits 3 if it does not within five seconds.
[[noreturn]] void wait_to_be_ended() {
    for (int i = 0; i < 500; ++i) ::usleep(10'000);
    std::fprintf(stderr, "still alive\n");
    std::_Exit(3);
}

class TerminationSignalDeathTest : public ::testing::TestWithParam<int> {
protected:
    void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_P(TerminationSignalDeathTest, TheCleanUpRunsThenTheProcessDiesOfTheSignal) {
    const int signal = GetParam();
    EXPECT_EXIT(
        {
            // A signal ignored by whoever started the test binary would be skipped.
            std::signal(signal, SIG_DFL);
            if (!install_termination_watcher(report_cleanup).is_ok()) std::_Exit(2);
            ::kill(::getpid(), signal);
            wait_to_be_ended();
        },
        ::testing::KilledBySignal(signal),
        std::string("clean-up for ") + std::string(termination_signal_name(signal)) +
            " on zinf-signals");
}

INSTANTIATE_TEST_SUITE_P(Signals, TerminationSignalDeathTest,
                         ::testing::Values(SIGTERM, SIGINT, SIGHUP),
                         [](const ::testing::TestParamInfo<int>& p) {
                             return std::string(termination_signal_name(p.param)).substr(3);
                         });

// OpenBLAS starts its threads before main: they keep the signals unblocked. One sent to such a
// thread (as the kernel may choose it for a signal to the process) reaches the clean-up too.
TEST(TerminationWatcherDeathTest, ASignalOnAThreadStartedBeforeTheWatcherReachesTheCleanUp) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
            std::signal(SIGTERM, SIG_DFL);
            std::atomic<bool> stop{false};
            std::thread early([&stop] {
                while (!stop.load()) ::usleep(1'000);
            });
            if (!install_termination_watcher(report_cleanup).is_ok()) std::_Exit(2);
            // NOLINTNEXTLINE(bugprone-bad-signal-to-kill-thread): the signal is the subject.
            ::pthread_kill(early.native_handle(), SIGTERM);
            wait_to_be_ended();
        },
        ::testing::KilledBySignal(SIGTERM), "clean-up for SIGTERM on zinf-signals");
}

// nohup's SIGHUP: ignored before the watcher, ignored after it (blocked, it would have been kept
// pending and taken by the watcher).
TEST(TerminationWatcherDeathTest, ASignalIgnoredAtStartStaysIgnored) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
            std::signal(SIGHUP, SIG_IGN);
            if (!install_termination_watcher(report_cleanup).is_ok()) std::_Exit(2);
            ::kill(::getpid(), SIGHUP);
            ::usleep(200'000);
            std::fprintf(stderr, "still running after SIGHUP\n");
            std::_Exit(0);
        },
        ::testing::ExitedWithCode(0), "still running after SIGHUP");
}

}  // namespace
}  // namespace zinf::cli
