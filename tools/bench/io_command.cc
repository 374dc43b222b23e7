// `zinfinity-bench io`: measures one aio configuration on the bench's own file, and optionally
// compares it, pass for pass, with fio (--vs-fio) or with the libaio backend (--vs-libaio).
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/fault.h"
#include "src/base/aio_backends.h"
#include "src/base/config.h"
#include "src/base/log.h"
#include "src/base/units.h"
#include "src/engine/offload_plan.h"
#include "tools/bench/commands.h"
#include "tools/bench/fio_compare.h"
#include "tools/bench/fio_runner.h"
#include "tools/bench/io_command_support.h"
#include "tools/bench/io_runner.h"
#include "tools/cli/args.h"

namespace zinf::bench {
namespace {

using Json = nlohmann::json;

struct IoCommandOptions {
    CommonIoOptions common;
    std::vector<IoOp> ops;
    int loops = 3;
    bool vs_fio = false;
    bool fio_grid = false;
    std::vector<std::uint64_t> fio_grid_block_sizes;
    std::vector<std::uint64_t> fio_grid_queue_depths;
    double fio_grid_seconds = 2;
    bool vs_libaio = false;
    int pairs = 7;
    std::string fio_binary = "fio";
};

void declare_flags(cli::Args& args) {
    declare_target_flags(args);
    args.add("op", "read",
             "read, write, or write,read (also: both) to write the file\n"
             "and read it back in one run; each pass streams the whole file");
    args.add("loops", "3", "passes of each --op; the summary gives the median");
    declare_engine_flags(args, CommonFlagSet::kSingle);
    args.add_switch("vs-fio",
                    "also run fio on the same file with the same engine, block\n"
                    "size, queue depth and O_DIRECT: fio, ours, fio, ..., ours, fio\n"
                    "(--pairs of our passes per op, each between two of fio's, whose\n"
                    "geometric mean it is divided by); prints our GB/s, fio's, the\n"
                    "ratio, the median ratio with min/max, CPU s/GB and context\n"
                    "switches of both (fio's less its start-up's; a CPU ratio where\n"
                    "fio's start-up varies too much beside its I/O is flagged).\n"
                    "Needs one --path and io_uring or libaio");
    args.add_switch("fio-grid",
                    "with --vs-fio: first run fio briefly over the grid below and\n"
                    "compare at fio's best setting for each op (overrides\n"
                    "--block-size and --queue-depth)");
    args.add("fio-grid-block-sizes", "1MiB,4MiB,8MiB,16MiB", "block sizes of the fio grid");
    args.add("fio-grid-queue-depths", "4,8,16,32", "queue depths of the fio grid");
    args.add("fio-grid-seconds", "2", "seconds per fio grid run (time-based, wrapping the file)");
    args.add_switch("vs-libaio",
                    "also alternate io_uring and libaio passes at the same\n"
                    "settings (--pairs pairs per op); prints the median\n"
                    "io_uring/libaio ratio with min/max");
    args.add("pairs", "7",
             "our passes bracketed by fio's (--vs-fio), alternated pairs (--vs-libaio)");
    args.add("fio-binary", "fio", "the fio that --vs-fio runs");
}

Result<IoCommandOptions> parse_options(const cli::Args& args) {
    IoCommandOptions o;
    ZINF_ASSIGN_OR_RETURN(o.common, parse_common_io_flags(args, CommonFlagSet::kSingle));
    ZINF_ASSIGN_OR_RETURN(o.ops, parse_io_ops(args.get("op")));
    ZINF_ASSIGN_OR_RETURN(const std::int64_t loops, args.get_int("loops", 1, 1000));
    o.loops = static_cast<int>(loops);
    o.vs_fio = args.get_switch("vs-fio");
    o.fio_grid = args.get_switch("fio-grid");
    o.vs_libaio = args.get_switch("vs-libaio");
    ZINF_ASSIGN_OR_RETURN(const std::int64_t pairs, args.get_int("pairs", 1, 1000));
    o.pairs = static_cast<int>(pairs);
    o.fio_binary = args.get("fio-binary");
    ZINF_ASSIGN_OR_RETURN(o.fio_grid_block_sizes, args.get_size_list("fio-grid-block-sizes"));
    ZINF_ASSIGN_OR_RETURN(o.fio_grid_queue_depths, args.get_int_list("fio-grid-queue-depths"));
    ZINF_ASSIGN_OR_RETURN(o.fio_grid_seconds, args.get_double("fio-grid-seconds", 0.2, 600));
    for (const auto bs : o.fio_grid_block_sizes) {
        if (bs == 0 || bs % 512 != 0) {
            return Status::invalid_argument(
                str_cat("--fio-grid-block-sizes: ", bs, " is not a positive multiple of 512"));
        }
    }
    for (const auto qd : o.fio_grid_queue_depths) {
        if (qd == 0 || qd > 4096) {
            return Status::invalid_argument(
                str_cat("--fio-grid-queue-depths: ", qd, " is outside [1, 4096]"));
        }
    }
    if (o.fio_grid && !o.vs_fio) return Status::invalid_argument("--fio-grid needs --vs-fio");
    if (o.vs_fio) {
        if (o.common.dirs.size() != 1) {
            return Status::invalid_argument(
                "--vs-fio: give exactly one --path (fio and our striping differ)");
        }
        if (o.common.aio.backend == "posix") {
            return Status::invalid_argument(
                "--vs-fio: compare io_uring or libaio (fio has no engine like our posix backend)");
        }
        if (o.common.faults.has_value()) return Status::invalid_argument("--vs-fio: drop --fault");
    }
    if (o.vs_libaio && o.common.faults.has_value())
        return Status::invalid_argument("--vs-libaio: drop --fault");
    return o;
}

// The last three columns count the pieces by how they went to the kernel: through a registered
// (fixed) buffer, on a registered file, or with neither; a silent fallback shows there.
void print_pass_header() {
    std::printf("%-6s %6s %9s %10s %10s %10s %10s %9s %10s %10s %10s\n", "op", "loop", "GB/s",
                "IOPS", "p50 us", "p99 us", "CPU s/GB", "seconds", "fixed buf", "fixed file",
                "plain");
}

void print_pass_row(const PassFigures& f, const std::string& loop) {
    std::printf("%-6s %6s %9.3f %10.0f %10.0f %10.0f %10.4f %9.2f %10llu %10llu %10llu\n",
                std::string(io_op_name(f.op)).c_str(), loop.c_str(), f.gb_per_s, f.iops,
                f.latency_us_p50, f.latency_us_p99, f.cpu_seconds_per_gb, f.seconds,
                static_cast<unsigned long long>(f.pieces_fixed_buffer),
                static_cast<unsigned long long>(f.pieces_fixed_file),
                static_cast<unsigned long long>(f.pieces_plain));
    std::fflush(stdout);
}

// With registered buffers asked for on io_uring, every piece should use them (the bench's
// buffers all lie in its one registered region); says so when some did not.
void note_fixed_buffer_fallback(const IoSession& session, const PassFigures& f) {
    if (!session.aio().register_buffers || session.backend_name() != "io_uring") return;
    if (f.pieces_fixed_buffer == f.pieces && f.pieces_fixed_file == f.pieces) return;
    std::printf(
        "note: registered buffers are on, yet of %llu pieces %llu used a fixed buffer and %llu a "
        "registered file; the rest fell back to plain opcodes\n",
        static_cast<unsigned long long>(f.pieces),
        static_cast<unsigned long long>(f.pieces_fixed_buffer),
        static_cast<unsigned long long>(f.pieces_fixed_file));
}

// --- plain passes -------------------------------------------------------------------------------

Status run_passes(const IoCommandOptions& o, IoSession& session, Json& report) {
    print_pass_header();
    Json passes = Json::array();
    std::vector<std::vector<PassFigures>> by_op(o.ops.size());
    for (int loop = 1; loop <= o.loops; ++loop) {
        for (std::size_t k = 0; k < o.ops.size(); ++k) {
            auto f = session.run_pass(o.ops[k]);
            if (!f.has_value()) {
                return f.error().with_context(str_cat(io_op_name(o.ops[k]), " pass ", loop));
            }
            print_pass_row(*f, std::to_string(loop));
            note_fixed_buffer_fallback(session, *f);
            by_op[k].push_back(*f);
            Json p = pass_to_json(*f);
            p["loop"] = loop;
            passes.push_back(p);
        }
    }
    report["passes"] = passes;
    Json summary = Json::object();
    if (o.loops > 1) {
        for (std::size_t k = 0; k < o.ops.size(); ++k) {
            PassFigures m = median_figures(by_op[k]);
            print_pass_row(m, "median");
            summary[std::string(io_op_name(o.ops[k]))] = pass_to_json(m);
        }
    } else {
        for (std::size_t k = 0; k < o.ops.size(); ++k) {
            summary[std::string(io_op_name(o.ops[k]))] = pass_to_json(by_op[k].front());
        }
    }
    report["summary"] = summary;
    return Status::ok();
}

// --- fio comparison ----------------------------------------------------------------------------

// Runs fio briefly over the grid and returns the (block size, queue depth) with fio's best GB/s.
Result<std::pair<std::uint64_t, int>> run_fio_grid(const IoCommandOptions& o,
                                                   const BenchFiles& files,
                                                   const io::AioOptions& aio,
                                                   std::string_view backend, bool direct, IoOp op,
                                                   Json& grid_report) {
    std::printf("\nfio grid, %s (%s, %.1f s each):\n", std::string(io_op_name(op)).c_str(),
                std::string(backend).c_str(), o.fio_grid_seconds);
    std::printf("%10s", "bs \\ qd");
    for (const auto qd : o.fio_grid_queue_depths)
        std::printf(" %8llu", static_cast<unsigned long long>(qd));
    std::printf("   (GB/s)\n");
    double best = -1;
    std::pair<std::uint64_t, int> best_setting{0, 0};
    for (const auto bs : o.fio_grid_block_sizes) {
        std::printf("%10s", format_bytes(bs).c_str());
        std::fflush(stdout);
        for (const auto qd : o.fio_grid_queue_depths) {
            io::AioOptions a = aio;
            a.block_size_bytes = bs;
            a.queue_depth = static_cast<int>(qd);
            FioJob job = fio_job_for(o.fio_binary, files, a, direct, op);
            job.runtime_seconds = o.fio_grid_seconds;
            auto f = run_fio(job);
            if (!f.has_value()) return f.error().with_context("fio grid");
            std::printf(" %8.3f", f->gb_per_s);
            std::fflush(stdout);
            grid_report.push_back(Json{{"op", io_op_name(op)},
                                       {"block_size", bs},
                                       {"queue_depth", qd},
                                       {"gb_per_s", f->gb_per_s}});
            if (f->gb_per_s > best) {
                best = f->gb_per_s;
                best_setting = {bs, static_cast<int>(qd)};
            }
        }
        std::printf("\n");
    }
    std::printf("fio's best for %s: block size %s, queue depth %d (%.3f GB/s)\n",
                std::string(io_op_name(op)).c_str(), format_bytes(best_setting.first).c_str(),
                best_setting.second, best);
    return best_setting;
}

Status run_vs_fio(const IoCommandOptions& o, BenchFiles& files, Json& report) {
    ZINF_TRY(check_fio(o.fio_binary));
    Json out = Json::object();
    Json grid = Json::array();
    for (const IoOp op : o.ops) {
        io::AioOptions aio = o.common.aio;
        // Resolve "auto" and the O_DIRECT setting with a session at the given settings; it also
        // writes the file once, so that every compared pass overwrites or reads written blocks.
        std::string backend;
        bool direct = true;
        {
            ZINF_ASSIGN_OR_RETURN(auto probe,
                                  IoSession::create(files, session_options(o.common, aio)));
            ZINF_TRY(probe->prepare_for_read());
            backend = std::string(probe->backend_name());
            direct = probe->is_direct();
        }
        if (fio_engine_of(backend).empty()) {
            return Status::invalid_argument(
                str_cat("--vs-fio: backend ", backend, " has no fio counterpart"));
        }
        aio.backend = backend;
        if (o.fio_grid) {
            ZINF_ASSIGN_OR_RETURN(auto best,
                                  run_fio_grid(o, files, aio, backend, direct, op, grid));
            aio.block_size_bytes = best.first;
            aio.queue_depth = best.second;
        }
        ZINF_ASSIGN_OR_RETURN(auto session,
                              IoSession::create(files, session_options(o.common, aio)));
        const FioJob job = fio_job_for(o.fio_binary, files, aio, direct, op);
        std::printf("\n%s: ours vs fio, %d of our passes, each between two of fio's; %s\n",
                    std::string(io_op_name(op)).c_str(), o.pairs,
                    describe_session(*session, files).c_str());
        std::printf("fio: %s\n", fio_command_line(job).c_str());
        std::printf(
            "CPU/GB: user + system seconds of the whole process per GB, every thread (for fio also "
            "the\n"
            "kernel's io_uring workers, less its start-up); fio's own job figure in the last "
            "column\n");
        std::printf(
            "fio GB/s: the geometric mean of the fio passes before and after ours; fio CPU: their "
            "mean\n");
        std::printf("%5s %10s %11s %10s %10s %8s %12s %12s %10s %12s\n", "pass", "ours GB/s",
                    "fio before", "fio after", "fio GB/s", "ratio", "ours CPU/GB", "fio CPU/GB",
                    "CPU ratio", "fio job CPU");
        ZINF_ASSIGN_OR_RETURN(
            const FioComparison c, compare_with_fio(*session, job, o.pairs, [](const FioPair& p) {
                std::printf("%5d %10.3f %11.3f %10.3f %10.3f %8.3f %12.4f %12.4f %10.3f %12.4f\n",
                            p.index, p.ours.gb_per_s, p.fio_before.gb_per_s, p.fio_after.gb_per_s,
                            p.fio_gb_per_s, p.ratio, p.ours.cpu_seconds_per_gb, p.fio_cpu_s_per_gb,
                            p.cpu_ratio, p.fio_job_cpu_s_per_gb);
                std::fflush(stdout);
            }));
        std::printf(
            "%s: median ratio ours/fio %.3f (min %.3f, max %.3f over %d passes); median GB/s ours "
            "%.3f, "
            "fio %.3f\n",
            std::string(io_op_name(op)).c_str(), c.ratio.median, c.ratio.min, c.ratio.max, o.pairs,
            c.ours_gb_per_s.median, c.fio_gb_per_s.median);
        std::printf(
            "%s: median CPU ratio ours/fio %.3f (min %.3f, max %.3f; each pass against the fio "
            "passes\n"
            "  around it); median CPU s/GB ours %.4f, fio %.4f (fio start-up %.3f s removed)\n",
            std::string(io_op_name(op)).c_str(), c.cpu_ratio.median, c.cpu_ratio.min,
            c.cpu_ratio.max, c.ours_cpu_s_per_gb.median, c.fio_cpu_s_per_gb.median,
            c.fio_startup.cpu_seconds);
        if (!c.cpu_resolved) {
            std::printf(
                "%s: CPU ratio not resolved: fio's start-up CPU varied by %.3f s over five runs, "
                "beside\n"
                "  %.3f s for its I/O (needs %.0fx); a larger --size resolves it\n",
                std::string(io_op_name(op)).c_str(), c.fio_startup.cpu_spread_seconds,
                c.fio_io_cpu_seconds, kStartupSpreadsPerIo);
        }
        const double pieces_per_gb = kBytesPerGb / static_cast<double>(aio.block_size_bytes);
        std::printf(
            "%s: context switches, whole process: per GB ours %.0f, fio %.0f (medians; fio's "
            "start-up's\n"
            "  %.0f removed); per block-size piece ours %.2f, fio %.2f\n",
            std::string(io_op_name(op)).c_str(), c.ours_context_switches_per_gb.median,
            c.fio_context_switches_per_gb.median, c.fio_startup.context_switches,
            c.ours_context_switches_per_gb.median / pieces_per_gb,
            c.fio_context_switches_per_gb.median / pieces_per_gb);
        Json figures = comparison_to_json(c);
        figures["aio"] = Json::parse(config::aio_to_json(engine::aio_config(aio)));
        figures["fio_command"] = fio_command_line(job);
        out[std::string(io_op_name(op))] = std::move(figures);
    }
    if (o.fio_grid) out["fio_grid"] = grid;
    report["vs_fio"] = out;
    return Status::ok();
}

// --- io_uring vs libaio ------------------------------------------------------------------------

Status run_vs_libaio(const IoCommandOptions& o, BenchFiles& files, Json& report) {
    io::AioOptions uring_aio = o.common.aio;
    uring_aio.backend = "io_uring";
    io::AioOptions libaio_aio = o.common.aio;
    libaio_aio.backend = "libaio";
    ZINF_ASSIGN_OR_RETURN(auto uring,
                          IoSession::create(files, session_options(o.common, uring_aio)));
    ZINF_ASSIGN_OR_RETURN(auto libaio,
                          IoSession::create(files, session_options(o.common, libaio_aio)));
    ZINF_TRY(uring->prepare_for_read());
    Json out = Json::object();
    for (const IoOp op : o.ops) {
        std::printf("\n%s: io_uring vs libaio, %d alternating pairs; %s\n",
                    std::string(io_op_name(op)).c_str(), o.pairs,
                    describe_session(*uring, files).c_str());
        std::printf("%5s %-16s %14s %12s %8s %14s %12s\n", "pair", "order", "io_uring GB/s",
                    "libaio GB/s", "ratio", "io_uring CPU/GB", "libaio CPU/GB");
        std::vector<double> ratios, ucpu, lcpu;
        Json pairs = Json::array();
        for (int i = 1; i <= o.pairs; ++i) {
            const bool uring_first = i % 2 == 1;
            Result<PassFigures> u = Status::internal("not run");
            Result<PassFigures> l = Status::internal("not run");
            for (int side = 0; side < 2; ++side) {
                if ((side == 0) == uring_first) {
                    u = uring->run_pass(op);
                    if (!u.has_value())
                        return u.error().with_context(str_cat("pair ", i, ", io_uring"));
                } else {
                    l = libaio->run_pass(op);
                    if (!l.has_value())
                        return l.error().with_context(str_cat("pair ", i, ", libaio"));
                }
            }
            const double ratio = u->gb_per_s / l->gb_per_s;
            std::printf("%5d %-16s %14.3f %12.3f %8.3f %14.4f %12.4f\n", i,
                        uring_first ? "io_uring,libaio" : "libaio,io_uring", u->gb_per_s,
                        l->gb_per_s, ratio, u->cpu_seconds_per_gb, l->cpu_seconds_per_gb);
            std::fflush(stdout);
            ratios.push_back(ratio);
            ucpu.push_back(u->cpu_seconds_per_gb);
            lcpu.push_back(l->cpu_seconds_per_gb);
            pairs.push_back(Json{{"pair", i},
                                 {"io_uring", pass_to_json(*u)},
                                 {"libaio", pass_to_json(*l)},
                                 {"ratio", ratio}});
        }
        const Spread r = spread_of(ratios);
        std::printf(
            "%s: median ratio io_uring/libaio %.3f (min %.3f, max %.3f over %d pairs); median CPU "
            "s/GB "
            "io_uring %.4f, libaio %.4f\n",
            std::string(io_op_name(op)).c_str(), r.median, r.min, r.max, o.pairs,
            spread_of(ucpu).median, spread_of(lcpu).median);
        out[std::string(io_op_name(op))] = Json{{"pairs", pairs}, {"ratio", spread_to_json(r)}};
    }
    report["vs_libaio"] = out;
    return Status::ok();
}

Status run(const IoCommandOptions& o) {
    ZINF_ASSIGN_OR_RETURN(auto files, BenchFiles::create(o.common.dirs, o.common.size_bytes));
    Json report = Json::object();
    report["command"] = "io";
    report["size_bytes"] = o.common.size_bytes;
    report["paths"] = o.common.dirs;
    {
        ZINF_ASSIGN_OR_RETURN(auto session,
                              IoSession::create(*files, session_options(o.common, o.common.aio)));
        print_session_banner(*session, *files, o.common);
        report["aio"] =
            Json::parse(config::aio_to_json(engine::aio_config(effective_aio(*session))));
        report["backend"] = std::string(session->backend_name());
        report["direct"] = session->is_direct();
        report["op_size_bytes"] = session->plan().op_size_bytes;
        report["ops_outstanding"] = session->plan().ops_outstanding;
        if (!o.vs_fio && !o.vs_libaio) {
            Status status = run_passes(o, *session, report);
            if (!status.is_ok()) return status;
        }
    }
    if (o.vs_fio) ZINF_TRY(run_vs_fio(o, *files, report));
    if (o.vs_libaio) ZINF_TRY(run_vs_libaio(o, *files, report));
    if (!o.common.json_path.empty()) ZINF_TRY(write_json_report(o.common.json_path, report));
    return Status::ok();
}

}  // namespace

int run_io(int argc, char** argv) {
    cli::Args args(
        "zinfinity-bench io --path DIR [--path DIR2 ...] [flags]",
        "Measures sequential read or write throughput of one aio configuration through\n"
        "io::Engine on a test file of its own (zinf-bench-<pid>-<n>.dat in each --path,\n"
        "striped; created exclusively, never over an existing file, removed at exit, also\n"
        "on error and Ctrl-C). A read test writes the file first. Free space is checked\n"
        "before anything is written.\n\n"
        "Figures: GB/s (decimal, 1e9 bytes/s), IOPS (block-size pieces per second), op\n"
        "latency p50/p99 (submit to completion of one --op-size operation), and CPU seconds\n"
        "of the whole process (user + system, all threads) per GB moved; and how the pieces\n"
        "went to the kernel: through a registered (fixed) buffer, on a registered file, or\n"
        "plain (with io_uring and --register-buffers on, a plain piece is a fallback).");
    declare_flags(args);
    constexpr std::string_view kProgram = "zinfinity-bench io";
    if (auto exit_code = args.parse_or_exit(argc, argv, kProgram)) return *exit_code;
    auto options = parse_options(args);
    if (!options.has_value()) return cli::report_error(kProgram, options.error());
    install_interrupt_handler();
    const Status status = run(*options);
    return status.is_ok() ? 0 : cli::report_error(kProgram, status, interrupted() ? 130 : 1);
}

}  // namespace zinf::bench
