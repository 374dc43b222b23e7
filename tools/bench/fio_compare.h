// Our passes against fio's, alternated on the same file with the same engine and settings: the
// measurement behind `io --vs-fio` and `sweep --vs-fio`.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>

#include "src/base/status.h"
#include "tools/bench/fio_runner.h"
#include "tools/bench/io_runner.h"

namespace zinf::bench {

// What a fio run of a job costs before and after its I/O (parsing, buffers, forking its job
// processes, the report): the medians over five runs of the same job moving one block per job.
// The median, not the least: each full run pays one draw of the start-up, and subtracting the
// least of several draws would leave the rest of fio's start-up in its I/O figure (about 0.01 s
// of CPU here, 6 % of a 1 GiB tmpfs pass).
struct FioStartup {
    double cpu_seconds = 0;
    double context_switches = 0;
    double cpu_spread_seconds = 0;  // greatest less least over the five runs
};

// See FioComparison::cpu_resolved.
inline constexpr double kStartupSpreadsPerIo = 5;

// One of our passes and the two fio passes around it (fio, ours, fio), with fio's CPU counted as
// ours is (whole process).
//
// Why bracketed and not pairs in flipped order: on the shared virtual disk a pass's speed depends
// on what ran just before it. In a 48-point sweep with flipped pairs (2026-12-02) fio ran at 0.90x
// its median right after another fio pass and 1.03x right after ours, while ours did not care;
// with 5 pairs (3 ours-first) that carry-over pulled the median ratio down by several percent,
// and the first pass of a point, always ours, paid for the point's set-up. Bracketed, every pass
// follows a pass of the other side, and a drift that is linear over the three passes cancels.
struct FioPair {
    int index = 0;  // 1-based: our n-th pass
    PassFigures ours;
    FioFigures fio_before;
    FioFigures fio_after;
    double fio_gb_per_s = 0;  // geometric mean of fio_before's and fio_after's GB/s
    double ratio = 0;         // ours GB/s / fio_gb_per_s (the bracketed ratio)
    double fio_cpu_s_per_gb =
        0;  // mean of the two passes' whole-process figures (fio_cpu_seconds_per_gb)
    double fio_job_cpu_s_per_gb = 0;  // mean of the two passes' own job figures
    double cpu_ratio = 0;             // ours CPU s/GB / fio_cpu_s_per_gb (bracketed, as ratio)
    double fio_context_switches_per_gb =
        0;  // mean of the two passes' (fio_context_switches_per_gb)
};

struct FioComparison {
    IoOp op = IoOp::kRead;
    int pairs = 0;  // our passes; fio ran pairs + 1
    // fio's start-up, subtracted from each full run's process figures, and the median over
    // fio's passes of the CPU left for its I/O (its run's less the start-up's).
    FioStartup fio_startup;
    double fio_io_cpu_seconds = 0;
    // Whether the CPU ratio measures the I/O and not fio's start-up: the I/O's CPU is at least
    // kStartupSpreadsPerIo times the start-up's spread. Large buffers make fio's start-up long
    // and uneven (at 16 MiB x QD 32 it allocates and pins 512 MiB: 0.3 to 2.2 s of CPU between
    // runs), more than a 1 GiB pass's I/O costs; a larger file resolves it.
    bool cpu_resolved = false;
    Spread ratio;
    Spread ours_gb_per_s;
    Spread fio_gb_per_s;  // over all pairs + 1 fio passes
    Spread ours_cpu_s_per_gb;
    Spread fio_cpu_s_per_gb;      // whole process (every thread, kernel io_uring workers too)
    Spread fio_job_cpu_s_per_gb;  // fio's own figure: its job threads only
    // Our CPU s/GB over the bracketing fio passes' mean, pass by pass (FioPair::cpu_ratio). The
    // CPU a GB costs on memory-speed storage moves by a third from one minute to the next here
    // (tmpfs reads at 1 MiB: 0.085 to 0.125 s/GB for the same binary), with the kernel's copy,
    // not the engine, taking most of it; a ratio of the two sides' medians mixes passes minutes
    // apart, the bracketed one compares neighbours.
    Spread cpu_ratio;
    // Context switches per GB, whole process on both sides (fio's less its start-up's): how often
    // a thread slept and was woken to move a GB. fio's one thread sleeps once per completion it
    // waits for; the engine adds the hand-offs between its callers and its workers.
    Spread ours_context_switches_per_gb;
    Spread fio_context_switches_per_gb;  // over all pairs + 1 fio passes
    nlohmann::json pairs_json = nlohmann::json::array();
};

// The comparison's figures as JSON: spreads, fio's start-up and every pair.
nlohmann::json comparison_to_json(const FioComparison& c);

// The fio job matching one of our configurations on `files` (one path): same engine
// (aio.backend: io_uring or libaio), block size, queue depth, threads as jobs, O_DIRECT, and
// registered buffers and files or SQPOLL for io_uring.
FioJob fio_job_for(const std::string& fio_binary, const BenchFiles& files,
                   const io::AioOptions& aio, bool direct, IoOp op);

// fio's CPU seconds per GB for one run, counted as our passes are counted (the whole process,
// all threads, so the kernel workers io_uring hands work to on some file systems are included),
// less its start-up; never below fio's own job-thread figure.
double fio_cpu_seconds_per_gb(const FioFigures& f, double startup_cpu_seconds);

// The same per GB for context switches.
double fio_context_switches_per_gb(const FioFigures& f, double startup_context_switches);

// Measures FioStartup for `job`.
Result<FioStartup> measure_fio_startup(const FioJob& job);

// Writes the file once untimed unless it holds data (so every timed pass reads written blocks
// or overwrites them), then runs fio, ours, fio, ours, ..., fio: `pairs` of our passes of
// job.op, each between two of fio's (see FioPair). `on_pair` (optional) sees each pair as it
// completes.
Result<FioComparison> compare_with_fio(IoSession& session, const FioJob& job, int pairs,
                                       const std::function<void(const FioPair&)>& on_pair = {});

}  // namespace zinf::bench
