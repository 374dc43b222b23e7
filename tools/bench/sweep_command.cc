// `zinfinity-bench sweep` (a grid of aio configurations, printed as a table) and
// `zinfinity-bench tune` (the same grid, writing the best configuration as an `aio` block).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "src/base/file.h"
#include "src/base/log.h"
#include "src/base/units.h"
#include "src/base/config.h"
#include "src/engine/offload_plan.h"
#include "tools/bench/commands.h"
#include "tools/bench/io_command_support.h"
#include "tools/bench/io_runner.h"
#include "tools/cli/args.h"

namespace zinf::bench {
namespace {

using Json = nlohmann::json;

// Within this fraction of the best score, the cheaper configuration wins (tune's tie rule).
constexpr double kTieFraction = 0.01;

struct SweepOptions {
    CommonIoOptions common;
    std::vector<std::string> backends;
    std::vector<std::uint64_t> block_sizes;
    std::vector<std::uint64_t> queue_depths;
    std::vector<std::uint64_t> threads;
    std::vector<IoOp> ops;
    int loops = 1;
    std::string write_config;  // tune only
    bool force = false;
};

struct GridPoint {
    io::AioOptions aio;
    bool available = true;
    std::string skipped_reason;
    double read_gb_per_s = 0;   // median over loops; 0 when not measured
    double write_gb_per_s = 0;
    double read_cpu_s_per_gb = 0;
    double write_cpu_s_per_gb = 0;
    double read_latency_us_p99 = 0;
    double write_latency_us_p99 = 0;
    double score = 0;
};

// The rule both commands rank by: with reads and writes, the harmonic mean of their GB/s, which
// is the rate of a cycle that writes and reads back the same bytes (as a swap cycle does); with
// one op, that op's GB/s.
double score_of(const GridPoint& p, const std::vector<IoOp>& ops) {
    const bool has_read = std::find(ops.begin(), ops.end(), IoOp::kRead) != ops.end();
    const bool has_write = std::find(ops.begin(), ops.end(), IoOp::kWrite) != ops.end();
    if (has_read && has_write) {
        if (p.read_gb_per_s <= 0 || p.write_gb_per_s <= 0) return 0;
        return 2.0 / (1.0 / p.read_gb_per_s + 1.0 / p.write_gb_per_s);
    }
    return has_read ? p.read_gb_per_s : p.write_gb_per_s;
}

void declare_flags(cli::Args& args, bool tune) {
    declare_target_flags(args);
    args.add("backends", "io_uring,libaio,posix",
             "backends of the grid, comma-separated; one that cannot be\n"
             "set up here is skipped with the reason");
    args.add("block-sizes", "1MiB,4MiB,16MiB", "aio.block_size values of the grid");
    args.add("queue-depths", "8,16,32", "aio.queue_depth values of the grid");
    args.add("threads", "1,2", "aio.intra_op_parallelism values of the grid");
    if (!tune) {
        args.add("op", "write,read", "read, write, or write,read (both): passes at each point");
    }
    args.add("loops", "1", "passes of each op per grid point; the median counts");
    if (tune) {
        args.add("write-config", "",
                 "write the best configuration here as {\"aio\": {...}}, the\n"
                 "block zinfinity configs accept. Required");
        args.add_switch("force", "overwrite --write-config if the file exists");
    }
    declare_engine_flags(args, CommonFlagSet::kGrid);
}

Result<SweepOptions> parse_options(const cli::Args& args, bool tune) {
    SweepOptions o;
    ZINF_ASSIGN_OR_RETURN(o.common, parse_common_io_flags(args, CommonFlagSet::kGrid));
    o.backends = args.get_string_list("backends");
    if (o.backends.empty()) return Status::invalid_argument("--backends: empty list");
    for (const auto& b : o.backends) {
        if (b != "io_uring" && b != "libaio" && b != "posix") {
            return Status::invalid_argument(str_cat("--backends: expected io_uring, libaio or posix, got '", b, "'"));
        }
    }
    ZINF_ASSIGN_OR_RETURN(o.block_sizes, args.get_size_list("block-sizes"));
    for (const auto bs : o.block_sizes) {
        if (bs == 0 || bs % 512 != 0 || bs > (1ULL << 30)) {
            return Status::invalid_argument(str_cat("--block-sizes: ", bs, " is not a multiple of 512 up to 1 GiB"));
        }
    }
    ZINF_ASSIGN_OR_RETURN(o.queue_depths, args.get_int_list("queue-depths"));
    for (const auto qd : o.queue_depths) {
        if (qd == 0 || qd > 4096) return Status::invalid_argument(str_cat("--queue-depths: ", qd, " is outside [1, 4096]"));
    }
    ZINF_ASSIGN_OR_RETURN(o.threads, args.get_int_list("threads"));
    for (const auto t : o.threads) {
        if (t == 0 || t > 256) return Status::invalid_argument(str_cat("--threads: ", t, " is outside [1, 256]"));
    }
    if (tune) {
        o.ops = {IoOp::kWrite, IoOp::kRead};
        o.write_config = args.get("write-config");
        if (o.write_config.empty()) {
            return Status::invalid_argument("--write-config: missing; name the file for the aio block");
        }
        o.force = args.get_switch("force");
        struct stat st {};
        if (!o.force && ::stat(o.write_config.c_str(), &st) == 0) {
            return Status::invalid_argument(str_cat("--write-config ", o.write_config,
                                                    ": file exists; give --force to overwrite it"));
        }
    } else {
        ZINF_ASSIGN_OR_RETURN(o.ops, parse_io_ops(args.get("op")));
    }
    ZINF_ASSIGN_OR_RETURN(const std::int64_t loops, args.get_int("loops", 1, 100));
    o.loops = static_cast<int>(loops);
    return o;
}

void print_row(const GridPoint& p, bool best) {
    std::printf("%-9s %9s %5d %7d", p.aio.backend.c_str(), format_bytes(p.aio.block_size_bytes).c_str(),
                p.aio.queue_depth, p.aio.intra_op_parallelism);
    if (!p.available) {
        std::printf("   skipped: %s\n", p.skipped_reason.c_str());
        std::fflush(stdout);
        return;
    }
    const auto cell = [](double v, const char* fmt) {
        if (v > 0) {
            std::printf(fmt, v);
        } else {
            std::printf("%10s", "-");
        }
    };
    cell(p.write_gb_per_s, "%10.3f");
    cell(p.read_gb_per_s, "%10.3f");
    cell(p.score, "%10.3f");
    cell(p.write_cpu_s_per_gb, "%10.4f");
    cell(p.read_cpu_s_per_gb, "%10.4f");
    cell(p.write_latency_us_p99, "%10.0f");
    cell(p.read_latency_us_p99, "%10.0f");
    std::printf("%s\n", best ? "  *best" : "");
    std::fflush(stdout);
}

void print_header() {
    std::printf("%-9s %9s %5s %7s %10s %10s %10s %10s %10s %10s %10s\n", "backend", "block", "qd", "threads",
                "write GB/s", "read GB/s", "score", "w CPU/GB", "r CPU/GB", "w p99 us", "r p99 us");
}

// Measures one grid point. A backend that cannot be set up marks the point unavailable.
Status measure(const SweepOptions& o, BenchFiles& files, GridPoint& p) {
    auto session = IoSession::create(files, session_options(o.common, p.aio));
    if (!session.has_value()) {
        if (session.error().code() == StatusCode::kNotSupported) {
            p.available = false;
            p.skipped_reason = session.error().message();
            return Status::ok();
        }
        return session.error().with_context(str_cat(p.aio.backend, " block ", p.aio.block_size_bytes, " qd ",
                                                    p.aio.queue_depth, " threads ", p.aio.intra_op_parallelism));
    }
    for (const IoOp op : o.ops) {
        std::vector<PassFigures> passes;
        for (int loop = 0; loop < o.loops; ++loop) {
            auto f = (*session)->run_pass(op);
            if (!f.has_value()) {
                return f.error().with_context(str_cat(p.aio.backend, " block ", p.aio.block_size_bytes, " qd ",
                                                      p.aio.queue_depth, " ", io_op_name(op)));
            }
            passes.push_back(*f);
        }
        const PassFigures m = median_figures(passes);
        if (op == IoOp::kRead) {
            p.read_gb_per_s = m.gb_per_s;
            p.read_cpu_s_per_gb = m.cpu_seconds_per_gb;
            p.read_latency_us_p99 = m.latency_us_p99;
        } else {
            p.write_gb_per_s = m.gb_per_s;
            p.write_cpu_s_per_gb = m.cpu_seconds_per_gb;
            p.write_latency_us_p99 = m.latency_us_p99;
        }
    }
    p.score = score_of(p, o.ops);
    return Status::ok();
}

// Highest score; within kTieFraction of it, fewer threads, then lower queue depth, then smaller
// block size win (less memory held and less CPU for the same throughput).
const GridPoint* pick_best(const std::vector<GridPoint>& points) {
    double best_score = 0;
    for (const auto& p : points) {
        if (p.available) best_score = std::max(best_score, p.score);
    }
    if (best_score <= 0) return nullptr;
    const GridPoint* best = nullptr;
    for (const auto& p : points) {
        if (!p.available || p.score < best_score * (1.0 - kTieFraction)) continue;
        const auto key = [](const GridPoint& g) {
            return std::make_tuple(g.aio.intra_op_parallelism, g.aio.queue_depth, g.aio.block_size_bytes, -g.score);
        };
        if (best == nullptr || key(p) < key(*best)) best = &p;
    }
    return best;
}

Json point_to_json(const GridPoint& p) {
    Json j{{"backend", p.aio.backend},
           {"block_size", p.aio.block_size_bytes},
           {"queue_depth", p.aio.queue_depth},
           {"threads", p.aio.intra_op_parallelism},
           {"available", p.available}};
    if (!p.available) {
        j["skipped_reason"] = p.skipped_reason;
        return j;
    }
    j["write_gb_per_s"] = p.write_gb_per_s;
    j["read_gb_per_s"] = p.read_gb_per_s;
    j["score"] = p.score;
    j["write_cpu_seconds_per_gb"] = p.write_cpu_s_per_gb;
    j["read_cpu_seconds_per_gb"] = p.read_cpu_s_per_gb;
    j["write_latency_us_p99"] = p.write_latency_us_p99;
    j["read_latency_us_p99"] = p.read_latency_us_p99;
    return j;
}

Status write_config_file(const std::string& path, const std::string& text, bool force) {
    // Without --force the file is created exclusively, so a config that appeared since the flags
    // were checked is still not overwritten.
    const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (force ? O_TRUNC : O_EXCL);
    FileDescriptor fd(::open(path.c_str(), flags, 0644));
    if (!fd.valid()) return Status::from_errno(errno, str_cat("--write-config: cannot create ", path));
    std::size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            return Status::from_errno(errno, str_cat("--write-config: writing ", path));
        }
        done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd.get()) != 0) return Status::from_errno(errno, str_cat("--write-config: fsync ", path));
    return Status::ok();
}

Status run(const SweepOptions& o, bool tune) {
    ZINF_ASSIGN_OR_RETURN(auto files, BenchFiles::create(o.common.dirs, o.common.size_bytes));
    std::vector<GridPoint> points;
    for (const auto& backend : o.backends) {
        for (const auto bs : o.block_sizes) {
            for (const auto qd : o.queue_depths) {
                for (const auto threads : o.threads) {
                    GridPoint p;
                    p.aio = o.common.aio;
                    p.aio.backend = backend;
                    p.aio.block_size_bytes = bs;
                    p.aio.queue_depth = static_cast<int>(qd);
                    p.aio.intra_op_parallelism = static_cast<int>(threads);
                    points.push_back(p);
                }
            }
        }
    }
    std::printf("%s: %zu configurations on a %.3f GB (%s) test file in %s%s; ops:", tune ? "tune" : "sweep",
                points.size(), static_cast<double>(files->size_bytes()) / kBytesPerGb,
                format_bytes(files->size_bytes()).c_str(), o.common.dirs.front().c_str(),
                o.common.dirs.size() > 1 ? " (striped)" : "");
    for (const IoOp op : o.ops) std::printf(" %s", std::string(io_op_name(op)).c_str());
    std::printf("; O_DIRECT %s, registered buffers %s\n", o.common.aio.use_direct == io::DirectMode::kOn ? "on" : "off",
                o.common.aio.register_buffers ? "on" : "off");
    std::printf("score: %s\n", o.ops.size() == 2 ? "harmonic mean of write and read GB/s (GB/s of writing and "
                                                     "reading back the same bytes)"
                                                   : "GB/s of the op");
    print_header();
    std::string unavailable_backend;
    for (auto& p : points) {
        if (p.aio.backend == unavailable_backend) {
            p.available = false;
            p.skipped_reason = "backend unavailable (see above)";
            continue;
        }
        ZINF_TRY(measure(o, *files, p));
        if (!p.available) unavailable_backend = p.aio.backend;
        print_row(p, false);
    }
    const GridPoint* best = pick_best(points);
    if (best == nullptr) return Status::not_supported("no configuration of the grid could be measured");
    std::printf("best (highest score; within %.0f%% of it fewer threads, lower queue depth, smaller block win):\n",
                kTieFraction * 100);
    print_row(*best, true);

    Json report{{"command", tune ? "tune" : "sweep"},
                {"size_bytes", files->size_bytes()},
                {"paths", o.common.dirs},
                {"score_rule", o.ops.size() == 2 ? "harmonic_mean(read, write)" : "gb_per_s"}};
    Json grid = Json::array();
    for (const auto& p : points) grid.push_back(point_to_json(p));
    report["grid"] = grid;
    report["best"] = point_to_json(*best);
    report["best_aio"] = Json::parse(config::aio_to_json(engine::aio_config(best->aio)));

    if (tune) {
        const std::string text = config::aio_to_json(engine::aio_config(best->aio)) + "\n";
        // What we write must be what zinfinity reads back: check it before writing.
        auto parsed = config::load_aio_from_string(text, "tune output");
        if (!parsed.has_value()) return parsed.error().with_context("internal: the tuned aio block does not load");
        ZINF_TRY(write_config_file(o.write_config, text, o.force));
        std::printf("wrote %s:\n%s", o.write_config.c_str(), text.c_str());
    }
    if (!o.common.json_path.empty()) ZINF_TRY(write_json_report(o.common.json_path, report));
    return Status::ok();
}

int run_command(int argc, char** argv, bool tune) {
    const char* name = tune ? "tune" : "sweep";
    cli::Args args(
        tune ? "zinfinity-bench tune --path DIR --write-config FILE [flags]"
             : "zinfinity-bench sweep --path DIR [flags]",
        tune ? "Runs the sweep grid (backends x block sizes x queue depths x threads), writing and\n"
               "reading the bench's own test file at each point, and writes the best configuration\n"
               "as an `aio` JSON block that zinfinity configs accept.\n\n"
               "Rule: the best point has the highest harmonic mean of write and read GB/s, i.e. the\n"
               "rate of writing and reading back the same bytes, as a swap cycle does. Points within\n"
               "1% of it count as equal; among them fewer threads, then a lower queue depth, then a\n"
               "smaller block size win (less memory and CPU). The test file is created exclusively\n"
               "and removed at exit."
             : "Measures every combination of backends x block sizes x queue depths x threads on the\n"
               "bench's own test file (created exclusively, removed at exit) and prints a table of\n"
               "GB/s (decimal), CPU seconds per GB and p99 op latency, marking the best point (highest\n"
               "harmonic mean of write and read GB/s with both ops, else the op's GB/s).");
    declare_flags(args, tune);
    const std::string program = std::string("zinfinity-bench ") + name;
    if (auto exit_code = args.parse_or_exit(argc, argv, program)) return *exit_code;
    auto options = parse_options(args, tune);
    if (!options.has_value()) return cli::report_error(program, options.error());
    install_interrupt_handler();
    const Status status = run(*options, tune);
    return status.is_ok() ? 0 : cli::report_error(program, status, interrupted() ? 130 : 1);
}

}  // namespace

int run_sweep(int argc, char** argv) { return run_command(argc, argv, false); }
int run_tune(int argc, char** argv) { return run_command(argc, argv, true); }

}  // namespace zinf::bench
