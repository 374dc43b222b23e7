// The termination-signal watcher: signals blocked in every thread, one thread in sigwait.
#include "tools/cli/termination.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>

#include "src/base/assert.h"

namespace zinf::cli {
namespace {

constexpr int kTerminationSignals[] = {SIGTERM, SIGINT, SIGHUP};

// Written by install_termination_watcher before it starts the thread that reads them
// (pthread_create orders the writes before the thread's reads); never written again.
TerminationCleanup g_cleanup = nullptr;
sigset_t g_watched;
// The watcher thread; written before the handler that reads it is installed.
pthread_t g_watcher{};

// The handler, for threads that do not block the signals: those started before
// install_termination_watcher (OpenBLAS starts its pool from a library constructor, before main).
// The kernel gives a process-directed signal to such a thread rather than to one that blocks it;
// this forwards it to the watcher, which blocks it and takes it in sigwait. pthread_kill is
// async-signal-safe; errno is kept for the interrupted code.
extern "C" void forward_to_watcher(int signal) {
    const int saved_errno = errno;
    (void)::pthread_kill(g_watcher, signal);
    errno = saved_errno;
}

// Ends the process by `signal` as its default action does. Called on the watcher thread. The
// default action is restored first: the signal ends the process wherever it lands now (here, or
// on a thread started before the watcher, where the handler was).
[[noreturn]] void end_by(int signal) {
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    sigemptyset(&default_action.sa_mask);
    (void)::sigaction(signal, &default_action, nullptr);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, signal);
    (void)::pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    (void)::raise(signal);
    // Not reached: the default action of every watched signal ends the process. Should it return
    // all the same, the exit status is still the one a shell gives a process killed by it.
    ::_exit(128 + signal);
}

void* watch_termination(void*) {
    int signal = 0;
    // sigwait fails only with EINVAL, for a set without a valid signal: it waits as long as the
    // process lives, by design.
    const int rc = ::sigwait(&g_watched, &signal);
    ZINF_ASSERT(rc == 0);
    g_cleanup(signal);
    end_by(signal);
}

// Installs forward_to_watcher for every signal in `watched`. SA_RESTART: the interrupted thread
// carries on with what it was doing until the watcher ends the process.
Status install_forwarding_handler(const sigset_t& watched) {
    struct sigaction forward {};
    forward.sa_handler = forward_to_watcher;
    forward.sa_flags = SA_RESTART;
    sigfillset(&forward.sa_mask);
    for (const int signal : kTerminationSignals) {
        if (sigismember(&watched, signal) != 1) continue;
        if (::sigaction(signal, &forward, nullptr) != 0) {
            return Status::from_errno(errno, "sigaction (forwarding a termination signal)");
        }
    }
    return Status::ok();
}

}  // namespace

Status install_termination_watcher(TerminationCleanup cleanup) {
    ZINF_ASSERT(cleanup != nullptr);
    static std::atomic<bool> installed{false};
    ZINF_ASSERT(!installed.exchange(true));
    sigset_t watched;
    sigemptyset(&watched);
    for (const int signal : kTerminationSignals) {
        struct sigaction current {};
        if (::sigaction(signal, nullptr, &current) != 0) {
            return Status::from_errno(errno, "sigaction (reading a termination signal's action)");
        }
        // Blocked, an ignored signal would be kept pending and taken by sigwait, not discarded.
        if ((current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_IGN) continue;
        sigaddset(&watched, signal);
    }
    g_cleanup = cleanup;
    g_watched = watched;
    if (const int rc = ::pthread_sigmask(SIG_BLOCK, &watched, nullptr); rc != 0) {
        return Status::from_errno(rc, "pthread_sigmask (blocking the termination signals)");
    }
    if (const int rc = ::pthread_create(&g_watcher, nullptr, watch_termination, nullptr); rc != 0) {
        (void)::pthread_sigmask(SIG_UNBLOCK, &watched, nullptr);
        return Status::from_errno(rc, "pthread_create (the termination-signal watcher)");
    }
    (void)::pthread_setname_np(g_watcher, "zinf-signals");
    ZINF_ASSERT(::pthread_detach(g_watcher) == 0);
    return install_forwarding_handler(watched);
}

std::string_view termination_signal_name(int signal) noexcept {
    switch (signal) {
        case SIGTERM:
            return "SIGTERM";
        case SIGINT:
            return "SIGINT";
        case SIGHUP:
            return "SIGHUP";
        default:
            return "signal";
    }
}

}  // namespace zinf::cli
