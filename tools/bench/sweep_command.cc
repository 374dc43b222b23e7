// `zinfinity-bench sweep` (a grid of aio configurations, printed as a table) and
// `zinfinity-bench tune` (the same grid, writing the best configuration as an `aio` block).
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "src/base/aio_backends.h"
#include "src/base/config.h"
#include "src/base/file.h"
#include "src/base/log.h"
#include "src/base/units.h"
#include "src/engine/offload_plan.h"
#include "tools/bench/commands.h"
#include "tools/bench/fio_compare.h"
#include "tools/bench/fio_runner.h"
#include "tools/bench/io_command_support.h"
#include "tools/bench/io_runner.h"
#include "tools/cli/args.h"
#include "tools/cli/svg_plot.h"

namespace zinf::bench {
namespace {

using Json = nlohmann::json;
using cli::PlotOptions;
using cli::PlotPanel;
using cli::PlotSeries;
using cli::render_svg_plot;

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
    // sweep only:
    bool vs_fio = false;
    int pairs = 5;
    std::string fio_binary = "fio";
    std::string plot_path;
    bool tmpfs = false;
};

struct GridPoint {
    std::string storage;  // the directory measured, or "tmpfs" for the bench's own tmpfs
    io::AioOptions aio;
    bool available = true;
    std::string skipped_reason;
    double read_gb_per_s = 0;  // median over loops; 0 when not measured
    double write_gb_per_s = 0;
    double read_cpu_s_per_gb = 0;
    double write_cpu_s_per_gb = 0;
    double read_latency_us_p99 = 0;
    double write_latency_us_p99 = 0;
    double score = 0;
    std::optional<FioComparison> fio_write;  // --vs-fio
    std::optional<FioComparison> fio_read;
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
        args.add_switch("vs-fio",
                        "at every point, alternate our passes with fio's on the same file\n"
                        "with the same engine, block size, queue depth and O_DIRECT\n"
                        "(fio, ours, fio, ..., ours, fio: --pairs of our passes per op,\n"
                        "each divided by the geometric mean of the fio passes around\n"
                        "it); prints both GB/s, the median ratio with min/max, both\n"
                        "CPU s/GB and context switches per piece (a * marks a CPU\n"
                        "ratio that fio's start-up swamps), then the worst ratio of the\n"
                        "grid. Needs one --path; the grid defaults become backends\n"
                        "io_uring,libaio, queue depths 4,8,16,32, threads 1");
        args.add("pairs", "5",
                 "our passes per op and point with --vs-fio, each between two of fio's");
        args.add("fio-binary", "fio", "the fio that --vs-fio runs");
        args.add("plot", "",
                 "also draw the grid into this SVG file: GB/s against block size,\n"
                 "one line per queue depth, a panel per storage, backend and op\n"
                 "(with --vs-fio, fio's lines dashed beside ours)");
        args.add_switch("tmpfs",
                        "also run the grid on a tmpfs the bench mounts for the run (needs\n"
                        "root; memory-speed storage, where the engine's own per-piece\n"
                        "cost shows) in a fresh directory under /tmp, unmounted at exit");
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

// The grid's flags: backends, block sizes, queue depths and threads, each value checked.
Status parse_grid(const cli::Args& args, SweepOptions& o) {
    o.backends = args.get_string_list("backends");
    if (o.backends.empty()) return Status::invalid_argument("--backends: empty list");
    for (const auto& b : o.backends) {
        const std::vector<std::string_view> known = aio_backend_names(/*with_auto=*/false);
        if (std::find(known.begin(), known.end(), b) == known.end()) {
            return Status::invalid_argument(str_cat(
                "--backends: expected ", aio_backend_list(/*with_auto=*/false), ", got '", b, "'"));
        }
    }
    ZINF_ASSIGN_OR_RETURN(o.block_sizes, args.get_size_list("block-sizes"));
    for (const auto bs : o.block_sizes) {
        if (bs == 0 || bs % 512 != 0 || bs > (1ULL << 30)) {
            return Status::invalid_argument(
                str_cat("--block-sizes: ", bs, " is not a multiple of 512 up to 1 GiB"));
        }
    }
    ZINF_ASSIGN_OR_RETURN(o.queue_depths, args.get_int_list("queue-depths"));
    for (const auto qd : o.queue_depths) {
        if (qd == 0 || qd > 4096) {
            return Status::invalid_argument(
                str_cat("--queue-depths: ", qd, " is outside [1, 4096]"));
        }
    }
    ZINF_ASSIGN_OR_RETURN(o.threads, args.get_int_list("threads"));
    for (const auto t : o.threads) {
        if (t == 0 || t > 256) {
            return Status::invalid_argument(str_cat("--threads: ", t, " is outside [1, 256]"));
        }
    }
    return Status::ok();
}

// tune's own flags: both ops, and --write-config, which must not exist unless --force.
Status parse_tune_flags(const cli::Args& args, SweepOptions& o) {
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
    return Status::ok();
}

// sweep's own flags: --op, --vs-fio (which changes the grid's defaults), --pairs, --plot, --tmpfs.
Status parse_sweep_flags(const cli::Args& args, SweepOptions& o) {
    ZINF_ASSIGN_OR_RETURN(o.ops, parse_io_ops(args.get("op")));
    o.vs_fio = args.get_switch("vs-fio");
    ZINF_ASSIGN_OR_RETURN(const std::int64_t pairs, args.get_int("pairs", 1, 1000));
    o.pairs = static_cast<int>(pairs);
    o.fio_binary = args.get("fio-binary");
    o.plot_path = args.get("plot");
    o.tmpfs = args.get_switch("tmpfs");
    if (!o.plot_path.empty()) {
        const auto slash = o.plot_path.rfind('/');
        const std::string dir = slash == std::string::npos ? "." : o.plot_path.substr(0, slash + 1);
        struct stat st {};
        if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
            return Status::invalid_argument(
                str_cat("--plot ", o.plot_path, ": directory ", dir, " does not exist"));
        }
    }
    if (!o.vs_fio) {
        if (args.given("pairs")) return Status::invalid_argument("--pairs needs --vs-fio");
        return Status::ok();
    }
    if (o.common.dirs.size() != 1) {
        return Status::invalid_argument(
            "--vs-fio: give exactly one --path (fio and our striping differ)");
    }
    if (!args.given("backends")) {
        const std::vector<std::string_view> with_fio = aio_backends_with_fio();
        o.backends.assign(with_fio.begin(), with_fio.end());
    }
    if (!args.given("queue-depths")) o.queue_depths = {4, 8, 16, 32};
    if (!args.given("threads")) o.threads = {1};
    for (const auto& b : o.backends) {
        if (fio_engine_of(b).empty()) {
            std::string with_fio;
            for (const std::string_view name : aio_backends_with_fio()) {
                with_fio += str_cat(with_fio.empty() ? "" : " or ", name);
            }
            return Status::invalid_argument(
                str_cat("--vs-fio: backend ", b, " has no fio counterpart; compare ", with_fio));
        }
    }
    return Status::ok();
}

Result<SweepOptions> parse_options(const cli::Args& args, bool tune) {
    SweepOptions o;
    ZINF_ASSIGN_OR_RETURN(o.common, parse_common_io_flags(args, CommonFlagSet::kGrid));
    ZINF_TRY(parse_grid(args, o));
    ZINF_TRY(tune ? parse_tune_flags(args, o) : parse_sweep_flags(args, o));
    ZINF_ASSIGN_OR_RETURN(const std::int64_t loops, args.get_int("loops", 1, 100));
    o.loops = static_cast<int>(loops);
    return o;
}

void print_row(const GridPoint& p, bool best) {
    std::printf("%-9s %9s %5d %7d", p.aio.backend.c_str(),
                format_bytes(p.aio.block_size_bytes).c_str(), p.aio.queue_depth,
                p.aio.intra_op_parallelism);
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
    std::printf("%-9s %9s %5s %7s %10s %10s %10s %10s %10s %10s %10s\n", "backend", "block", "qd",
                "threads", "write GB/s", "read GB/s", "score", "w CPU/GB", "r CPU/GB", "w p99 us",
                "r p99 us");
}

std::string point_name(const GridPoint& p) {
    return str_cat(p.storage, ", ", p.aio.backend, ", block ", format_bytes(p.aio.block_size_bytes),
                   ", qd ", p.aio.queue_depth,
                   p.aio.intra_op_parallelism > 1
                       ? str_cat(", ", p.aio.intra_op_parallelism, " threads")
                       : "");
}

// The session of one grid point; null (the point marked unavailable, with the reason) when its
// backend cannot be set up here.
Result<std::unique_ptr<IoSession>> open_session(const SweepOptions& o, BenchFiles& files,
                                                GridPoint& p) {
    auto session = IoSession::create(files, session_options(o.common, p.aio));
    if (session.has_value()) return std::move(*session);
    if (session.error().code() != StatusCode::kNotSupported) {
        return session.error().with_context(point_name(p));
    }
    p.available = false;
    p.skipped_reason = session.error().message();
    return std::unique_ptr<IoSession>();
}

// Measures one grid point. A backend that cannot be set up marks the point unavailable.
Status measure(const SweepOptions& o, BenchFiles& files, GridPoint& p) {
    ZINF_ASSIGN_OR_RETURN(auto session, open_session(o, files, p));
    if (session == nullptr) return Status::ok();
    for (const IoOp op : o.ops) {
        std::vector<PassFigures> passes;
        for (int loop = 0; loop < o.loops; ++loop) {
            auto f = session->run_pass(op);
            if (!f.has_value()) {
                return f.error().with_context(str_cat(p.aio.backend, " block ",
                                                      p.aio.block_size_bytes, " qd ",
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
            return std::make_tuple(g.aio.intra_op_parallelism, g.aio.queue_depth,
                                   g.aio.block_size_bytes, -g.score);
        };
        if (best == nullptr || key(p) < key(*best)) best = &p;
    }
    return best;
}

Json point_to_json(const GridPoint& p) {
    Json j{{"storage", p.storage},
           {"backend", p.aio.backend},
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
    if (p.fio_write.has_value() || p.fio_read.has_value()) {
        Json v = Json::object();
        for (const auto* c : {&p.fio_write, &p.fio_read}) {
            if (!c->has_value()) continue;
            const FioComparison& f = **c;
            v[std::string(io_op_name(f.op))] = comparison_to_json(f);
        }
        j["vs_fio"] = v;
    }
    return j;
}

// --- sweep --vs-fio -----------------------------------------------------------------------------

void print_vs_fio_header() {
    std::printf("%-9s %9s %5s %7s %-5s %10s %10s %7s %15s %10s %10s %9s %13s\n", "backend", "block",
                "qd", "threads", "op", "ours GB/s", "fio GB/s", "ratio", "(min - max)", "ours CPU",
                "fio CPU", "CPU ratio", "switches/pc");
}

void print_vs_fio_rows(const GridPoint& p) {
    if (!p.available) {
        std::printf("%-9s %9s %5d %7d   skipped: %s\n", p.aio.backend.c_str(),
                    format_bytes(p.aio.block_size_bytes).c_str(), p.aio.queue_depth,
                    p.aio.intra_op_parallelism, p.skipped_reason.c_str());
        return;
    }
    for (const auto* c : {&p.fio_write, &p.fio_read}) {
        if (!c->has_value()) continue;
        const FioComparison& f = **c;
        // Context switches per block-size piece, ours / fio (medians).
        const double pieces_per_gb = kBytesPerGb / static_cast<double>(p.aio.block_size_bytes);
        std::printf(
            "%-9s %9s %5d %7d %-5s %10.3f %10.3f %7.3f (%5.3f - %5.3f) %10.4f %10.4f %8.3f%c "
            "%6.2f/%-6.2f\n",
            p.aio.backend.c_str(), format_bytes(p.aio.block_size_bytes).c_str(), p.aio.queue_depth,
            p.aio.intra_op_parallelism, std::string(io_op_name(f.op)).c_str(),
            f.ours_gb_per_s.median, f.fio_gb_per_s.median, f.ratio.median, f.ratio.min, f.ratio.max,
            f.ours_cpu_s_per_gb.median, f.fio_cpu_s_per_gb.median, f.cpu_ratio.median,
            f.cpu_resolved ? ' ' : '*', f.ours_context_switches_per_gb.median / pieces_per_gb,
            f.fio_context_switches_per_gb.median / pieces_per_gb);
    }
    std::fflush(stdout);
}

// Measures one point against fio: `pairs` of our passes per op, each between two of fio's.
Status measure_vs_fio(const SweepOptions& o, BenchFiles& files, GridPoint& p) {
    ZINF_ASSIGN_OR_RETURN(auto session, open_session(o, files, p));
    if (session == nullptr) return Status::ok();
    for (const IoOp op : o.ops) {
        const FioJob job = fio_job_for(o.fio_binary, files, p.aio, session->is_direct(), op);
        auto c = compare_with_fio(*session, job, o.pairs);
        if (!c.has_value()) {
            return c.error().with_context(str_cat(point_name(p), ", ", io_op_name(op)));
        }
        if (op == IoOp::kRead) {
            p.read_gb_per_s = c->ours_gb_per_s.median;
            p.read_cpu_s_per_gb = c->ours_cpu_s_per_gb.median;
            p.fio_read = std::move(*c);
        } else {
            p.write_gb_per_s = c->ours_gb_per_s.median;
            p.write_cpu_s_per_gb = c->ours_cpu_s_per_gb.median;
            p.fio_write = std::move(*c);
        }
    }
    p.score = score_of(p, o.ops);
    return Status::ok();
}

struct Worst {
    double value = 0;
    std::string where;
    bool set = false;
};

struct WorstOf {
    Worst ratio;
    Worst cpu;
    int cpu_unresolved = 0;  // comparisons whose CPU ratio is not resolved (left out of cpu)
};

// The lowest median GB/s ratio and the highest resolved median CPU ratio (ours / fio, both
// bracketed) over `points` measured on `storage` (every storage when empty).
WorstOf worst_of(const std::vector<GridPoint>& points, const std::string& storage) {
    WorstOf w;
    for (const auto& p : points) {
        if (!p.available || (!storage.empty() && p.storage != storage)) continue;
        for (const auto* c : {&p.fio_write, &p.fio_read}) {
            if (!c->has_value()) continue;
            const FioComparison& f = **c;
            const std::string where = str_cat(point_name(p), ", ", io_op_name(f.op));
            if (!w.ratio.set || f.ratio.median < w.ratio.value) {
                w.ratio = Worst{f.ratio.median, where, true};
            }
            if (!f.cpu_resolved) {
                ++w.cpu_unresolved;
            } else if (f.cpu_ratio.median > 0 && (!w.cpu.set || f.cpu_ratio.median > w.cpu.value)) {
                w.cpu = Worst{f.cpu_ratio.median, where, true};
            }
        }
    }
    return w;
}

void print_worst(const std::string& where, const WorstOf& w) {
    std::printf("worst ratio ours/fio %s: %.3f (%s)", where.c_str(), w.ratio.value,
                w.ratio.where.c_str());
    if (w.cpu.set) {
        std::printf("; highest CPU ratio ours/fio %.2f (%s)", w.cpu.value, w.cpu.where.c_str());
    }
    std::printf("\n");
}

Json worst_to_json(const WorstOf& w) {
    return Json{{"ratio", w.ratio.value},
                {"ratio_at", w.ratio.where},
                {"cpu_ratio", w.cpu.value},
                {"cpu_ratio_at", w.cpu.where},
                {"cpu_unresolved", w.cpu_unresolved}};
}

// --- --tmpfs -------------------------------------------------------------------------------------

// A tmpfs mounted on a fresh directory under /tmp for the run; unmounted and removed by the
// destructor (also on error and after Ctrl-C, which ends the run through interrupted()).
class TmpfsMount {
public:
    static Result<std::unique_ptr<TmpfsMount>> create(std::uint64_t file_bytes) {
        // Room for the file, the bench's free-space margin and some slack.
        const std::uint64_t size =
            file_bytes + std::min<std::uint64_t>(file_bytes / 20 + (64ULL << 20), 1ULL << 30) +
            (64ULL << 20);
        const std::uint64_t available = mem_available_bytes();
        if (available != 0 && available < size + (1ULL << 30)) {
            return Status::no_space(
                str_cat("--tmpfs: a tmpfs for a ", format_bytes(file_bytes), " test file needs ",
                        format_bytes(size), " of memory (plus 1 GiB to spare); ",
                        format_bytes(available), " is available; lower --size"));
        }
        char pattern[] = "/tmp/zinf-bench-tmpfs-XXXXXX";
        if (::mkdtemp(pattern) == nullptr) {
            return Status::from_errno(errno, "--tmpfs: mkdtemp under /tmp");
        }
        auto m = std::unique_ptr<TmpfsMount>(new TmpfsMount(pattern));
        const std::string data = str_cat("size=", size, ",mode=0700");
        if (::mount("tmpfs", pattern, "tmpfs", MS_NOSUID | MS_NODEV, data.c_str()) != 0) {
            const int err = errno;
            return Status::from_errno(err,
                                      str_cat("--tmpfs: mount -t tmpfs on ", pattern,
                                              err == EPERM ? " (needs root, CAP_SYS_ADMIN)" : ""));
        }
        m->mounted_ = true;
        return m;
    }
    ~TmpfsMount() {
        if (mounted_ && ::umount2(path_.c_str(), MNT_DETACH) != 0) {
            log::warning("--tmpfs: unmounting ", path_, ": ", std::strerror(errno));
        }
        if (::rmdir(path_.c_str()) != 0) {
            log::warning("--tmpfs: removing ", path_, ": ", std::strerror(errno));
        }
    }
    TmpfsMount(const TmpfsMount&) = delete;
    TmpfsMount& operator=(const TmpfsMount&) = delete;
    const std::string& path() const noexcept { return path_; }

private:
    explicit TmpfsMount(std::string path) : path_(std::move(path)) {}
    static std::uint64_t mem_available_bytes() {
        std::ifstream in("/proc/meminfo");
        std::string key;
        std::uint64_t kib = 0;
        std::string unit;
        while (in >> key >> kib >> unit) {
            if (key == "MemAvailable:") return kib * 1024;
        }
        return 0;
    }
    std::string path_;
    bool mounted_ = false;
};

// --- --plot --------------------------------------------------------------------------------------

std::string format_block(double bytes) {
    return format_bytes(static_cast<std::uint64_t>(bytes));
}

std::string render_plot(const SweepOptions& o, const std::vector<GridPoint>& points) {
    // A panel per (storage, backend, op); in it a line per (queue depth, threads) for ours and,
    // with --vs-fio, the same for fio, dashed.
    std::vector<std::string> storages;
    for (const auto& p : points) {
        if (std::find(storages.begin(), storages.end(), p.storage) == storages.end()) {
            storages.push_back(p.storage);
        }
    }
    std::vector<PlotPanel> panels;
    for (const auto& storage : storages) {
        for (const auto& backend : o.backends) {
            for (const IoOp op : o.ops) {
                PlotPanel panel;
                panel.title = str_cat(io_op_name(op), ", ", backend, ", ", storage);
                std::map<std::pair<int, int>, std::pair<PlotSeries, PlotSeries>>
                    lines;  // (qd, threads)
                int colour = 0;
                for (const auto qd : o.queue_depths) {
                    for (const auto threads : o.threads) {
                        const std::string tail = str_cat(
                            "qd ", qd, threads > 1 ? str_cat(" x", threads) : std::string());
                        PlotSeries ours;
                        ours.label = str_cat("ours ", tail);
                        ours.color = colour;
                        PlotSeries fio = ours;
                        fio.label = str_cat("fio ", tail);
                        fio.dashed = true;
                        for (auto* series : {&ours, &fio}) {
                            series->attributes = {{"source", series == &ours ? "ours" : "fio"},
                                                  {"storage", storage},
                                                  {"backend", backend},
                                                  {"op", std::string(io_op_name(op))},
                                                  {"queue-depth", std::to_string(qd)},
                                                  {"threads", std::to_string(threads)}};
                        }
                        lines.emplace(
                            std::make_pair(static_cast<int>(qd), static_cast<int>(threads)),
                            std::make_pair(std::move(ours), std::move(fio)));
                        ++colour;
                    }
                }
                for (const auto& p : points) {
                    if (!p.available || p.storage != storage || p.aio.backend != backend) continue;
                    auto it = lines.find({p.aio.queue_depth, p.aio.intra_op_parallelism});
                    if (it == lines.end()) continue;
                    const double x = static_cast<double>(p.aio.block_size_bytes);
                    const double ours = op == IoOp::kRead ? p.read_gb_per_s : p.write_gb_per_s;
                    if (ours > 0) it->second.first.points.emplace_back(x, ours);
                    const auto& c = op == IoOp::kRead ? p.fio_read : p.fio_write;
                    if (c.has_value()) {
                        it->second.second.points.emplace_back(x, c->fio_gb_per_s.median);
                    }
                }
                for (auto& [key, pair] : lines) {
                    if (!pair.first.points.empty()) panel.series.push_back(std::move(pair.first));
                    if (!pair.second.points.empty()) panel.series.push_back(std::move(pair.second));
                }
                if (!panel.series.empty()) panels.push_back(std::move(panel));
            }
        }
    }
    PlotOptions options;
    options.title = o.vs_fio ? "zinfinity-bench sweep --vs-fio: ours (solid) and fio (dashed), GB/s"
                             : "zinfinity-bench sweep: GB/s";
    options.x_label = "block size (aio.block_size)";
    options.y_label = "GB/s";
    options.columns = static_cast<int>(std::max<std::size_t>(1, o.ops.size()));
    options.format_x = &format_block;
    return render_svg_plot(options, panels);
}

Status write_text_file(const std::string& flag, const std::string& path, const std::string& text,
                       bool force) {
    // Without --force the file is created exclusively, so a config that appeared since the flags
    // were checked is still not overwritten.
    const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (force ? O_TRUNC : O_EXCL);
    FileDescriptor fd(::open(path.c_str(), flags, 0644));
    if (!fd.valid()) return Status::from_errno(errno, str_cat(flag, ": cannot create ", path));
    std::size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            return Status::from_errno(errno, str_cat(flag, ": writing ", path));
        }
        done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd.get()) != 0) return Status::from_errno(errno, str_cat(flag, ": fsync ", path));
    return Status::ok();
}

// What a sweep measures on: the bench file on each storage, the tmpfs when asked, and the grid.
// Members are destroyed in reverse order: the mount is detached (lazily, MNT_DETACH) before the
// files are removed, and the file on the tmpfs goes with the mount.
struct SweepRig {
    std::vector<std::unique_ptr<BenchFiles>> targets;  // one per storage, in order
    std::vector<std::string> storages;  // the first --path, then "tmpfs" with --tmpfs
    std::unique_ptr<TmpfsMount> tmpfs;
    std::vector<GridPoint> points;  // storages x backends x block sizes x queue depths x threads

    BenchFiles& files_of(const std::string& storage) {
        return *targets[static_cast<std::size_t>(
            std::find(storages.begin(), storages.end(), storage) - storages.begin())];
    }
};

// Set up: the bench files (and the tmpfs), the grid points in order, and fio when --vs-fio.
Result<SweepRig> set_up(const SweepOptions& o) {
    SweepRig r;
    ZINF_ASSIGN_OR_RETURN(auto disk_files, BenchFiles::create(o.common.dirs, o.common.size_bytes));
    r.targets.push_back(std::move(disk_files));
    r.storages.push_back(o.common.dirs.front());
    if (o.tmpfs) {
        ZINF_ASSIGN_OR_RETURN(r.tmpfs, TmpfsMount::create(o.common.size_bytes));
        ZINF_ASSIGN_OR_RETURN(auto tmpfs_files,
                              BenchFiles::create({r.tmpfs->path()}, o.common.size_bytes));
        r.targets.push_back(std::move(tmpfs_files));
        r.storages.push_back("tmpfs");
    }
    for (const auto& storage : r.storages) {
        for (const auto& backend : o.backends) {
            for (const auto bs : o.block_sizes) {
                for (const auto qd : o.queue_depths) {
                    for (const auto threads : o.threads) {
                        GridPoint p;
                        p.storage = storage;
                        p.aio = o.common.aio;
                        p.aio.backend = backend;
                        p.aio.block_size_bytes = bs;
                        p.aio.queue_depth = static_cast<int>(qd);
                        p.aio.intra_op_parallelism = static_cast<int>(threads);
                        r.points.push_back(p);
                    }
                }
            }
        }
    }
    if (o.vs_fio) ZINF_TRY(check_fio(o.fio_binary));
    return r;
}

// What the run will do: the grid, the file, the ops, and how points compare.
void print_plan(const SweepOptions& o, bool tune, const SweepRig& r) {
    std::printf("%s: %zu configurations on a %.3f GB (%s) test file in %s%s%s; ops:",
                tune ? "tune" : "sweep", r.points.size(),
                static_cast<double>(o.common.size_bytes) / kBytesPerGb,
                format_bytes(o.common.size_bytes).c_str(), o.common.dirs.front().c_str(),
                o.common.dirs.size() > 1 ? " (striped)" : "",
                r.tmpfs ? str_cat(" and on a tmpfs at ", r.tmpfs->path()).c_str() : "");
    for (const IoOp op : o.ops) std::printf(" %s", std::string(io_op_name(op)).c_str());
    std::printf("; O_DIRECT %s, registered buffers %s\n",
                o.common.aio.use_direct == io::DirectMode::kOn ? "on" : "off",
                o.common.aio.register_buffers ? "on" : "off");
    if (o.vs_fio) {
        std::printf(
            "each point: %d of our passes per op, each between two of fio's (same file, "
            "engine, block\n"
            "size, queue depth, O_DIRECT); a ratio is our pass over the geometric mean of the "
            "two; medians.\n"
            "CPU: user + system seconds per GB of the whole process, every thread (fio's too, "
            "with the\n"
            "kernel's io_uring workers, less its start-up); CPU ratio: the median of our "
            "passes' CPU over\n"
            "the mean of the two fio passes around each\n",
            o.pairs);
    } else {
        std::printf("score: %s\n",
                    o.ops.size() == 2 ? "harmonic mean of write and read GB/s (GB/s of writing and "
                                        "reading back the same bytes)"
                                      : "GB/s of the op");
    }
}

// Measure: every point in order, each row printed as it is measured, under a header per
// storage. A backend that cannot be set up on a storage is skipped for the rest of it.
Status measure_grid(const SweepOptions& o, SweepRig& r) {
    std::map<std::string, std::string> unavailable_backend;  // per storage
    std::string current_storage;
    for (auto& p : r.points) {
        if (p.storage != current_storage) {
            current_storage = p.storage;
            std::printf("\n%s:\n", p.storage == "tmpfs"
                                       ? str_cat("tmpfs (", r.tmpfs->path(), ")").c_str()
                                       : p.storage.c_str());
            if (o.vs_fio) {
                print_vs_fio_header();
            } else {
                print_header();
            }
        }
        if (p.aio.backend == unavailable_backend[p.storage]) {
            p.available = false;
            p.skipped_reason = "backend unavailable (see above)";
            continue;
        }
        BenchFiles& files = r.files_of(p.storage);
        if (o.vs_fio) {
            ZINF_TRY(measure_vs_fio(o, files, p));
            print_vs_fio_rows(p);
        } else {
            ZINF_TRY(measure(o, files, p));
            print_row(p, false);
        }
        if (!p.available) unavailable_backend[p.storage] = p.aio.backend;
    }
    return Status::ok();
}

// Report, --vs-fio: the worst ratios per storage and over the grid. Returns them as JSON.
Result<Json> report_worst_vs_fio(const SweepRig& r) {
    Json worst_json = Json::object();
    std::printf("\n");
    for (const auto& storage : r.storages) {
        const WorstOf w = worst_of(r.points, storage);
        if (!w.ratio.set) continue;
        print_worst(str_cat("on ", storage), w);
        worst_json[storage] = worst_to_json(w);
    }
    const WorstOf w = worst_of(r.points, "");
    if (!w.ratio.set) {
        return Status::not_supported("no configuration of the grid could be measured");
    }
    print_worst("over the grid", w);
    worst_json["grid"] = worst_to_json(w);
    if (w.cpu_unresolved > 0) {
        std::printf(
            "* CPU ratio not resolved at %d of the comparisons: fio's start-up CPU varied by "
            "more than\n"
            "  1/%.0f of its I/O's (large buffers); left out of the highest; a larger --size "
            "resolves it\n",
            w.cpu_unresolved, kStartupSpreadsPerIo);
    }
    return worst_json;
}

// The --json report: the grid, the best point and its aio block (and the --vs-fio figures).
Json report_json(const SweepOptions& o, bool tune, const SweepRig& r, const GridPoint& best,
                 const Json& worst_json) {
    Json report{{"command", tune ? "tune" : "sweep"},
                {"size_bytes", o.common.size_bytes},
                {"storages", r.storages},
                {"paths", o.common.dirs},
                {"score_rule", o.ops.size() == 2 ? "harmonic_mean(read, write)" : "gb_per_s"}};
    Json grid = Json::array();
    for (const auto& p : r.points) grid.push_back(point_to_json(p));
    report["grid"] = grid;
    report["best"] = point_to_json(best);
    report["best_aio"] = Json::parse(config::aio_to_json(engine::aio_config(best.aio)));
    if (o.vs_fio) {
        report["pairs"] = o.pairs;
        report["worst_vs_fio"] = worst_json;
    }
    return report;
}

// tune: the best point's aio block, checked to load as zinfinity reads it, to --write-config.
Status write_tuned_config(const SweepOptions& o, const GridPoint& best) {
    const std::string text = config::aio_to_json(engine::aio_config(best.aio)) + "\n";
    // What we write must be what zinfinity reads back: check it before writing.
    auto parsed = config::load_aio_from_string(text, "tune output");
    if (!parsed.has_value()) {
        return parsed.error().with_context("internal: the tuned aio block does not load");
    }
    ZINF_TRY(write_text_file("--write-config", o.write_config, text, o.force));
    std::printf("wrote %s:\n%s", o.write_config.c_str(), text.c_str());
    return Status::ok();
}

// Report: the worst ratios (--vs-fio), the best point, then the files asked for: --plot,
// tune's --write-config, --json.
Status report(const SweepOptions& o, bool tune, const SweepRig& r) {
    Json worst_json = Json::object();
    if (o.vs_fio) {
        ZINF_ASSIGN_OR_RETURN(worst_json, report_worst_vs_fio(r));
    }
    const GridPoint* best = pick_best(r.points);
    if (best == nullptr) {
        return Status::not_supported("no configuration of the grid could be measured");
    }
    std::printf(
        "best (highest score; within %.0f%% of it fewer threads, lower queue depth, smaller "
        "block win):\n",
        kTieFraction * 100);
    print_row(*best, true);
    const Json report = report_json(o, tune, r, *best, worst_json);
    if (!o.plot_path.empty()) {
        ZINF_TRY(write_text_file("--plot", o.plot_path, render_plot(o, r.points), true));
        std::printf("plot: %s\n", o.plot_path.c_str());
    }
    if (tune) ZINF_TRY(write_tuned_config(o, *best));
    if (!o.common.json_path.empty()) ZINF_TRY(write_json_report(o.common.json_path, report));
    return Status::ok();
}

Status run(const SweepOptions& o, bool tune) {
    ZINF_ASSIGN_OR_RETURN(SweepRig rig, set_up(o));
    print_plan(o, tune, rig);
    ZINF_TRY(measure_grid(o, rig));
    return report(o, tune, rig);
}

// The --help summaries of the two commands.
constexpr const char* kTuneSummary =
    "Runs the sweep grid (backends x block sizes x queue depths x threads), writing and\n"
    "reading the bench's own test file at each point, and writes the best configuration\n"
    "as an `aio` JSON block that zinfinity configs accept.\n\n"
    "Rule: the best point has the highest harmonic mean of write and read GB/s, i.e. the\n"
    "rate of writing and reading back the same bytes, as a swap cycle does. Points within\n"
    "1% of it count as equal; among them fewer threads, then a lower queue depth, then a\n"
    "smaller block size win (less memory and CPU). The test file is created exclusively\n"
    "and removed at exit.";
constexpr const char* kSweepSummary =
    "Measures every combination of backends x block sizes x queue depths x threads on the\n"
    "bench's own test file (created exclusively, removed at exit) and prints a table of\n"
    "GB/s (decimal), CPU seconds per GB and p99 op latency, marking the best point (highest\n"
    "harmonic mean of write and read GB/s with both ops, else the op's GB/s).";

int run_command(int argc, char** argv, bool tune) {
    const char* name = tune ? "tune" : "sweep";
    cli::Args args(tune ? "zinfinity-bench tune --path DIR --write-config FILE [flags]"
                        : "zinfinity-bench sweep --path DIR [flags]",
                   tune ? kTuneSummary : kSweepSummary);
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

int run_sweep(int argc, char** argv) {
    return run_command(argc, argv, false);
}
int run_tune(int argc, char** argv) {
    return run_command(argc, argv, true);
}

}  // namespace zinf::bench
