// Alternated pairs of our passes and fio's, with both sides' CPU counted alike.
#include "tools/bench/fio_compare.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "src/base/aio_backends.h"
#include "src/base/log.h"
#include "tools/bench/io_command_support.h"

namespace zinf::bench {
namespace {

using Json = nlohmann::json;

Json fio_to_json(const FioFigures& f, double cpu_s_per_gb, double context_switches_per_gb) {
    return Json{{"bytes", f.bytes},
                {"seconds", f.seconds},
                {"gb_per_s", f.gb_per_s},
                {"iops", f.iops},
                {"clat_us_p50", f.clat_us_p50},
                {"clat_us_p99", f.clat_us_p99},
                {"job_cpu_seconds", f.cpu_seconds},
                {"job_cpu_seconds_per_gb", f.cpu_seconds_per_gb},
                {"process_cpu_seconds", f.process_cpu_seconds},
                {"cpu_seconds_per_gb", cpu_s_per_gb},
                {"process_context_switches", f.process_context_switches},
                {"context_switches_per_gb", context_switches_per_gb}};
}

}  // namespace

FioJob fio_job_for(const std::string& fio_binary, const BenchFiles& files,
                   const io::AioOptions& aio, bool direct, IoOp op) {
    FioJob job;
    job.fio_binary = fio_binary;
    job.file_path = files.paths().front();
    job.op = op;
    job.size_bytes = files.size_bytes();
    job.block_size_bytes = aio.block_size_bytes;
    job.queue_depth = aio.queue_depth;
    job.jobs = aio.intra_op_parallelism;
    job.ioengine = std::string(fio_engine_of(aio.backend));
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

double fio_context_switches_per_gb(const FioFigures& f, double startup_context_switches) {
    if (f.bytes == 0) return 0;
    const double switches =
        std::max(0.0, static_cast<double>(f.process_context_switches) - startup_context_switches);
    return switches / (static_cast<double>(f.bytes) / kBytesPerGb);
}

Result<FioStartup> measure_fio_startup(const FioJob& job) {
    // The same job (so the same buffers allocated and registered) moving one block per job: the
    // I/O it does is negligible beside a full run's.
    FioJob small = job;
    const auto jobs = static_cast<std::uint64_t>(std::max(job.jobs, 1));
    small.size_bytes = std::min(job.size_bytes, job.block_size_bytes * jobs);
    small.runtime_seconds = 0;
    std::vector<double> cpu;
    std::vector<double> switches;
    for (int i = 0; i < 5; ++i) {
        auto f = run_fio(small);
        if (!f.has_value()) return f.error().with_context("measuring fio's start-up");
        cpu.push_back(f->process_cpu_seconds);
        switches.push_back(static_cast<double>(f->process_context_switches));
    }
    const Spread c = spread_of(cpu);
    return FioStartup{c.median, spread_of(switches).median, c.max - c.min};
}

Result<FioComparison> compare_with_fio(IoSession& session, const FioJob& job, int pairs,
                                       const std::function<void(const FioPair&)>& on_pair) {
    ZINF_ASSERT_GT(pairs, 0);
    FioComparison c;
    c.op = job.op;
    c.pairs = pairs;
    // A write pass then overwrites, as every later one does, instead of paying alone for the
    // file's first write.
    ZINF_TRY(session.prepare_for_read());
    ZINF_ASSIGN_OR_RETURN(c.fio_startup, measure_fio_startup(job));
    const FioStartup& startup = c.fio_startup;
    std::vector<double> ratios, cpu_ratios, ours_gbps, fio_gbps, ours_cpu, fio_cpu, fio_job_cpu;
    std::vector<double> ours_switches, fio_switches, fio_io_cpu;
    const auto fio_pass = [&](std::string_view where) -> Result<FioFigures> {
        auto f = run_fio(job);
        if (!f.has_value()) return f.error().with_context(where);
        fio_gbps.push_back(f->gb_per_s);
        fio_cpu.push_back(fio_cpu_seconds_per_gb(*f, startup.cpu_seconds));
        fio_job_cpu.push_back(f->cpu_seconds_per_gb);
        fio_switches.push_back(fio_context_switches_per_gb(*f, startup.context_switches));
        fio_io_cpu.push_back(f->process_cpu_seconds - startup.cpu_seconds);
        return f;
    };
    ZINF_ASSIGN_OR_RETURN(FioFigures before, fio_pass("fio's first pass"));
    for (int i = 1; i <= pairs; ++i) {
        FioPair pair;
        pair.index = i;
        auto ours = session.run_pass(job.op);
        if (!ours.has_value()) return ours.error().with_context(str_cat("our pass ", i));
        pair.ours = *ours;
        ZINF_ASSIGN_OR_RETURN(FioFigures after, fio_pass(str_cat("fio's pass after our pass ", i)));
        pair.fio_before = before;
        pair.fio_after = after;
        pair.fio_gb_per_s = std::sqrt(before.gb_per_s * after.gb_per_s);
        pair.ratio = pair.fio_gb_per_s > 0 ? pair.ours.gb_per_s / pair.fio_gb_per_s : 0;
        // fio_pass recorded both passes' CPU: the one before at i - 1, the one after at i.
        const double cpu_before = fio_cpu[static_cast<std::size_t>(i) - 1];
        const double cpu_after = fio_cpu[static_cast<std::size_t>(i)];
        pair.fio_cpu_s_per_gb = (cpu_before + cpu_after) / 2;
        pair.fio_job_cpu_s_per_gb = (before.cpu_seconds_per_gb + after.cpu_seconds_per_gb) / 2;
        pair.cpu_ratio =
            pair.fio_cpu_s_per_gb > 0 ? pair.ours.cpu_seconds_per_gb / pair.fio_cpu_s_per_gb : 0;
        const double switches_before = fio_switches[static_cast<std::size_t>(i) - 1];
        const double switches_after = fio_switches[static_cast<std::size_t>(i)];
        pair.fio_context_switches_per_gb = (switches_before + switches_after) / 2;
        ratios.push_back(pair.ratio);
        ours_switches.push_back(pair.ours.context_switches_per_gb);
        cpu_ratios.push_back(pair.cpu_ratio);
        ours_gbps.push_back(pair.ours.gb_per_s);
        ours_cpu.push_back(pair.ours.cpu_seconds_per_gb);
        c.pairs_json.push_back(
            Json{{"pair", i},
                 {"ours", pass_to_json(pair.ours)},
                 {"fio_before", fio_to_json(before, cpu_before, switches_before)},
                 {"fio_after", fio_to_json(after, cpu_after, switches_after)},
                 {"fio_gb_per_s", pair.fio_gb_per_s},
                 {"ratio", pair.ratio},
                 {"fio_cpu_seconds_per_gb", pair.fio_cpu_s_per_gb},
                 {"cpu_ratio", pair.cpu_ratio},
                 {"fio_context_switches_per_gb", pair.fio_context_switches_per_gb}});
        if (on_pair) on_pair(pair);
        before = after;
    }
    c.ratio = spread_of(ratios);
    c.cpu_ratio = spread_of(cpu_ratios);
    c.ours_gb_per_s = spread_of(ours_gbps);
    c.fio_gb_per_s = spread_of(fio_gbps);
    c.ours_cpu_s_per_gb = spread_of(ours_cpu);
    c.fio_cpu_s_per_gb = spread_of(fio_cpu);
    c.fio_job_cpu_s_per_gb = spread_of(fio_job_cpu);
    c.ours_context_switches_per_gb = spread_of(ours_switches);
    c.fio_context_switches_per_gb = spread_of(fio_switches);
    c.fio_io_cpu_seconds = spread_of(fio_io_cpu).median;
    c.cpu_resolved = c.fio_io_cpu_seconds >= kStartupSpreadsPerIo * startup.cpu_spread_seconds;
    return c;
}

Json comparison_to_json(const FioComparison& c) {
    return Json{{"ratio", spread_to_json(c.ratio)},
                {"cpu_ratio", spread_to_json(c.cpu_ratio)},
                {"ours_gb_per_s", spread_to_json(c.ours_gb_per_s)},
                {"fio_gb_per_s", spread_to_json(c.fio_gb_per_s)},
                {"ours_cpu_seconds_per_gb", spread_to_json(c.ours_cpu_s_per_gb)},
                {"fio_cpu_seconds_per_gb", spread_to_json(c.fio_cpu_s_per_gb)},
                {"fio_job_cpu_seconds_per_gb", spread_to_json(c.fio_job_cpu_s_per_gb)},
                {"ours_context_switches_per_gb", spread_to_json(c.ours_context_switches_per_gb)},
                {"fio_context_switches_per_gb", spread_to_json(c.fio_context_switches_per_gb)},
                {"fio_startup_cpu_seconds", c.fio_startup.cpu_seconds},
                {"fio_startup_context_switches", c.fio_startup.context_switches},
                {"fio_startup_cpu_spread_seconds", c.fio_startup.cpu_spread_seconds},
                {"fio_io_cpu_seconds", c.fio_io_cpu_seconds},
                {"cpu_resolved", c.cpu_resolved},
                {"pairs", c.pairs_json}};
}

}  // namespace zinf::bench
