// Runs Debian's fio on the bench's own file with the settings of one of our passes, and reads
// its figures (bandwidth, IOPS, completion latency, CPU) from fio's JSON output.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "tools/bench/io_runner.h"

namespace zinf::bench {

struct FioJob {
    std::string fio_binary = "fio";
    std::string file_path;  // an existing file; fio is told never to create one
    IoOp op = IoOp::kRead;
    std::uint64_t size_bytes = 0;
    std::uint64_t block_size_bytes = 1ULL << 20;
    int queue_depth = 32;
    // Jobs that split the file into equal consecutive parts (our intra_op_parallelism).
    int jobs = 1;
    std::string ioengine = "io_uring";  // io_uring | libaio
    bool direct = true;
    bool register_buffers = true;  // io_uring: --fixedbufs --registerfiles
    bool sqpoll = false;           // io_uring: --sqthread_poll
    // > 0: run for this long, wrapping around the file (the grid's short runs); 0: one pass.
    double runtime_seconds = 0;
};

struct FioFigures {
    std::uint64_t bytes = 0;
    double seconds = 0;   // the longest job's runtime
    double gb_per_s = 0;  // bytes / seconds / 1e9
    double iops = 0;
    double clat_us_p50 = 0;  // fio's completion latency (of the first job)
    double clat_us_p99 = 0;
    double cpu_seconds = 0;  // (usr_cpu + sys_cpu) / 100 x job_runtime, summed over jobs
    double cpu_seconds_per_gb = 0;
    // User + system CPU of the whole fio process from wait4: every thread, including the
    // kernel's io_uring workers that run the copies fio's job figure leaves out (tmpfs), and
    // fio's start-up. 0 when not run as a child (parse_fio_json alone).
    double process_cpu_seconds = 0;
    // Voluntary + involuntary context switches of the same (wait4), start-up included.
    std::uint64_t process_context_switches = 0;
};

// The argument vector (argv[0] is the binary) for `job`, with --output-format=json.
std::vector<std::string> fio_command(const FioJob& job);
// The command as one shell-quoted line, for printing.
std::string fio_command_line(const FioJob& job);
// Parses fio's JSON report (text before the first '{', such as warnings, is skipped). Errors
// name the missing field or fio's own error code.
Result<FioFigures> parse_fio_json(std::string_view text, IoOp op);
// Runs fio and parses its report. Errors: fio missing or failing (with its stderr), the
// interruption flag set while it ran.
Result<FioFigures> run_fio(const FioJob& job);
// Checks that `binary` runs (`fio --version`); the error says how to install it.
Status check_fio(const std::string& binary);

struct ProcessOutput {
    int exit_code = -1;  // 128 + signal when killed by a signal
    std::string out;
    std::string err;
    double cpu_seconds = 0;              // user + system of the child and all its threads (wait4)
    std::uint64_t context_switches = 0;  // voluntary + involuntary, likewise
};
// Runs argv[0] (looked up in PATH) with argv, capturing stdout and stderr. Blocks until it exits.
Result<ProcessOutput> run_process(const std::vector<std::string>& argv);

}  // namespace zinf::bench
