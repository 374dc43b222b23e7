// Our passes against fio's, alternated on the same file with the same engine and settings: the
// measurement behind `io --vs-fio` and `sweep --vs-fio`.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>

#include "src/base/status.h"
#include "tools/bench/fio_runner.h"
#include "tools/bench/io_runner.h"

namespace zinf::bench {

// One alternated pair: our pass and fio's, with fio's CPU counted as ours is (whole process).
struct FioPair {
    int index = 0;  // 1-based
    bool ours_first = true;
    PassFigures ours;
    FioFigures fio;
    double ratio = 0;               // ours GB/s / fio GB/s
    double fio_cpu_s_per_gb = 0;    // fio's whole process, start-up removed (fio_cpu_seconds_per_gb)
};

struct FioComparison {
    IoOp op = IoOp::kRead;
    int pairs = 0;
    // fio's start-up: the least process CPU of three runs of the same job over one block per
    // job, subtracted from each full run's process CPU.
    double fio_startup_cpu_seconds = 0;
    Spread ratio;
    Spread ours_gb_per_s;
    Spread fio_gb_per_s;
    Spread ours_cpu_s_per_gb;
    Spread fio_cpu_s_per_gb;      // whole process (every thread, kernel io_uring workers too)
    Spread fio_job_cpu_s_per_gb;  // fio's own figure: its job threads only
    nlohmann::json pairs_json = nlohmann::json::array();
};

// The fio job matching one of our configurations on `files` (one path): same engine
// (aio.backend: io_uring or libaio), block size, queue depth, threads as jobs, O_DIRECT, and
// registered buffers and files or SQPOLL for io_uring.
FioJob fio_job_for(const std::string& fio_binary, const BenchFiles& files, const io::AioOptions& aio,
                   bool direct, IoOp op);

// fio's CPU seconds per GB for one run, counted as our passes are counted (the whole process,
// all threads, so the kernel workers io_uring hands work to on some file systems are included),
// less its start-up; never below fio's own job-thread figure.
double fio_cpu_seconds_per_gb(const FioFigures& f, double startup_cpu_seconds);

// Measures fio's start-up CPU for `job` (see FioComparison::fio_startup_cpu_seconds).
Result<double> measure_fio_startup_cpu(const FioJob& job);

// Runs `pairs` alternated pairs (order flipped each pair, so that a drift of the disk hits both
// sides alike) of session.run_pass(job.op) and run_fio(job); `on_pair` (optional) sees each
// pair as it completes.
Result<FioComparison> compare_with_fio(IoSession& session, const FioJob& job, int pairs,
                                       const std::function<void(const FioPair&)>& on_pair = {});

}  // namespace zinf::bench
