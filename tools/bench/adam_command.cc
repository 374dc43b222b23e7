// `zinfinity-bench adam`: CPU optimizer step throughput (parameters/s, GB/s) against the
// memory-bandwidth bound measured in the same run by a kernel with the step's own memory pattern
// (tools/bench/adam_bound.h), in interleaved pairs, with the scalar variant's figure beside.
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cast.h"
#include "kernels/chunk_loop.h"
#include "kernels/cpu_features.h"
#include "kernels/optimizer.h"
#include "src/base/aligned.h"
#include "src/base/log.h"
#include "tools/bench/adam_bound.h"
#include "tools/bench/commands.h"
#include "tools/bench/stats.h"
#include "tools/cli/args.h"

namespace zinf::bench {
namespace {

using kernels::Isa;
using kernels::OptimizerKind;

struct AdamOptions {
    std::uint64_t params_numel = 256'000'000;
    OptimizerKind kind = OptimizerKind::kAdamW;
    DType grad_dtype = DType::kFloat32;
    std::string variant = "auto";
    int threads = 2;
    int pairs = 5;
    bool bf16_copy = false;
    bool torch_rounding = false;
    bool with_scalar = true;
    double min_ratio = 0.0;
};

void declare_flags(cli::Args& args) {
    args.add("params", "256M", "parameters per step (256M = 256e6; 64Mi = 64 * 2^20)");
    args.add("optimizer", "adamw", "adamw, adam, adagrad or lion");
    args.add("grad-dtype", "fp32", "gradient dtype: fp32, bf16 or fp16");
    args.add("variant", "auto",
             "auto, avx512, avx2 or scalar. auto takes ZINF_CPU_ISA when set, else the\n"
             "best this CPU has; naming a variant the CPU lacks is an error");
    args.add("threads", "2", "threads of the step and of the bound (0: all cores)");
    args.add("pairs", "5", "interleaved (bound, kernel) pairs; the order flips every pair");
    args.add_switch("bf16-copy", "also write a bf16 copy of the new parameters (+2 B/param)");
    args.add_switch(
        "torch-rounding",
        "Adam/AdamW in torch.optim's operation order (OptimizerParams::torch_rounding)");
    args.add_switch("no-scalar", "skip the scalar variant's run in each pair");
    args.add("min-ratio", "0",
             "exit with status 1 when the median kernel/bound ratio is below this\n"
             "(0: report only)");
}

Result<AdamOptions> parse_options(const cli::Args& args) {
    AdamOptions o;
    ZINF_ASSIGN_OR_RETURN(o.params_numel, args.get_count("params"));
    if (o.params_numel == 0) return Status::invalid_argument("--params: expected at least 1");
    ZINF_ASSIGN_OR_RETURN(const std::string kind,
                          args.get_choice("optimizer", {"adamw", "adam", "adagrad", "lion"}));
    for (const OptimizerKind k : {OptimizerKind::kAdam, OptimizerKind::kAdamW,
                                  OptimizerKind::kAdagrad, OptimizerKind::kLion}) {
        if (optimizer_kind_name(k) == kind) o.kind = k;
    }
    ZINF_ASSIGN_OR_RETURN(const std::string dtype,
                          args.get_choice("grad-dtype", {"fp32", "bf16", "fp16"}));
    o.grad_dtype = dtype == "fp32" ? DType::kFloat32 : dtype == "bf16" ? DType::kBFloat16 : DType::kFloat16;
    ZINF_ASSIGN_OR_RETURN(o.variant,
                          args.get_choice("variant", {"auto", "avx512", "avx2", "scalar"}));
    ZINF_ASSIGN_OR_RETURN(const std::int64_t threads, args.get_int("threads", 0, 4096));
    o.threads = static_cast<int>(threads);
    ZINF_ASSIGN_OR_RETURN(const std::int64_t pairs, args.get_int("pairs", 1, 1000));
    o.pairs = static_cast<int>(pairs);
    o.bf16_copy = args.get_switch("bf16-copy");
    o.torch_rounding = args.get_switch("torch-rounding");
    if (o.torch_rounding && o.kind != OptimizerKind::kAdam && o.kind != OptimizerKind::kAdamW) {
        return Status::invalid_argument("--torch-rounding: only with --optimizer adam or adamw");
    }
    o.with_scalar = !args.get_switch("no-scalar");
    ZINF_ASSIGN_OR_RETURN(o.min_ratio, args.get_double("min-ratio", 0.0, 10.0));
    return o;
}

// One fp32 or 16-bit array of the step, huge-page backed where the kernel allows.
Result<AlignedBuffer> allocate_stream(std::size_t size_bytes) {
    constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;
    ZINF_ASSIGN_OR_RETURN(AlignedBuffer buffer,
                          AlignedBuffer::allocate(size_bytes, kHugePageBytes));
    // Best effort: fewer TLB misses for both the bound and the kernel, which share the arrays.
    // With transparent huge pages off the call fails and nothing changes.
    (void)::madvise(buffer.data(), buffer.size(), MADV_HUGEPAGE);
    return buffer;
}

// A deterministic value in [-1, 1) from an index, cheap enough to fill billions.
float hashed_unit(std::uint64_t i, std::uint64_t salt) {
    std::uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ salt;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return static_cast<float>(static_cast<double>(x >> 40) * 0x1p-23 - 1.0);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Status run(const AdamOptions& o) {
    // oneTBB caps its workers at the core count; lift the cap so that --threads is what runs.
    const int wanted_threads = o.threads == 0 ? tbb::info::default_concurrency() : o.threads;
    const tbb::global_control allow_threads(tbb::global_control::max_allowed_parallelism,
                                            static_cast<std::size_t>(wanted_threads));
    // The variant: an explicit --variant wins; auto defers to ZINF_CPU_ISA, then the CPU.
    Isa isa = Isa::kScalar;
    if (o.variant == "auto") {
        ZINF_ASSIGN_OR_RETURN(isa, kernels::resolve_isa("auto"));
    } else {
        for (const Isa candidate : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
            if (kernels::isa_name(candidate) == o.variant) isa = candidate;
        }
    }
    auto created = kernels::OptimizerKernel::create(isa, o.threads);
    if (!created.has_value()) return created.error().with_context(str_cat("--variant ", o.variant));
    kernels::OptimizerKernel kernel = std::move(created).value();
    const bool with_scalar = o.with_scalar && isa != Isa::kScalar;
    ZINF_ASSIGN_OR_RETURN(kernels::OptimizerKernel scalar,
                          kernels::OptimizerKernel::create(Isa::kScalar, o.threads));
    ZINF_ASSIGN_OR_RETURN(kernels::ChunkLoop loop, kernels::ChunkLoop::create(o.threads));
    // The bound runs the widest vectors the CPU has, whatever variant is measured: it stands
    // for the memory system, not for a variant.
    BoundChunkFn bound_fn = nullptr;
    const char* bound_isa = nullptr;
    if (kernels::isa_supported(Isa::kAvx512)) {
        bound_fn = bound_chunk_avx512();
        bound_isa = "avx512";
    } else if (kernels::isa_supported(Isa::kAvx2)) {
        bound_fn = bound_chunk_avx2();
        bound_isa = "avx2";
    } else {
        return Status::not_supported(
            "the bound kernel needs AVX2 or AVX-512; this CPU has neither");
    }

    const std::size_t n = o.params_numel;
    const bool two_states = optimizer_descriptor(o.kind).kept_moment_count(false) == 2;
    const std::size_t grad_bytes = dtype_size_bytes(o.grad_dtype);
    const std::size_t bytes_per_param = (two_states ? 24 : 16) + grad_bytes + (o.bf16_copy ? 2 : 0);
    const double bytes_per_step = static_cast<double>(bytes_per_param) * static_cast<double>(n);

    ZINF_ASSIGN_OR_RETURN(AlignedBuffer params, allocate_stream(n * sizeof(float)));
    ZINF_ASSIGN_OR_RETURN(AlignedBuffer state1, allocate_stream(n * sizeof(float)));
    AlignedBuffer state2;
    if (two_states) {
        ZINF_ASSIGN_OR_RETURN(state2, allocate_stream(n * sizeof(float)));
    }
    ZINF_ASSIGN_OR_RETURN(AlignedBuffer grads, allocate_stream(n * grad_bytes));
    AlignedBuffer copy;
    if (o.bf16_copy) {
        ZINF_ASSIGN_OR_RETURN(copy, allocate_stream(n * sizeof(std::uint16_t)));
    }

    float* p = params.as<float>();
    float* s1 = state1.as<float>();
    float* s2 = two_states ? state2.as<float>() : nullptr;
    auto* copy_data = o.bf16_copy ? copy.as<std::uint16_t>() : nullptr;

    // First touch on the threads and chunks that will use each page, so that no page fault
    // (or NUMA misplacement) lands in a timed run. Gradients stay small so that the states
    // never become denormal, which would measure the FPU's slow path instead of memory.
    const auto t_init = std::chrono::steady_clock::now();
    loop.run(kernels::chunk_count_for(n), [&](std::size_t chunk) {
        const std::size_t begin = chunk * kernels::kChunkNumel;
        const std::size_t end = std::min(n, begin + kernels::kChunkNumel);
        for (std::size_t i = begin; i < end; ++i) {
            p[i] = hashed_unit(i, 1);
            s1[i] = 0.0f;
            if (s2 != nullptr) s2[i] = 0.0f;
            const float g = 1e-2f * hashed_unit(i, 2);
            switch (o.grad_dtype) {
                case DType::kFloat32:
                    grads.as<float>()[i] = g;
                    break;
                case DType::kBFloat16:
                    grads.as<std::uint16_t>()[i] = kernels::float_to_bf16(g);
                    break;
                case DType::kFloat16:
                    grads.as<std::uint16_t>()[i] = kernels::float_to_fp16(g);
                    break;
            }
            if (copy_data != nullptr) copy_data[i] = 0;
        }
    });
    const double init_s = seconds_since(t_init);

    const BoundArgs bound_args{p, s1, s2, grads.data(), grad_bytes == 2, copy_data, 0.0f};
    const auto run_bound = [&] {
        const auto start = std::chrono::steady_clock::now();
        loop.run(kernels::chunk_count_for(n), [&](std::size_t chunk) {
            const std::size_t begin = chunk * kernels::kChunkNumel;
            bound_fn(bound_args, begin, std::min(n, begin + kernels::kChunkNumel));
        });
        return seconds_since(start);
    };
    kernels::OptimizerParams hp;
    hp.kind = o.kind;
    hp.weight_decay = 0.01;
    hp.beta2 = o.kind == OptimizerKind::kLion ? 0.99 : 0.999;
    hp.torch_rounding = o.torch_rounding;
    kernels::OptimizerState state;
    state.params = {p, n};
    state.moments[0] = {s1, n};
    if (two_states) state.moments[1] = {s2, n};
    kernels::GradView grad_view{grads.data(), n, o.grad_dtype};
    const kernels::ParamCopy param_copy =
        o.bf16_copy ? kernels::ParamCopy::bf16({copy_data, n}) : kernels::ParamCopy::none();
    Status step_status;
    const auto run_step = [&](const kernels::OptimizerKernel& k) {
        const auto start = std::chrono::steady_clock::now();
        step_status = k.step(hp, state, grad_view, param_copy);
        const double s = seconds_since(start);
        ++hp.step;
        return s;
    };

    std::printf(
        "zinfinity-bench adam: %s%s, %llu params, grads %s, %s, variant %s (asked: %s), %d "
        "threads\n",
        std::string(optimizer_kind_name(o.kind)).c_str(),
        o.torch_rounding ? " (torch rounding)" : "", static_cast<unsigned long long>(n),
        std::string(dtype_name(o.grad_dtype)).c_str(),
        o.bf16_copy ? "bf16 param copy" : "no param copy",
        std::string(kernels::isa_name(isa)).c_str(), o.variant.c_str(), kernel.threads());
    std::printf("cpu: %s\n", kernels::cpu_features().to_string().c_str());
    std::printf("bytes/param: %zu (%d fp32 streams read and written in place, %s grads read%s)\n",
                bytes_per_param, two_states ? 3 : 2,
                std::string(dtype_name(o.grad_dtype)).c_str(),
                o.bf16_copy ? ", bf16 copy written" : "");
    std::printf(
        "bound: the same streams with plain %s loads/stores and no arithmetic, same %zu-element "
        "chunks "
        "and threads\n",
        bound_isa, kernels::kChunkNumel);
    std::printf("first touch: %.2f s for %.2f GB\n", init_s, bytes_per_step / 1e9);

    // One untimed round warms the threads, the caches' page-table entries and the CPU clocks.
    (void)run_bound();
    (void)run_step(kernel);
    ZINF_TRY(step_status);
    if (with_scalar) (void)run_step(scalar);

    std::printf("\n%-5s %12s %12s %8s %14s", "pair", "bound GB/s", "kernel GB/s", "ratio",
                "kernel Gpar/s");
    if (with_scalar) std::printf(" %12s %8s", "scalar GB/s", "ratio");
    std::printf("\n");
    std::vector<double> bound_gbs, kernel_gbs, ratios, scalar_gbs, scalar_ratios;
    for (int pair = 0; pair < o.pairs; ++pair) {
        // Flip the order every pair so that neither side always follows the other.
        double bound_s = 0, kernel_s = 0;
        if (pair % 2 == 0) {
            bound_s = run_bound();
            kernel_s = run_step(kernel);
        } else {
            kernel_s = run_step(kernel);
            bound_s = run_bound();
        }
        ZINF_TRY(step_status);
        const double b = bytes_per_step / bound_s / 1e9;
        const double k = bytes_per_step / kernel_s / 1e9;
        bound_gbs.push_back(b);
        kernel_gbs.push_back(k);
        ratios.push_back(k / b);
        std::printf("%-5d %12.2f %12.2f %8.3f %14.3f", pair + 1, b, k, k / b,
                    static_cast<double>(n) / kernel_s / 1e9);
        if (with_scalar) {
            const double scalar_s = run_step(scalar);
            ZINF_TRY(step_status);
            const double s = bytes_per_step / scalar_s / 1e9;
            scalar_gbs.push_back(s);
            scalar_ratios.push_back(s / b);
            std::printf(" %12.2f %8.3f", s, s / b);
        }
        std::printf("\n");
        std::fflush(stdout);  // one line per pair as it completes, also when piped
    }
    const double ratio = median(ratios);
    std::printf("\nmedian bound:  %7.2f GB/s = %.3fe9 params/s\n", median(bound_gbs),
                median(bound_gbs) * 1e9 / static_cast<double>(bytes_per_param) / 1e9);
    std::printf("median kernel: %7.2f GB/s = %.3fe9 params/s (%s, %d threads)\n",
                median(kernel_gbs), median(kernel_gbs) / static_cast<double>(bytes_per_param),
                std::string(kernels::isa_name(isa)).c_str(), kernel.threads());
    std::printf("ratio to bound: %.3f (median of per-pair ratios; min %.3f, max %.3f)\n", ratio,
                *std::min_element(ratios.begin(), ratios.end()),
                *std::max_element(ratios.begin(), ratios.end()));
    if (with_scalar) {
        std::printf("scalar beside: %7.2f GB/s = %.3fe9 params/s, ratio %.3f\n", median(scalar_gbs),
                    median(scalar_gbs) / static_cast<double>(bytes_per_param),
                    median(scalar_ratios));
    }
    if (o.min_ratio > 0.0 && ratio < o.min_ratio) {
        return Status::internal(str_cat("ratio ", ratio, " is below --min-ratio ", o.min_ratio));
    }
    return Status::ok();
}

}  // namespace

int run_adam(int argc, char** argv) {
    cli::Args args(
        "zinfinity-bench adam [flags]",
        "Times the CPU optimizer step (kernels::OptimizerKernel) over --params parameters and\n"
        "compares it with the memory-bandwidth bound measured in the same run: a kernel\n"
        "that moves exactly the step's bytes (Adam: 4 fp32 streams read, 3 written in\n"
        "place, 28 B/param; 26 with bf16 grads; +2 with --bf16-copy) with no arithmetic.\n"
        "Bound and step alternate in --pairs pairs; the summary gives medians and the\n"
        "median per-pair ratio, and the scalar variant's figure beside.\n\n"
        "Figures: GB/s (decimal, 1e9 bytes/s) and parameters per second.");
    declare_flags(args);
    constexpr std::string_view kProgram = "zinfinity-bench adam";
    if (auto exit_code = args.parse_or_exit(argc, argv, kProgram)) return *exit_code;
    auto options = parse_options(args);
    if (!options.has_value()) return cli::report_error(kProgram, options.error());
    const Status status = run(*options);
    return status.is_ok() ? 0 : cli::report_error(kProgram, status, 1);
}

}  // namespace zinf::bench
