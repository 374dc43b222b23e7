// `zinfinity-bench optimizer`: the NVMe-offloaded optimizer step (swap::OptimizerSwapper)
// against the I/O-bound limit measured in the same run: an I/O-only pass that reads and writes
// the same bytes in the same pattern without the optimizer. Alternates (I/O-only, step) pairs
// and prints medians, with checksum verification on and then off. With --state-dtype bf16 or
// int8 it also runs fp32 states beside them, pair by pair, and prints the speed-up against the
// ratio of bytes per parameter.
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "io/engine.h"
#include "kernels/cpu_features.h"
#include "kernels/optimizer.h"
#include "src/base/aio_backends.h"
#include "src/base/log.h"
#include "src/base/units.h"
#include "swap/optimizer_stack.h"
#include "swap/optimizer_swapper.h"
#include "swap/pinned_pool.h"
#include "swap/swap_store.h"
#include "tools/bench/commands.h"
#include "tools/bench/stats.h"
#include "tools/cli/args.h"

namespace zinf::bench {
namespace {

std::atomic<bool> g_interrupted{false};

void on_interrupt(int) {
    g_interrupted.store(true);
}

struct Options {
    std::uint64_t params = 0;
    std::uint64_t sub_group = 0;
    std::vector<std::string> paths;
    int pairs = 3;
    int pairs_unverified = 2;
    bool grads_bf16 = false;
    bool pipeline_read = true;
    bool pipeline_write = true;
    io::AioOptions aio;
    std::string cpu_isa = "auto";  // as cpu_optimizer.isa
    int cpu_threads = 0;
    StateDType state_dtype = StateDType::kFp32;  // offload_optimizer.state_dtype
};

class BenchParams final : public swap::ParamSource {
public:
    Status fill(std::size_t, std::uint64_t offset, std::span<float> out) override {
        if (g_interrupted.load()) return Status::internal("interrupted");
        for (std::size_t i = 0; i < out.size(); ++i) {
            out[i] = static_cast<float>((offset + i) % 1997) * 1e-3f - 1.0f;
        }
        return Status::ok();
    }
};

// The same gradient buffer for every sub-group: where gradients come from is the caller's
// business; the step reads them once per sub-group like real ones.
class BenchGrads final : public swap::GradientSource {
public:
    BenchGrads(std::uint64_t numel, bool bf16) : bf16_(bf16) {
        if (bf16) {
            g16_.resize(numel);
            for (std::size_t i = 0; i < numel; ++i)
                g16_[i] = static_cast<std::uint16_t>(0x3c00 + i % 251);
        } else {
            g32_.resize(numel);
            for (std::size_t i = 0; i < numel; ++i)
                g32_[i] = static_cast<float>(i % 251) * 1e-4f - 0.0125f;
        }
    }
    Result<kernels::GradView> gradients(std::size_t, std::uint64_t, std::uint64_t numel) override {
        if (g_interrupted.load()) return Status::internal("interrupted");
        if (bf16_)
            return kernels::GradView::bf16(std::span<const std::uint16_t>(g16_.data(), numel));
        return kernels::GradView::fp32(std::span<const float>(g32_.data(), numel));
    }
    std::uint64_t bytes() const { return g16_.size() * 2 + g32_.size() * 4; }

private:
    bool bf16_;
    std::vector<float> g32_;
    std::vector<std::uint16_t> g16_;
};

struct PhaseResult {
    double io_only_s = 0;  // medians
    double step_s = 0;
    double compute_s = 0;
    double checksum_s = 0;  // hashing per step (verify on)
};

// What every phase shares: the I/O engine, the kernel and the NVMe optimizer stack's layout
// and pinned pool (swap/optimizer_stack.h, as the trainer builds them).
struct Stack {
    std::vector<std::string> paths;
    kernels::OptimizerKernel kernel;
    std::unique_ptr<io::Engine> engine;
    swap::OptimizerStackLayout layout;
    std::unique_ptr<swap::PinnedPool> pool;
};

// One phase's store and swapper (checksums on or off). Members are destroyed in reverse order:
// the swapper, then the store, which removes the swap files before the next phase.
struct Phase {
    std::unique_ptr<swap::SwapStore> store;
    std::unique_ptr<swap::OptimizerSwapper> swapper;
};

// Set up a phase: the store and its swapper, committed, and the states initialized (timed).
Result<Phase> set_up_phase(const Stack& stack, bool verify, const char* what = "") {
    Phase ph;
    swap::SwapStoreOptions so;
    so.paths = stack.paths;
    so.verify_checksums = verify;
    so.name = "optimizer";
    ZINF_ASSIGN_OR_RETURN(ph.store, swap::SwapStore::create(*stack.engine, so));
    ZINF_ASSIGN_OR_RETURN(auto swappers, swap::create_optimizer_swappers(
                                             stack.layout, *ph.store, *stack.pool, stack.kernel));
    ph.swapper = std::move(swappers.front());
    ZINF_TRY(ph.store->commit());

    std::printf("\n%schecksums %s (swap.verify_checksums = %s)\n", what, verify ? "on" : "off",
                verify ? "true" : "false");
    BenchParams init;
    const auto t0 = std::chrono::steady_clock::now();
    ZINF_TRY(ph.swapper->initialize(init));
    const double init_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  initialize: wrote %s in %.1f s (%.2f GB/s)\n",
                format_bytes(ph.store->data_bytes()).c_str(), init_s,
                static_cast<double>(ph.store->data_bytes()) / init_s / 1e9);
    std::fflush(stdout);
    return ph;
}

// Seconds of each measured pass, in order.
struct PairTimes {
    std::vector<double> io_s, step_s, compute_s, sum_s;
};

// Measure: one unmeasured step, then `pairs` alternated (I/O-only, step) pairs, each pair's
// line printed as it completes.
Result<PairTimes> measure_pairs(const Options& o, int pairs, Phase& ph, BenchGrads& grads) {
    kernels::OptimizerParams hp;
    hp.kind = kernels::OptimizerKind::kAdamW;
    hp.lr = 1e-4;
    hp.weight_decay = 0.01;
    std::uint64_t step = 0;
    // One unmeasured step: thread pools start, the disk settles after the initial writes.
    hp.step = ++step;
    ZINF_TRY(ph.swapper->step(hp, grads));

    PairTimes t;
    const double moved = 2.0 * static_cast<double>(ph.store->data_bytes());
    for (int pair = 0; pair < pairs; ++pair) {
        if (g_interrupted.load()) return Status::internal("interrupted");
        // Alternate the order within pairs so that drift does not favour one side.
        for (int k = 0; k < 2; ++k) {
            const bool io_first = pair % 2 == 0;
            const bool do_io = (k == 0) == io_first;
            ph.store->reset_stats();
            if (do_io) {
                ZINF_TRY(ph.swapper->io_only_pass());
                t.io_s.push_back(ph.swapper->last_step_stats().seconds);
            } else {
                hp.step = ++step;
                ZINF_TRY(ph.swapper->step(hp, grads));
                const auto& st = ph.swapper->last_step_stats();
                t.step_s.push_back(st.seconds);
                t.compute_s.push_back(st.compute_seconds);
                t.sum_s.push_back(static_cast<double>(ph.store->stats().checksum_ns) * 1e-9);
            }
        }
        const double a = t.io_s.back(), b = t.step_s.back();
        std::printf(
            "  pair %d: I/O-only %6.2f s (%.2f GB/s moved)   step %6.2f s (%.3g params/s, "
            "Adam %.2f s, hashing %.2f s)   step/I-O-only throughput %.3f\n",
            pair + 1, a, moved / a / 1e9, b, static_cast<double>(o.params) / b, t.compute_s.back(),
            t.sum_s.back(), a / b);
        std::fflush(stdout);
    }
    return t;
}

// Report: the phase's medians against the I/O-bound limit.
PhaseResult report_phase(const Options& o, bool verify, int pairs, const Phase& ph,
                         const PairTimes& t) {
    PhaseResult r;
    r.io_only_s = median(t.io_s);
    r.step_s = median(t.step_s);
    r.compute_s = median(t.compute_s);
    r.checksum_s = median(t.sum_s);
    const double limit = static_cast<double>(o.params) / r.io_only_s;
    const double achieved = static_cast<double>(o.params) / r.step_s;
    std::printf(
        "  median of %d pairs: step %.2f s = %.3g params/s; I/O-bound limit %.2f s = %.3g "
        "params/s; ratio %.3f (target >= 0.90: %s)\n",
        pairs, r.step_s, achieved, r.io_only_s, limit, achieved / limit,
        achieved / limit >= 0.9 ? "met" : "NOT met");
    std::printf("  Adam compute per step %.2f s (%.3g params/s), hidden under %.2f s of I/O\n",
                r.compute_s, static_cast<double>(o.params) / r.compute_s, r.io_only_s);
    if (verify) {
        std::printf("  checksum hashing per step %.2f s (XXH3 over %s out and in)\n", r.checksum_s,
                    format_bytes(2 * ph.store->data_bytes()).c_str());
    }
    return r;
}

// One store (checksums on or off): initialize the states, then alternate (I/O-only, step) pairs.
Result<PhaseResult> run_phase(const Options& o, bool verify, int pairs, const Stack& stack,
                              BenchGrads& grads) {
    ZINF_ASSIGN_OR_RETURN(Phase phase, set_up_phase(stack, verify));
    ZINF_ASSIGN_OR_RETURN(const PairTimes times, measure_pairs(o, pairs, phase, grads));
    return report_phase(o, verify, pairs, phase, times);
}

// The engine, the kernel and the stack's pool, as swap/optimizer_stack.h lays them out for one
// group of o.params elements.
Result<Stack> set_up_stack(const Options& o, StateDType dtype) {
    ZINF_ASSIGN_OR_RETURN(kernels::OptimizerKernel kernel,
                          kernels::OptimizerKernel::create(o.cpu_isa, o.cpu_threads));
    io::EngineOptions eo;
    eo.aio = o.aio;
    ZINF_ASSIGN_OR_RETURN(auto engine, io::Engine::create(eo));
    swap::OptimizerStackOptions so;
    so.group_numels = {o.params};
    so.sub_group_numel = o.sub_group;
    so.kind = OptimizerKind::kAdamW;
    so.pipeline_read = o.pipeline_read;
    so.pipeline_write = o.pipeline_write;
    so.pool_name = "optimizer";
    so.state_dtype = dtype;
    so.rounding_seed = 1234;
    ZINF_ASSIGN_OR_RETURN(swap::OptimizerStackLayout layout, swap::layout_optimizer_stack(so));
    ZINF_ASSIGN_OR_RETURN(auto pool, swap::create_optimizer_pool(layout, *engine, nullptr,
                                                                 /*register_with_device=*/false));
    return Stack{o.paths, std::move(kernel), std::move(engine), std::move(layout), std::move(pool)};
}

// Bytes per parameter on disk: the fp32 master and AdamW's two moments as stored.
double bytes_per_param(StateDType dtype, std::uint64_t sub_group) {
    double b = 0;
    for (std::size_t k = 0; k < 3; ++k) {
        b += static_cast<double>(swap::OptimizerSwapper::state_bytes(k, sub_group, dtype));
    }
    return b / static_cast<double>(sub_group);
}

// --state-dtype bf16|int8: fp32 states and compressed ones, each in its own store, measured in
// the same pairs (the order rotating pair by pair, and I/O-only before or after the step),
// checksums on. Prints each against its I/O-only pass and the compressed step's speed-up
// against the ratio of bytes per parameter.
Status run_compare(const Options& o, BenchGrads& grads) {
    const StateDType dtypes[2] = {StateDType::kFp32, o.state_dtype};
    // The compressed store in its own directory under each path (a swap directory holds one
    // run), made here and removed at the end, after the stores below.
    struct SubDirs {
        std::vector<std::string> made;
        ~SubDirs() {
            std::error_code ec;
            for (const auto& d : made) {
                // What a swap directory keeps after its run: the lock file.
                std::filesystem::remove(std::filesystem::path(d) / "zinfinity-swap.lock", ec);
                std::filesystem::remove(d, ec);
            }
        }
    } sub_dirs;
    std::vector<Stack> stacks;
    std::vector<Phase> phases;
    for (const StateDType d : dtypes) {
        ZINF_ASSIGN_OR_RETURN(Stack stack, set_up_stack(o, d));
        if (d != StateDType::kFp32) {
            for (auto& p : stack.paths) {
                p = (std::filesystem::path(p) / str_cat("zinf-bench-", state_dtype_name(d)))
                        .string();
                std::error_code ec;
                if (std::filesystem::create_directory(p, ec)) sub_dirs.made.push_back(p);
                if (ec)
                    return Status::io_error(str_cat("creating ", p, ": ", ec.message()),
                                            ec.value());
            }
        }
        stacks.push_back(std::move(stack));
    }
    for (std::size_t i = 0; i < 2; ++i) {
        const std::string what = str_cat(state_dtype_name(dtypes[i]), " states: ");
        ZINF_ASSIGN_OR_RETURN(Phase ph, set_up_phase(stacks[i], true, what.c_str()));
        phases.push_back(std::move(ph));
    }
    kernels::OptimizerParams hp;
    hp.kind = kernels::OptimizerKind::kAdamW;
    hp.lr = 1e-4;
    hp.weight_decay = 0.01;
    std::uint64_t steps[2] = {0, 0};
    for (std::size_t i = 0; i < 2; ++i) {  // unmeasured: pools and the disk settle
        hp.step = ++steps[i];
        ZINF_TRY(phases[i].swapper->step(hp, grads));
    }
    PairTimes t[2];
    std::printf("\nalternated pairs (fp32 and %s states, checksums on):\n",
                std::string(state_dtype_name(o.state_dtype)).c_str());
    for (int pair = 0; pair < o.pairs; ++pair) {
        for (int j = 0; j < 2; ++j) {
            if (g_interrupted.load()) return Status::internal("interrupted");
            const std::size_t i = static_cast<std::size_t>((pair + j) % 2);
            Phase& ph = phases[i];
            for (int k = 0; k < 2; ++k) {
                const bool do_io = (k == 0) == (pair % 2 == 0);
                ph.store->reset_stats();
                if (do_io) {
                    ZINF_TRY(ph.swapper->io_only_pass());
                    t[i].io_s.push_back(ph.swapper->last_step_stats().seconds);
                } else {
                    hp.step = ++steps[i];
                    ZINF_TRY(ph.swapper->step(hp, grads));
                    const auto& st = ph.swapper->last_step_stats();
                    t[i].step_s.push_back(st.seconds);
                    t[i].compute_s.push_back(st.compute_seconds);
                    t[i].sum_s.push_back(static_cast<double>(ph.store->stats().checksum_ns) * 1e-9);
                }
            }
        }
        std::printf(
            "  pair %d: fp32 step %.2f s (I/O-only %.2f s)   %s step %.2f s (I/O-only %.2f "
            "s)   speed-up %.3f\n",
            pair + 1, t[0].step_s.back(), t[0].io_s.back(),
            std::string(state_dtype_name(o.state_dtype)).c_str(), t[1].step_s.back(),
            t[1].io_s.back(), t[0].step_s.back() / t[1].step_s.back());
        std::fflush(stdout);
    }
    PhaseResult r[2];
    for (std::size_t i = 0; i < 2; ++i) {
        std::printf("\n%s states (%.3f B per parameter on disk):\n",
                    std::string(state_dtype_name(dtypes[i])).c_str(),
                    bytes_per_param(dtypes[i], o.sub_group));
        r[i] = report_phase(o, true, o.pairs, phases[i], t[i]);
    }
    std::vector<double> speedups;
    speedups.reserve(static_cast<std::size_t>(o.pairs));
    for (int pair = 0; pair < o.pairs; ++pair) {
        speedups.push_back(t[0].step_s[static_cast<std::size_t>(pair)] /
                           t[1].step_s[static_cast<std::size_t>(pair)]);
    }
    const double ceiling = bytes_per_param(StateDType::kFp32, o.sub_group) /
                           bytes_per_param(o.state_dtype, o.sub_group);
    const double speedup = median(speedups);
    const bool fp32_io_bound = r[0].compute_s < 0.5 * r[0].io_only_s;
    std::printf(
        "\n%s vs fp32 states: step speed-up %.3f (median of per-pair ratios); byte-ratio ceiling "
        "%.3f; %.3f of the ceiling (target >= 0.90: %s)%s\n",
        std::string(state_dtype_name(o.state_dtype)).c_str(), speedup, ceiling, speedup / ceiling,
        speedup / ceiling >= 0.9 ? "met" : "NOT met",
        fp32_io_bound ? "" : "; the fp32 step is not I/O-bound here (Adam over half its I/O time)");
    std::printf("%s step vs its own I/O-only pass: %.3f (target >= 0.90: %s)\n",
                std::string(state_dtype_name(o.state_dtype)).c_str(), r[1].io_only_s / r[1].step_s,
                r[1].io_only_s / r[1].step_s >= 0.9 ? "met" : "NOT met");
    return Status::ok();
}

Status run(const Options& o) {
    if (o.state_dtype != StateDType::kFp32) {
        BenchGrads grads(o.sub_group, o.grads_bf16);
        std::printf(
            "zinfinity-bench optimizer: %.3g parameters, AdamW, %s gradients, fp32 and %s "
            "states, sub-groups of %.3g parameters in %zu path(s): %s%s\n",
            static_cast<double>(o.params), o.grads_bf16 ? "bf16" : "fp32",
            std::string(state_dtype_name(o.state_dtype)).c_str(), static_cast<double>(o.sub_group),
            o.paths.size(), o.paths.front().c_str(), o.paths.size() > 1 ? " ..." : "");
        return run_compare(o, grads);
    }
    ZINF_ASSIGN_OR_RETURN(Stack stack, set_up_stack(o, StateDType::kFp32));
    const kernels::OptimizerKernel& kernel = stack.kernel;
    const io::Engine* engine = stack.engine.get();
    const swap::PinnedPool* pool = stack.pool.get();
    BenchGrads grads(o.sub_group, o.grads_bf16);

    const std::uint64_t groups = (o.params + o.sub_group - 1) / o.sub_group;
    std::printf("zinfinity-bench optimizer: %.3g parameters, AdamW, %s gradients\n",
                static_cast<double>(o.params), o.grads_bf16 ? "bf16" : "fp32");
    std::printf(
        "  sub-group size %.3g parameters (%llu sub-groups); states on disk %s (12 B/param: "
        "fp32 params, exp_avg, exp_avg_sq) in %zu path(s): %s%s\n",
        static_cast<double>(o.sub_group), static_cast<unsigned long long>(groups),
        format_bytes(12 * o.params).c_str(), o.paths.size(), o.paths.front().c_str(),
        o.paths.size() > 1 ? " ..." : "");
    std::printf(
        "  pinned memory: %zu buffers x %s = %s (pipeline_read %s, pipeline_write %s), NUMA "
        "node %d, %s; gradient buffer %s (reused for every sub-group)\n",
        pool->buffer_count(), format_bytes(pool->buffer_size_bytes()).c_str(),
        format_bytes(pool->total_bytes()).c_str(), o.pipeline_read ? "on" : "off",
        o.pipeline_write ? "on" : "off", pool->numa_node(),
        pool->is_locked() ? "locked" : "NOT locked", format_bytes(grads.bytes()).c_str());
    std::printf(
        "  aio: %s, block %s, queue depth %d, %d thread(s), O_DIRECT %s; optimizer kernel %s, "
        "%d thread(s)\n",
        std::string(engine->backend_name()).c_str(), format_bytes(o.aio.block_size_bytes).c_str(),
        o.aio.queue_depth, o.aio.intra_op_parallelism,
        o.aio.use_direct == io::DirectMode::kOff ? "off" : "auto",
        std::string(kernels::isa_name(kernel.isa())).c_str(), kernel.threads());
    std::fflush(stdout);

    ZINF_ASSIGN_OR_RETURN(const PhaseResult on, run_phase(o, true, o.pairs, stack, grads));
    if (o.pairs_unverified > 0) {
        ZINF_ASSIGN_OR_RETURN(const PhaseResult off,
                              run_phase(o, false, o.pairs_unverified, stack, grads));
        std::printf(
            "\nchecksum cost: step %.2f s with verification, %.2f s without (%+.1f %%); "
            "I/O-only %.2f s vs %.2f s (%+.1f %%); hashing %.2f s per step on the step thread\n",
            on.step_s, off.step_s, (on.step_s / off.step_s - 1) * 100, on.io_only_s, off.io_only_s,
            (on.io_only_s / off.io_only_s - 1) * 100, on.checksum_s);
    }
    return Status::ok();
}

void declare_flags(cli::Args& args) {
    args.add("params", "2G", "parameters (counts: 2G = 2e9, 1e8, 256M)");
    args.add("offload", "nvme", "where the optimizer states live: nvme (the only choice here)");
    args.add("sub-group-size", "1e8",
             "parameters per sub-group (zero_optimization.sub_group_size)");
    args.add_list("path", "swap directory (nvme_path); repeat to stripe over several");
    args.add("pairs", "3", "alternating (I/O-only, step) pairs with checksums on");
    args.add("pairs-unverified", "2", "pairs with checksums off (0: skip that phase)");
    args.add("grad-dtype", "fp32", "gradient dtype: fp32 or bf16");
    args.add("pipeline-read", "on", "offload_optimizer.pipeline_read");
    args.add("pipeline-write", "on", "offload_optimizer.pipeline_write");
    args.add("backend", "auto", "aio backend: " + aio_backend_list(/*with_auto=*/true));
    args.add("block-size", "8MiB", "aio.block_size: bytes per I/O piece");
    args.add("queue-depth", "16", "aio.queue_depth per I/O thread");
    args.add("threads", "1", "aio.thread_count: I/O threads (each with its own ring)");
    args.add("isa", "auto", "CPU optimizer variant: auto, avx512, avx2, scalar");
    args.add("cpu-threads", "0", "CPU optimizer threads (0: all cores)");
    args.add("state-dtype", "fp32",
             "offload_optimizer.state_dtype: fp32; bf16 or int8 also run fp32 states in the same "
             "pairs and print the speed-up against the byte ratio (checksums on; sub-group size "
             "rounded up to a multiple of 2048)");
}

// Parse: the flags in the order they are checked; the first bad one is the error.
Result<Options> parse_options(const cli::Args& args) {
    Options o;
    ZINF_ASSIGN_OR_RETURN(const std::uint64_t params, args.get_count("params"));
    ZINF_ASSIGN_OR_RETURN(const std::uint64_t sub_group, args.get_count("sub-group-size"));
    o.params = params;
    o.sub_group = std::min(sub_group, params);
    if (o.params == 0 || o.sub_group == 0) {
        return Status::invalid_argument("--params and --sub-group-size must be positive");
    }
    ZINF_TRY(args.get_choice("offload", {"nvme"}).status());
    o.paths = args.get_list("path");
    if (o.paths.empty()) return Status::invalid_argument("--path DIR is required");
    ZINF_ASSIGN_OR_RETURN(const std::int64_t pairs, args.get_int("pairs", 1, 100));
    ZINF_ASSIGN_OR_RETURN(const std::int64_t pairs_off, args.get_int("pairs-unverified", 0, 100));
    o.pairs = static_cast<int>(pairs);
    o.pairs_unverified = static_cast<int>(pairs_off);
    ZINF_ASSIGN_OR_RETURN(const std::string dtype, args.get_choice("grad-dtype", {"fp32", "bf16"}));
    o.grads_bf16 = dtype == "bf16";
    ZINF_ASSIGN_OR_RETURN(o.pipeline_read, args.get_bool("pipeline-read"));
    ZINF_ASSIGN_OR_RETURN(o.pipeline_write, args.get_bool("pipeline-write"));
    ZINF_ASSIGN_OR_RETURN(o.aio.backend,
                          args.get_choice("backend", aio_backend_names(/*with_auto=*/true)));
    ZINF_ASSIGN_OR_RETURN(o.aio.block_size_bytes, args.get_size_bytes("block-size"));
    ZINF_ASSIGN_OR_RETURN(const std::int64_t depth, args.get_int("queue-depth", 1, 4096));
    ZINF_ASSIGN_OR_RETURN(const std::int64_t threads, args.get_int("threads", 1, 64));
    ZINF_ASSIGN_OR_RETURN(o.cpu_isa, args.get_choice("isa", {"auto", "avx512", "avx2", "scalar"}));
    ZINF_ASSIGN_OR_RETURN(const std::int64_t cpu_threads, args.get_int("cpu-threads", 0, 1024));
    o.aio.queue_depth = static_cast<int>(depth);
    o.aio.intra_op_parallelism = static_cast<int>(threads);
    o.cpu_threads = static_cast<int>(cpu_threads);
    ZINF_ASSIGN_OR_RETURN(const std::string state_dtype,
                          args.get_choice("state-dtype", {"fp32", "bf16", "int8"}));
    o.state_dtype = *find_state_dtype(state_dtype);
    if (o.state_dtype != StateDType::kFp32) {
        o.sub_group = align_up(o.sub_group, kStateBlockNumel);
    }
    return o;
}

}  // namespace

int run_optimizer(int argc, char** argv) {
    cli::Args args(
        "zinfinity-bench optimizer --path DIR [--path DIR2 ...] [flags]",
        "Runs the NVMe-offloaded optimizer step (AdamW over fp32 master parameters and\n"
        "states streamed through pinned buffers by sub-group: read i+1, update i, write\n"
        "i-1) and compares it with its I/O-bound limit, measured in the same run as an\n"
        "I/O-only pass that reads and writes the same bytes in the same pattern without\n"
        "the optimizer. Alternates (I/O-only, step) pairs, prints each and the medians,\n"
        "first with swap checksums verified, then without (the checksum cost). The swap\n"
        "files live in a locked per-run directory under each --path (12 B per parameter,\n"
        "free space is checked first) and are removed at exit, also on Ctrl-C.");
    declare_flags(args);
    constexpr std::string_view kProgram = "zinfinity-bench optimizer";
    if (auto exit_code = args.parse_or_exit(argc, argv, kProgram)) return *exit_code;
    auto options = parse_options(args);
    if (!options.has_value()) return cli::report_error(kProgram, options.error(), 2);
    std::signal(SIGINT, on_interrupt);
    std::signal(SIGTERM, on_interrupt);
    const Status s = run(*options);
    if (!s.is_ok()) return cli::report_error(kProgram, s, g_interrupted.load() ? 130 : 1);
    return 0;
}

}  // namespace zinf::bench
