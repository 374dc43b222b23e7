// Termination signals (SIGTERM, SIGINT, SIGHUP) handled in normal context: a thread waits for
// them with sigwait, runs the program's clean-up (zinfinity-train removes its swap run
// directories, which a rank that mpirun stops after another rank failed would otherwise leave
// until the next run on their path), then ends the process by the same signal, as the signal's
// default action would have. No signal handler runs, so the clean-up may lock, allocate, log and
// make any syscall. The one handler there is forwards a signal that lands on a thread that does not
// block it to the watcher thread (pthread_kill), nothing else.
#pragma once

#include <string_view>

#include "src/base/status.h"

namespace zinf::cli {

// The clean-up: called once, on the watcher thread, with the signal received, while the program's
// other threads run on. Under mpirun it has a few seconds before SIGKILL follows SIGTERM.
using TerminationCleanup = void (*)(int signal);

// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread, which every thread started from it
// afterwards inherits, and starts a detached thread that waits for them. On the first one it calls
// `cleanup(signal)`, restores the signal's default action and raises it again: the process ends as
// killed by that signal (exit status 128 + signal in a shell; "exited on signal 15" to mpirun).
// A signal ignored when this is called (nohup's SIGHUP, SIGINT of a background job) is left
// alone: ignored it stays. Call it once, from main, before the program starts threads of its own:
// threads started earlier (by library constructors) keep the signals unblocked and take them in
// a handler that forwards them to the watcher, interrupting what they were doing (SA_RESTART).
// Child processes inherit the blocked signals: a program that starts one must unblock them in
// the child before exec. Allocates nothing; blocks on nothing.
// Errors: Status::from_errno naming the call that failed (sigaction, pthread_sigmask,
// pthread_create).
Status install_termination_watcher(TerminationCleanup cleanup);

// "SIGTERM", "SIGINT", "SIGHUP", or "signal" for any other, for messages.
std::string_view termination_signal_name(int signal) noexcept;

}  // namespace zinf::cli
