// `zinfinity-bench profile`: the machine profile zinfinity-plan predicts step times from
// (engine::MachineProfile, src/engine/step_prediction.h). It measures the primitives a training
// step is made of, on this machine, with the engine's own code: the I/O engine's read and write
// GB/s over a grid of block sizes and queue depths on --path; the CPU device's GEMM FLOP/s over a
// grid of shapes; every built-in optimizer's in-memory step (parameters per second) for each
// state dtype; and the memory copy bandwidth. Writes JSON to --out.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/chunk_loop.h"
#include "kernels/optimizer.h"
#include "src/base/aligned.h"
#include "src/base/log.h"
#include "src/base/optimizer_descriptor.h"
#include "src/base/state_dtype.h"
#include "src/base/units.h"
#include "src/device/cpu_compute.h"
#include "src/engine/step_prediction.h"
#include "tools/bench/commands.h"
#include "tools/bench/io_command_support.h"
#include "tools/bench/io_runner.h"
#include "tools/bench/stats.h"
#include "tools/cli/args.h"

namespace zinf::bench {
namespace {

using Clock = std::chrono::steady_clock;
using engine::MachineProfile;

constexpr std::string_view kProgram = "zinfinity-bench profile";

struct ProfileOptions {
    std::string path;
    std::string out;
    int threads = 0;
    std::uint64_t io_size_bytes = 0;
    std::vector<std::uint64_t> block_sizes;
    std::vector<std::uint64_t> queue_depths;
    std::string backend = "auto";
    std::uint64_t optimizer_numel = 0;
    double min_seconds = 0.05;  // each GEMM / copy / optimizer figure times at least this long
    bool quick = false;
};

// Median over three timed rounds of `body` repeated until min_seconds have passed; returns the
// seconds of one call. The first call (page faults, thread start) is not timed.
template <typename Body>
Result<double> time_call(double min_seconds, const Body& body) {
    ZINF_TRY(body());
    std::vector<double> per_call;
    for (int round = 0; round < 3; ++round) {
        int calls = 0;
        const auto start = Clock::now();
        do {
            ZINF_TRY(body());
            ++calls;
        } while (seconds_since(start) < min_seconds);
        per_call.push_back(seconds_since(start) / calls);
    }
    return median(per_call);
}

Status measure_io(const ProfileOptions& o, MachineProfile& p) {
    ZINF_ASSIGN_OR_RETURN(auto files, BenchFiles::create({o.path}, o.io_size_bytes));
    p.io_path = o.path;
    for (const std::uint64_t block : o.block_sizes) {
        for (const std::uint64_t depth : o.queue_depths) {
            SessionOptions so;
            so.aio.backend = o.backend;
            so.aio.block_size_bytes = block;
            so.aio.queue_depth = static_cast<int>(depth);
            so.show_progress = false;
            ZINF_ASSIGN_OR_RETURN(auto session, IoSession::create(*files, so));
            p.io_backend = std::string(session->backend_name());
            MachineProfile::Io point;
            point.block_size_bytes = block;
            point.queue_depth = static_cast<int>(depth);
            auto w = session->run_pass(IoOp::kWrite);
            if (!w.has_value()) return w.error().with_context(str_cat("write, block ", block));
            ZINF_TRY(session->prepare_for_read());
            auto r = session->run_pass(IoOp::kRead);
            if (!r.has_value()) return r.error().with_context(str_cat("read, block ", block));
            point.write_gb_per_s = w->gb_per_s;
            point.read_gb_per_s = r->gb_per_s;
            std::printf(
                "  io %-9s block %-9s queue depth %-3llu read %6.2f GB/s, write %6.2f GB/s\n",
                p.io_backend.c_str(), format_bytes(block).c_str(),
                static_cast<unsigned long long>(depth), point.read_gb_per_s, point.write_gb_per_s);
            std::fflush(stdout);
            p.io.push_back(point);
            if (interrupted()) return interrupted_status();
        }
    }
    return Status::ok();
}

// The GEMM as the models call it: y = x w^T (forward), dw = dy^T x and dx = dy w (backward),
// one call each per round, so the figure is the mix a training step runs.
Status measure_gemm(const ProfileOptions& o, MachineProfile& p) {
    device::CpuComputeOptions co;
    co.threads = o.threads;
    ZINF_ASSIGN_OR_RETURN(auto compute, device::CpuCompute::create(nullptr, co));
    std::vector<std::array<std::uint64_t, 3>> shapes;
    const std::vector<std::uint64_t> small = o.quick
                                                 ? std::vector<std::uint64_t>{16, 256}
                                                 : std::vector<std::uint64_t>{16, 64, 256, 1024};
    const std::vector<std::uint64_t> large =
        o.quick ? std::vector<std::uint64_t>{512} : std::vector<std::uint64_t>{128, 512, 2048};
    for (const auto s : small) {
        for (const auto l : large) {
            if (s <= l) shapes.push_back({s, l, l});
        }
    }
    for (const std::uint64_t c :
         o.quick ? std::vector<std::uint64_t>{64} : std::vector<std::uint64_t>{32, 128, 256}) {
        shapes.push_back({c, c, c});
    }
    for (const auto& shape : shapes) {
        const std::uint64_t m = shape[0], n = shape[1], k = shape[2];
        std::vector<float> a(m * k, 0.5f), b(n * k, 0.25f), c(m * n, 0.0f), da(m * k), db(n * k);
        auto round = [&]() -> Status {
            // c (m x n) = a (m x k) b^T; db (n x k) = c^T a; da (m x k) = c b.
            ZINF_TRY(compute->gemm(Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, a.data(), k,
                                   b.data(), k, 0.0f, c.data(), n, 0));
            ZINF_TRY(compute->gemm(Transpose::kYes, Transpose::kNo, n, k, m, 1.0f, c.data(), n,
                                   a.data(), k, 0.0f, db.data(), k, 0));
            return compute->gemm(Transpose::kNo, Transpose::kNo, m, k, n, 1.0f, c.data(), n,
                                 b.data(), k, 0.0f, da.data(), k, 0);
        };
        ZINF_ASSIGN_OR_RETURN(const double s, time_call(o.min_seconds, round));
        MachineProfile::Gemm g{m, n, k, 3.0 * 2.0 * double(m) * double(n) * double(k) / s / 1e9};
        std::printf("  gemm %5llu x %5llu x %5llu  %7.1f GFLOP/s\n",
                    static_cast<unsigned long long>(m), static_cast<unsigned long long>(n),
                    static_cast<unsigned long long>(k), g.gflop_per_s);
        p.gemm.push_back(g);
    }
    return Status::ok();
}

Status measure_copy(const ProfileOptions& o, const kernels::ChunkLoop& loop, MachineProfile& p) {
    const std::size_t bytes = o.quick ? (32u << 20) : (256u << 20);
    ZINF_ASSIGN_OR_RETURN(AlignedBuffer src, AlignedBuffer::allocate(bytes, 4096));
    ZINF_ASSIGN_OR_RETURN(AlignedBuffer dst, AlignedBuffer::allocate(bytes, 4096));
    std::memset(src.data(), 1, bytes);
    std::memset(dst.data(), 0, bytes);
    constexpr std::size_t kPiece = 1u << 20;
    auto copy = [&]() -> Status {
        loop.run(bytes / kPiece, [&](std::size_t i) {
            std::memcpy(dst.data() + i * kPiece, src.data() + i * kPiece, kPiece);
        });
        return Status::ok();
    };
    ZINF_ASSIGN_OR_RETURN(const double s, time_call(o.min_seconds, copy));
    p.memory_copy_gb_per_s = 2.0 * double(bytes) / s / 1e9;
    std::printf("  memory copy %.1f GB/s (read + written, %d threads)\n", p.memory_copy_gb_per_s,
                loop.threads());
    return Status::ok();
}

// Every built-in optimizer's CPU step for each state dtype it takes, in memory.
Status measure_optimizers(const ProfileOptions& o, MachineProfile& p) {
    ZINF_ASSIGN_OR_RETURN(auto kernel, kernels::OptimizerKernel::create("auto", o.threads));
    const std::size_t n = o.optimizer_numel;
    ZINF_ASSIGN_OR_RETURN(AlignedBuffer params, AlignedBuffer::allocate(n * 4, 4096));
    ZINF_ASSIGN_OR_RETURN(AlignedBuffer grads, AlignedBuffer::allocate(n * 4, 4096));
    std::vector<AlignedBuffer> moments;
    std::vector<std::vector<float>> scales;
    for (std::size_t m = 0; m < kMaxMoments; ++m) {
        ZINF_ASSIGN_OR_RETURN(AlignedBuffer b, AlignedBuffer::allocate(n * 4, 4096));
        moments.push_back(std::move(b));
        scales.emplace_back(state_scale_count(StateDType::kInt8, n), 0.0f);
    }
    for (const OptimizerDescriptor* d : registered_optimizers()) {
        if (!is_builtin(*d)) continue;
        for (const StateDType dtype : {StateDType::kFp32, StateDType::kBf16, StateDType::kInt8}) {
            float* pw = params.as<float>();
            float* gw = grads.as<float>();
            for (std::size_t i = 0; i < n; ++i) {
                pw[i] = 0.01f * static_cast<float>(i % 97);
                gw[i] = 1e-3f * static_cast<float>(i % 89) - 0.04f;
            }
            kernels::StoredState state;
            state.params = {pw, n};
            state.dtype = dtype;
            state.rounding_seed = 1;
            const std::size_t kept = d->kept_moment_count(false);
            for (std::size_t m = 0; m < kept; ++m) {
                std::memset(moments[m].data(), 0, n * state_element_size_bytes(dtype));
                state.moments[m] = {moments[m].data(), n * state_element_size_bytes(dtype)};
                if (dtype == StateDType::kInt8) {
                    std::fill(scales[m].begin(), scales[m].end(), 0.0f);
                    state.scales[m] = {scales[m].data(), scales[m].size()};
                }
            }
            kernels::OptimizerParams hp;
            hp.kind = d->kind;
            hp.beta1 = d->default_beta1;
            hp.beta2 = d->default_beta2;
            hp.weight_decay = 0.01;
            const kernels::GradView g = kernels::GradView::fp32({gw, n});
            auto step = [&]() -> Status {
                Status result = kernel.step(hp, state, g, kernels::ParamCopy::none());
                ++hp.step;
                return result;
            };
            auto s = time_call(o.min_seconds, step);
            if (!s.has_value()) {
                // A state dtype the optimizer does not take (its moments' kind) is not a figure.
                if (s.error().code() == StatusCode::kInvalidArgument ||
                    s.error().code() == StatusCode::kNotSupported) {
                    continue;
                }
                return s.error().with_context(str_cat(d->name, " ", state_dtype_name(dtype)));
            }
            MachineProfile::Optimizer fig{std::string(d->name),
                                          std::string(state_dtype_name(dtype)), double(n) / *s};
            std::printf("  optimizer %-8s %-5s %7.1f M params/s\n", fig.type.c_str(),
                        fig.state_dtype.c_str(), fig.params_per_s / 1e6);
            p.optimizer.push_back(fig);
        }
    }
    return Status::ok();
}

std::string machine_name(int threads) {
    std::string model;
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; std::getline(cpuinfo, line);) {
        if (line.rfind("model name", 0) == 0) {
            const auto colon = line.find(':');
            if (colon != std::string::npos) model = line.substr(colon + 2);
            break;
        }
    }
    return str_cat(model.empty() ? "unknown CPU" : model, ", ", std::thread::hardware_concurrency(),
                   " hardware threads, ", threads, " used");
}

Status run(const ProfileOptions& o) {
    MachineProfile p;
    ZINF_ASSIGN_OR_RETURN(auto loop, kernels::ChunkLoop::create(o.threads));
    p.threads = loop.threads();
    p.machine = machine_name(p.threads);
    std::printf("%s: %s\n", std::string(kProgram).c_str(), p.machine.c_str());
    ZINF_TRY(measure_copy(o, loop, p));
    ZINF_TRY(measure_gemm(o, p));
    ZINF_TRY(measure_optimizers(o, p));
    ZINF_TRY(measure_io(o, p));
    ZINF_TRY(engine::save_profile(p, o.out));
    std::printf("wrote %s (zinfinity-plan --config FILE --profile %s)\n", o.out.c_str(),
                o.out.c_str());
    return Status::ok();
}

Result<ProfileOptions> parse_options(const cli::Args& args) {
    ProfileOptions o;
    o.path = args.get("path");
    if (o.path.empty())
        return Status::invalid_argument("--path DIR is required (the NVMe to profile)");
    o.out = args.get("out");
    if (o.out.empty()) return Status::invalid_argument("--out FILE is required");
    ZINF_ASSIGN_OR_RETURN(const std::int64_t threads, args.get_int("threads", 0, 1024));
    o.threads = static_cast<int>(threads);
    o.quick = args.get_switch("quick");
    ZINF_ASSIGN_OR_RETURN(o.io_size_bytes, args.get_size_bytes("size"));
    ZINF_ASSIGN_OR_RETURN(o.block_sizes, args.get_size_list("block-sizes"));
    ZINF_ASSIGN_OR_RETURN(o.queue_depths, args.get_int_list("queue-depths"));
    o.backend = args.get("backend");
    if (o.quick) {
        o.io_size_bytes = std::min<std::uint64_t>(o.io_size_bytes, 32u << 20);
        o.min_seconds = 0.005;
        o.optimizer_numel = 1u << 18;
    } else {
        o.optimizer_numel = 16u << 20;
    }
    for (const std::uint64_t b : o.block_sizes) {
        if (b == 0 || b % 4096 != 0 || b > o.io_size_bytes) {
            return Status::invalid_argument(
                str_cat("--block-sizes: ", b, " is not a positive multiple of 4096 up to --size"));
        }
    }
    for (const std::uint64_t q : o.queue_depths) {
        if (q == 0 || q > 4096) {
            return Status::invalid_argument(str_cat("--queue-depths: ", q, " is not in [1, 4096]"));
        }
    }
    return o;
}

}  // namespace

int run_profile(int argc, char** argv) {
    cli::Args args(
        "zinfinity-bench profile --path DIR --out FILE [flags]",
        "Measures what a training step is made of on this machine, with the engine's own\n"
        "code, and writes it as a machine profile (JSON) that zinfinity-plan --profile\n"
        "predicts step times from: the I/O engine's read and write GB/s on DIR over a grid\n"
        "of block sizes and queue depths (one I/O thread), the CPU device's GEMM FLOP/s over\n"
        "a grid of shapes (forward and both backward products), every built-in optimizer's\n"
        "in-memory step for each state dtype, and the memory copy bandwidth. Takes about\n"
        "half a minute; the test file (--size) is removed at exit, also on Ctrl-C.");
    args.add("path", "", "directory on the storage to profile (as offload nvme_path)");
    args.add("out", "", "where to write the profile (JSON; written whole, then renamed)");
    args.add("threads", "0", "compute and optimizer threads (0: every core)");
    args.add("size", "512MiB", "bytes of the I/O test file");
    args.add("block-sizes", "256KiB,1MiB,4MiB", "aio block sizes measured");
    args.add("queue-depths", "8,32", "aio queue depths measured");
    args.add("backend", "auto", "aio backend: auto, io_uring, libaio, posix");
    args.add_switch("quick", "small sizes and short timings (tests; figures are rough)");
    if (auto exit_code = args.parse_or_exit(argc, argv, kProgram)) return *exit_code;
    auto options = parse_options(args);
    if (!options.has_value()) return cli::report_error(kProgram, options.error(), 2);
    install_interrupt_handler();
    // The engine's set-up logs; the figures are the output.
    log::set_level(log::Level::kWarning);
    const Status s = run(*options);
    if (!s.is_ok()) return cli::report_error(kProgram, s, interrupted() ? 130 : 1);
    return 0;
}

}  // namespace zinf::bench
