// Shared flags, banners and JSON of the I/O subcommands.
#include "tools/bench/io_command_support.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>

#include "src/base/aio_backends.h"
#include "src/base/log.h"
#include "src/base/units.h"

namespace zinf::bench {

using Json = nlohmann::json;

void declare_target_flags(cli::Args& args) {
    args.add_list("path",
                  "directory for the test file; repeat to stripe one logical\n"
                  "file over several directories (drives). Required");
    args.add("size", "1GiB",
             "logical size of the test file (KiB/MiB/GiB binary, KB/MB/GB\n"
             "decimal); must fit in the free space and be a multiple of\n"
             "the file system's logical block size");
}

void declare_engine_flags(cli::Args& args, CommonFlagSet set) {
    if (set == CommonFlagSet::kSingle) {
        args.add("backend", "io_uring",
                 str_cat(aio_backend_list(/*with_auto=*/true),
                         " (auto: the first of\nthe others this build and kernel support)"));
        args.add("block-size", "1MiB",
                 "aio.block_size: bytes per piece the engine submits; a\n"
                 "multiple of 512 and of the file system's logical block size");
        args.add("queue-depth", "32", "aio.queue_depth: pieces in flight per worker, 1..4096");
        args.add("threads", "1", "aio.intra_op_parallelism: engine worker threads, 1..256");
    }
    args.add("direct", "on",
             "O_DIRECT: on or off (off: buffered I/O; page-cache effects\nmay apply)");
    args.add("register-buffers", "on", "io_uring registered (fixed) buffers and files: on or off");
    args.add("sqpoll", "off", "io_uring kernel submission thread: on or off (spins a core)");
    args.add("op-size", "auto",
             "bytes per operation handed to the engine, which cuts it into\n"
             "block-size pieces; auto: max(block size, 1 MiB). Enough\n"
             "operations stay outstanding for queue-depth x threads pieces\n"
             "in flight plus one more operation per thread queued");
    args.add("buffer-limit", "1GiB", "most aligned buffer memory one configuration may use");
    if (set == CommonFlagSet::kSingle) {
        args.add("fault", "",
                 "inject faults (io::FaultyBackend), e.g. fail_nth=5,errno=EIO\n"
                 "or read_error=0.01,seed=7; keys: fail_nth, errno, short,\n"
                 "latency_us, enospc_after, read_error, write_error, corrupt,\n"
                 "seed. Errors surface with file, offset and operation");
    }
    args.add("json", "", "also write every figure to this JSON file");
    args.add("progress", "auto",
             "progress line on stderr for passes over two seconds: on, off,\n"
             "or auto (on when stderr is a terminal)");
}

Result<CommonIoOptions> parse_common_io_flags(const cli::Args& args, CommonFlagSet set) {
    CommonIoOptions o;
    o.dirs = args.get_list("path");
    if (o.dirs.empty()) {
        return Status::invalid_argument(
            "--path: missing; name a directory for the test file (e.g. --path /mnt/nvme0)");
    }
    for (const auto& dir : o.dirs) {
        if (dir.empty()) return Status::invalid_argument("--path: empty directory name");
    }
    ZINF_ASSIGN_OR_RETURN(o.size_bytes, args.get_size_bytes("size"));
    if (o.size_bytes == 0)
        return Status::invalid_argument("--size: must be greater than zero, got " +
                                        args.get("size"));
    if (o.size_bytes % 512 != 0) {
        return Status::invalid_argument(str_cat("--size: ", args.get("size"), " (", o.size_bytes,
                                                " bytes) is not a multiple of 512 bytes"));
    }
    if (set == CommonFlagSet::kSingle) {
        ZINF_ASSIGN_OR_RETURN(o.aio.backend,
                              args.get_choice("backend", aio_backend_names(/*with_auto=*/true)));
        ZINF_ASSIGN_OR_RETURN(o.aio.block_size_bytes, args.get_size_bytes("block-size"));
        if (o.aio.block_size_bytes == 0 || o.aio.block_size_bytes % 512 != 0 ||
            o.aio.block_size_bytes > (1ULL << 30)) {
            return Status::invalid_argument(
                str_cat("--block-size: expected a multiple of 512 bytes up to 1 GiB, got ",
                        args.get("block-size"), " (", o.aio.block_size_bytes, " bytes)"));
        }
        ZINF_ASSIGN_OR_RETURN(const std::int64_t qd, args.get_int("queue-depth", 1, 4096));
        o.aio.queue_depth = static_cast<int>(qd);
        ZINF_ASSIGN_OR_RETURN(const std::int64_t threads, args.get_int("threads", 1, 256));
        o.aio.intra_op_parallelism = static_cast<int>(threads);
        if (args.given("fault") && !args.get("fault").empty()) {
            auto plan = io::parse_fault_plan(args.get("fault"));
            if (!plan.has_value()) return plan.error().with_context("--fault");
            o.faults = *plan;
        }
    }
    ZINF_ASSIGN_OR_RETURN(const bool direct, args.get_bool("direct"));
    o.aio.use_direct = direct ? io::DirectMode::kOn : io::DirectMode::kOff;
    ZINF_ASSIGN_OR_RETURN(o.aio.register_buffers, args.get_bool("register-buffers"));
    ZINF_ASSIGN_OR_RETURN(o.aio.sqpoll, args.get_bool("sqpoll"));
    if (args.get("op-size") != "auto") {
        ZINF_ASSIGN_OR_RETURN(o.op_size_bytes, args.get_size_bytes("op-size"));
        if (o.op_size_bytes == 0 || o.op_size_bytes % 512 != 0) {
            return Status::invalid_argument(str_cat(
                "--op-size: expected auto or a multiple of 512 bytes, got ", args.get("op-size")));
        }
    }
    ZINF_ASSIGN_OR_RETURN(o.buffer_limit_bytes, args.get_size_bytes("buffer-limit"));
    if (o.buffer_limit_bytes < (1ULL << 20)) {
        return Status::invalid_argument(
            str_cat("--buffer-limit: expected at least 1 MiB, got ", args.get("buffer-limit")));
    }
    o.json_path = args.get("json");
    if (args.get("progress") == "auto") {
        o.show_progress = ::isatty(STDERR_FILENO) != 0;
    } else {
        ZINF_ASSIGN_OR_RETURN(o.show_progress, args.get_bool("progress"));
    }
    return o;
}

SessionOptions session_options(const CommonIoOptions& common, const io::AioOptions& aio) {
    SessionOptions s;
    s.aio = aio;
    s.faults = common.faults;
    s.op_size_bytes = common.op_size_bytes;
    s.buffer_limit_bytes = common.buffer_limit_bytes;
    s.show_progress = common.show_progress;
    return s;
}

io::AioOptions effective_aio(const IoSession& session) {
    io::AioOptions aio = session.aio();
    aio.backend = std::string(session.backend_name());
    return aio;
}

std::string describe_session(const IoSession& session, const BenchFiles& files) {
    const io::AioOptions& aio = session.aio();
    const PassPlan& plan = session.plan();
    (void)files;
    return str_cat("backend ", session.backend_name(), ", block ",
                   format_bytes(aio.block_size_bytes), ", queue depth ", aio.queue_depth, ", ",
                   aio.intra_op_parallelism, aio.intra_op_parallelism == 1 ? " thread" : " threads",
                   ", O_DIRECT ", session.is_direct() ? "on" : "off", ", registered buffers ",
                   aio.register_buffers ? "on" : "off", aio.sqpoll ? ", sqpoll on" : "",
                   ", ops of ", format_bytes(plan.op_size_bytes), " x ", plan.ops_outstanding,
                   " outstanding");
}

void print_session_banner(const IoSession& session, const BenchFiles& files,
                          const CommonIoOptions& common) {
    std::printf("test file: %.3f GB (%s)", static_cast<double>(files.size_bytes()) / kBytesPerGb,
                format_bytes(files.size_bytes()).c_str());
    if (files.paths().size() == 1) {
        std::printf(" at %s\n", files.paths().front().c_str());
    } else {
        std::printf(" striped over %zu files:", files.paths().size());
        for (const auto& p : files.paths()) std::printf(" %s", p.c_str());
        std::printf("\n");
    }
    std::printf("config: %s\n", describe_session(session, files).c_str());
    if (!session.is_direct()) {
        std::printf(
            "note: buffered I/O (--direct off): the page cache may absorb or serve part of the "
            "traffic; "
            "reads start after the file's pages are dropped, writes include the final fdatasync\n");
    }
    if (session.plan().limited_by_buffer) {
        std::printf(
            "note: --buffer-limit %s holds fewer operations than queue depth x threads pieces plus "
            "one; the engine's queues may run dry\n",
            format_bytes(common.buffer_limit_bytes).c_str());
    }
    if (common.faults.has_value()) std::printf("note: fault injection on (--fault)\n");
    std::fflush(stdout);
}

PassFigures median_figures(const std::vector<PassFigures>& passes) {
    ZINF_ASSERT(!passes.empty());
    const auto median = [&](auto field) {
        std::vector<double> v;
        v.reserve(passes.size());
        for (const auto& p : passes) v.push_back(static_cast<double>(p.*field));
        return spread_of(v).median;
    };
    PassFigures m = passes.front();
    m.seconds = median(&PassFigures::seconds);
    m.gb_per_s = median(&PassFigures::gb_per_s);
    m.iops = median(&PassFigures::iops);
    m.latency_us_p50 = median(&PassFigures::latency_us_p50);
    m.latency_us_p99 = median(&PassFigures::latency_us_p99);
    m.cpu_seconds = median(&PassFigures::cpu_seconds);
    m.cpu_seconds_per_gb = median(&PassFigures::cpu_seconds_per_gb);
    m.context_switches_per_gb = median(&PassFigures::context_switches_per_gb);
    m.context_switches = static_cast<std::uint64_t>(median(&PassFigures::context_switches));
    return m;
}

Json pass_to_json(const PassFigures& f) {
    return Json{{"op", io_op_name(f.op)},
                {"bytes", f.bytes},
                {"seconds", f.seconds},
                {"gb_per_s", f.gb_per_s},
                {"iops", f.iops},
                {"pieces", f.pieces},
                {"ops", f.ops},
                {"latency_us_p50", f.latency_us_p50},
                {"latency_us_p99", f.latency_us_p99},
                {"cpu_seconds", f.cpu_seconds},
                {"cpu_seconds_per_gb", f.cpu_seconds_per_gb},
                {"context_switches", f.context_switches},
                {"context_switches_per_gb", f.context_switches_per_gb},
                {"short_transfers", f.short_transfers},
                {"retries", f.retries},
                {"pieces_fixed_buffer", f.pieces_fixed_buffer},
                {"pieces_fixed_file", f.pieces_fixed_file},
                {"pieces_plain", f.pieces_plain},
                {"buffer_huge_page_bytes", f.buffer_huge_page_bytes}};
}

Json spread_to_json(const Spread& s) {
    return Json{{"median", s.median}, {"min", s.min}, {"max", s.max}};
}

Status write_json_report(const std::string& path, const Json& report) {
    std::ofstream out(path, std::ios::trunc);
    if (!out)
        return Status::from_errno(errno, str_cat("--json: cannot open ", path, " for writing"));
    out << report.dump(2) << "\n";
    out.close();
    if (!out) return Status::io_error(str_cat("--json: writing ", path, " failed"), EIO);
    return Status::ok();
}

}  // namespace zinf::bench
