// Alternated pairs of our passes and fio's, with both sides' CPU counted alike.
#include "tools/bench/fio_compare.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "src/base/log.h"
#include "tools/bench/io_command_support.h"

namespace zinf::bench {
namespace {

using Json = nlohmann::json;

Json fio_to_json(const FioFigures& f, double cpu_s_per_gb) {
    return Json{{"bytes", f.bytes},
                {"seconds", f.seconds},
                {"gb_per_s", f.gb_per_s},
                {"iops", f.iops},
                {"clat_us_p50", f.clat_us_p50},
                {"clat_us_p99", f.clat_us_p99},
                {"job_cpu_seconds", f.cpu_seconds},
                {"job_cpu_seconds_per_gb", f.cpu_seconds_per_gb},
                {"process_cpu_seconds", f.process_cpu_seconds},
                {"cpu_seconds_per_gb", cpu_s_per_gb}};
}

}  // namespace

FioJob fio_job_for(const std::string& fio_binary, const BenchFiles& files, const io::AioOptions& aio,
                   bool direct, IoOp op) {
    FioJob job;
    job.fio_binary = fio_binary;
    job.file_path = files.paths().front();
    job.op = op;
    job.size_bytes = files.size_bytes();
    job.block_size_bytes = aio.block_size_bytes;
    job.queue_depth = aio.queue_depth;
    job.jobs = aio.intra_op_parallelism;
    job.ioengine = aio.backend;
    job.direct = direct;
    job.register_buffers = aio.register_buffers;
    job.sqpoll = aio.sqpoll;
    return job;
}

double fio_cpu_seconds_per_gb(const FioFigures& f, double startup_cpu_seconds) {
    if (f.bytes == 0) return 0;
    const double cpu = std::max(f.cpu_seconds, f.process_cpu_seconds - startup_cpu_seconds);
    return cpu / (static_cast<double>(f.bytes) / kBytesPerGb);
}

Result<double> measure_fio_startup_cpu(const FioJob& job) {
    // The same job (so the same buffers allocated and registered) moving one block per job: the
    // I/O it does is negligible beside a full run's.
    FioJob small = job;
    const auto jobs = static_cast<std::uint64_t>(std::max(job.jobs, 1));
    small.size_bytes = std::min(job.size_bytes, job.block_size_bytes * jobs);
    small.runtime_seconds = 0;
    double least = std::numeric_limits<double>::infinity();
    for (int i = 0; i < 3; ++i) {
        auto f = run_fio(small);
        if (!f.has_value()) return f.error().with_context("measuring fio's start-up");
        least = std::min(least, f->process_cpu_seconds);
    }
    return least;
}

Result<FioComparison> compare_with_fio(IoSession& session, const FioJob& job, int pairs,
                                       const std::function<void(const FioPair&)>& on_pair) {
    ZINF_ASSERT_GT(pairs, 0);
    FioComparison c;
    c.op = job.op;
    c.pairs = pairs;
    ZINF_ASSIGN_OR_RETURN(c.fio_startup_cpu_seconds, measure_fio_startup_cpu(job));
    std::vector<double> ratios, ours_gbps, fio_gbps, ours_cpu, fio_cpu, fio_job_cpu;
    for (int i = 1; i <= pairs; ++i) {
        FioPair pair;
        pair.index = i;
        pair.ours_first = i % 2 == 1;
        for (int side = 0; side < 2; ++side) {
            if ((side == 0) == pair.ours_first) {
                auto ours = session.run_pass(job.op);
                if (!ours.has_value()) return ours.error().with_context(str_cat("pair ", i, ", ours"));
                pair.ours = *ours;
            } else {
                auto theirs = run_fio(job);
                if (!theirs.has_value()) return theirs.error().with_context(str_cat("pair ", i, ", fio"));
                pair.fio = *theirs;
            }
        }
        pair.ratio = pair.ours.gb_per_s / pair.fio.gb_per_s;
        pair.fio_cpu_s_per_gb = fio_cpu_seconds_per_gb(pair.fio, c.fio_startup_cpu_seconds);
        ratios.push_back(pair.ratio);
        ours_gbps.push_back(pair.ours.gb_per_s);
        fio_gbps.push_back(pair.fio.gb_per_s);
        ours_cpu.push_back(pair.ours.cpu_seconds_per_gb);
        fio_cpu.push_back(pair.fio_cpu_s_per_gb);
        fio_job_cpu.push_back(pair.fio.cpu_seconds_per_gb);
        c.pairs_json.push_back(Json{{"pair", i},
                                    {"ours_first", pair.ours_first},
                                    {"ours", pass_to_json(pair.ours)},
                                    {"fio", fio_to_json(pair.fio, pair.fio_cpu_s_per_gb)},
                                    {"ratio", pair.ratio}});
        if (on_pair) on_pair(pair);
    }
    c.ratio = spread_of(ratios);
    c.ours_gb_per_s = spread_of(ours_gbps);
    c.fio_gb_per_s = spread_of(fio_gbps);
    c.ours_cpu_s_per_gb = spread_of(ours_cpu);
    c.fio_cpu_s_per_gb = spread_of(fio_cpu);
    c.fio_job_cpu_s_per_gb = spread_of(fio_job_cpu);
    return c;
}

}  // namespace zinf::bench
