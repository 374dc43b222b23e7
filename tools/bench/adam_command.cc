// `zinfinity-bench adam`: CPU optimizer step throughput (parameters/s, GB/s) against the
// memory-bandwidth bound measured in the same run by a kernel with the step's own memory pattern
// (tools/bench/adam_bound.h), in interleaved pairs, with the scalar variant's figure beside.
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cast.h"
#include "kernels/chunk_loop.h"
#include "kernels/cpu_features.h"
#include "kernels/optimizer.h"
#include "src/base/aligned.h"
#include "src/base/log.h"
#include "src/base/optimizer_descriptor.h"
#include "src/base/state_dtype.h"
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
    StateDType state_dtype = StateDType::kFp32;
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
    std::string names;
    for (const OptimizerDescriptor* d : registered_optimizers()) {
        names += str_cat(names.empty() ? "" : ", ", d->name);
    }
    args.add("optimizer", "adamw", names);
    args.add("grad-dtype", "fp32", "gradient dtype: fp32, bf16 or fp16");
    args.add("state-dtype", "fp32",
             "moments stored as fp32, bf16 (stochastic rounding) or int8 (blockwise, one\n"
             "fp32 scale per 2048); the bound moves the same bytes");
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
    std::vector<std::string_view> names;
    for (const OptimizerDescriptor* d : registered_optimizers()) names.push_back(d->name);
    ZINF_ASSIGN_OR_RETURN(const std::string kind, args.get_choice("optimizer", names));
    o.kind = find_optimizer(kind)->kind;
    ZINF_TRY(args.get_choice("grad-dtype", {"fp32", "bf16", "fp16"}).status());
    const std::string dtype = args.get("grad-dtype");
    o.grad_dtype = dtype == "fp32"   ? DType::kFloat32
                   : dtype == "bf16" ? DType::kBFloat16
                                     : DType::kFloat16;
    ZINF_ASSIGN_OR_RETURN(const std::string state,
                          args.get_choice("state-dtype", {"fp32", "bf16", "int8"}));
    o.state_dtype = *find_state_dtype(state);
    ZINF_ASSIGN_OR_RETURN(o.variant,
                          args.get_choice("variant", {"auto", "avx512", "avx2", "scalar"}));
    ZINF_ASSIGN_OR_RETURN(const std::int64_t threads, args.get_int("threads", 0, 4096));
    o.threads = static_cast<int>(threads);
    ZINF_ASSIGN_OR_RETURN(const std::int64_t pairs, args.get_int("pairs", 1, 1000));
    o.pairs = static_cast<int>(pairs);
    o.bf16_copy = args.get_switch("bf16-copy");
    o.torch_rounding = args.get_switch("torch-rounding");
    if (o.torch_rounding && !optimizer_descriptor(o.kind).has_torch_rounding) {
        return Status::invalid_argument(
            str_cat("--torch-rounding: only with ", optimizer_names_where(has_torch_rounding)));
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

// The kernels of a run: the variant measured, the scalar one beside it, and the bound's loop.
struct AdamKernels {
    Isa isa = Isa::kScalar;
    kernels::OptimizerKernel kernel;
    kernels::OptimizerKernel scalar;
    bool with_scalar = false;  // --no-scalar not given, and the measured variant is not scalar
    kernels::ChunkLoop loop;
    // The bound runs the widest vectors the CPU has, whatever variant is measured: it stands
    // for the memory system, not for a variant.
    BoundChunkFn bound_fn = nullptr;
    const char* bound_isa = nullptr;
};

// Set up, part 1: the variant (an explicit --variant wins; auto defers to ZINF_CPU_ISA, then
// the CPU), its kernel, the scalar kernel and the bound kernel.
Result<AdamKernels> make_kernels(const AdamOptions& o) {
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
    if (kernels::isa_supported(Isa::kAvx512)) {
        return AdamKernels{isa,         std::move(kernel), std::move(scalar),
                           with_scalar, std::move(loop),   bound_chunk_avx512(),
                           "avx512"};
    }
    if (kernels::isa_supported(Isa::kAvx2)) {
        return AdamKernels{isa,         std::move(kernel), std::move(scalar),
                           with_scalar, std::move(loop),   bound_chunk_avx2(),
                           "avx2"};
    }
    return Status::not_supported("the bound kernel needs AVX2 or AVX-512; this CPU has neither");
}

// The step's arrays, and what one step moves.
struct AdamArrays {
    std::size_t numel = 0;
    bool two_states = false;  // the optimizer keeps two moments (its descriptor says), else one
    std::size_t grad_bytes = 0;
    std::size_t state_bytes = 4;  // per moment element: 4 fp32, 2 bf16, 1 int8
    double bytes_per_param = 0;   // int8's scales make it fractional
    double bytes_per_step = 0;
    // state2, copy and the int8 scales may be empty.
    AlignedBuffer params, state1, state2, grads, copy, scales1, scales2;
    double first_touch_s = 0;
};

// First touch on the threads and chunks that will use each page, so that no page fault (or
// NUMA misplacement) lands in a timed run. Gradients stay small so that the states never become
// denormal, which would measure the FPU's slow path instead of memory.
void first_touch(const AdamOptions& o, const kernels::ChunkLoop& loop, AdamArrays& a) {
    const std::size_t n = a.numel;
    float* p = a.params.as<float>();
    std::byte* s1 = a.state1.data();
    std::byte* s2 = a.two_states ? a.state2.data() : nullptr;
    auto* copy_data = o.bf16_copy ? a.copy.as<std::uint16_t>() : nullptr;
    loop.run(kernels::chunk_count_for(n), [&](std::size_t chunk) {
        const std::size_t begin = chunk * kernels::kChunkNumel;
        const std::size_t end = std::min(n, begin + kernels::kChunkNumel);
        for (std::size_t i = begin; i < end; ++i) {
            p[i] = hashed_unit(i, 1);
            // Zero bytes are 0 in every state dtype.
            std::memset(s1 + i * a.state_bytes, 0, a.state_bytes);
            if (s2 != nullptr) std::memset(s2 + i * a.state_bytes, 0, a.state_bytes);
            const float g = 1e-2f * hashed_unit(i, 2);
            switch (o.grad_dtype) {
                case DType::kFloat32:
                    a.grads.as<float>()[i] = g;
                    break;
                case DType::kBFloat16:
                    a.grads.as<std::uint16_t>()[i] = kernels::float_to_bf16(g);
                    break;
                case DType::kFloat16:
                    a.grads.as<std::uint16_t>()[i] = kernels::float_to_fp16(g);
                    break;
            }
            if (copy_data != nullptr) copy_data[i] = 0;
        }
    });
}

// Set up, part 2: the arrays of --params parameters, first-touched (timed).
Result<AdamArrays> allocate_arrays(const AdamOptions& o, const kernels::ChunkLoop& loop) {
    AdamArrays a;
    a.numel = o.params_numel;
    const std::size_t n = a.numel;
    a.two_states = optimizer_descriptor(o.kind).kept_moment_count(false) == 2;
    a.grad_bytes = dtype_size_bytes(o.grad_dtype);
    a.state_bytes = state_element_size_bytes(o.state_dtype);
    const int moments = a.two_states ? 2 : 1;
    // Each moment read and written: its elements and (int8) one fp32 scale per 2048.
    const double moment_bytes =
        2.0 * static_cast<double>(state_moment_size_bytes(o.state_dtype, kStateBlockNumel)) /
        static_cast<double>(kStateBlockNumel);
    a.bytes_per_param = 8.0 + moments * moment_bytes + static_cast<double>(a.grad_bytes) +
                        (o.bf16_copy ? 2.0 : 0.0);
    a.bytes_per_step = a.bytes_per_param * static_cast<double>(n);
    const std::size_t scale_bytes = state_scale_count(o.state_dtype, n) * sizeof(float);
    ZINF_ASSIGN_OR_RETURN(a.params, allocate_stream(n * sizeof(float)));
    ZINF_ASSIGN_OR_RETURN(a.state1, allocate_stream(n * a.state_bytes));
    if (scale_bytes > 0) {
        ZINF_ASSIGN_OR_RETURN(a.scales1, allocate_stream(scale_bytes));
    }
    if (a.two_states) {
        ZINF_ASSIGN_OR_RETURN(a.state2, allocate_stream(n * a.state_bytes));
        if (scale_bytes > 0) {
            ZINF_ASSIGN_OR_RETURN(a.scales2, allocate_stream(scale_bytes));
        }
    }
    ZINF_ASSIGN_OR_RETURN(a.grads, allocate_stream(n * a.grad_bytes));
    if (o.bf16_copy) {
        ZINF_ASSIGN_OR_RETURN(a.copy, allocate_stream(n * sizeof(std::uint16_t)));
    }
    const auto t_init = std::chrono::steady_clock::now();
    first_touch(o, loop, a);
    a.first_touch_s = seconds_since(t_init);
    return a;
}

// Times one pass of the bound and one optimizer step over the same arrays. Each step advances
// the step count, as training does.
class PassTimer {
public:
    PassTimer(const AdamOptions& o, const AdamKernels& k, AdamArrays& a)
        : kernels_(k),
          numel_(a.numel),
          bound_args_{a.params.as<float>(),
                      a.state1.data(),
                      a.two_states ? a.state2.data() : nullptr,
                      a.grads.data(),
                      a.grad_bytes == 2,
                      o.bf16_copy ? a.copy.as<std::uint16_t>() : nullptr,
                      static_cast<int>(a.state_bytes),
                      0.0f},
          grad_view_{a.grads.data(), numel_, o.grad_dtype},
          param_copy_(o.bf16_copy ? kernels::ParamCopy::bf16({bound_args_.copy, numel_})
                                  : kernels::ParamCopy::none()) {
        hp_.kind = o.kind;
        hp_.weight_decay = 0.01;
        hp_.beta1 = optimizer_descriptor(o.kind).default_beta1;
        hp_.beta2 = optimizer_descriptor(o.kind).default_beta2;
        hp_.torch_rounding = o.torch_rounding;
        state_.params = {bound_args_.params, numel_};
        state_.dtype = o.state_dtype;
        state_.rounding_seed = 1;
        const std::size_t scale_count = state_scale_count(o.state_dtype, numel_);
        state_.moments[0] = {a.state1.data(), numel_ * a.state_bytes};
        if (scale_count > 0) state_.scales[0] = {a.scales1.as<float>(), scale_count};
        if (a.two_states) {
            state_.moments[1] = {a.state2.data(), numel_ * a.state_bytes};
            if (scale_count > 0) state_.scales[1] = {a.scales2.as<float>(), scale_count};
        }
    }

    // Seconds of one bound pass.
    double bound() const {
        const auto start = std::chrono::steady_clock::now();
        kernels_.loop.run(kernels::chunk_count_for(numel_), [&](std::size_t chunk) {
            const std::size_t begin = chunk * kernels::kChunkNumel;
            kernels_.bound_fn(bound_args_, begin, std::min(numel_, begin + kernels::kChunkNumel));
        });
        return seconds_since(start);
    }
    // Seconds of one step of `kernel`; its status is step_status().
    double step(const kernels::OptimizerKernel& kernel) {
        const auto start = std::chrono::steady_clock::now();
        step_status_ = kernel.step(hp_, state_, grad_view_, param_copy_);
        const double s = seconds_since(start);
        ++hp_.step;
        return s;
    }
    const Status& step_status() const { return step_status_; }

private:
    const AdamKernels& kernels_;
    std::size_t numel_;
    BoundArgs bound_args_;
    kernels::OptimizerParams hp_;
    kernels::StoredState state_;
    kernels::GradView grad_view_;
    kernels::ParamCopy param_copy_;
    Status step_status_;
};

void print_header(const AdamOptions& o, const AdamKernels& k, const AdamArrays& a) {
    std::printf(
        "zinfinity-bench adam: %s%s, %llu params, grads %s, states %s, %s, variant %s (asked: "
        "%s), %d threads\n",
        std::string(optimizer_kind_name(o.kind)).c_str(),
        o.torch_rounding ? " (torch rounding)" : "", static_cast<unsigned long long>(a.numel),
        std::string(dtype_name(o.grad_dtype)).c_str(),
        std::string(state_dtype_name(o.state_dtype)).c_str(),
        o.bf16_copy ? "bf16 param copy" : "no param copy",
        std::string(kernels::isa_name(k.isa)).c_str(), o.variant.c_str(), k.kernel.threads());
    std::printf("cpu: %s\n", kernels::cpu_features().to_string().c_str());
    std::printf(
        "bytes/param: %.3f (fp32 master and %d %s moment stream%s read and written in place%s, "
        "%s grads read%s)\n",
        a.bytes_per_param, a.two_states ? 2 : 1,
        std::string(state_dtype_name(o.state_dtype)).c_str(), a.two_states ? "s" : "",
        o.state_dtype == StateDType::kInt8 ? " with their scales" : "",
        std::string(dtype_name(o.grad_dtype)).c_str(), o.bf16_copy ? ", bf16 copy written" : "");
    std::printf(
        "bound: the same streams with plain %s loads/stores and no arithmetic, same %zu-element "
        "chunks and threads\n",
        k.bound_isa, kernels::kChunkNumel);
    std::printf("first touch: %.2f s for %.2f GB\n", a.first_touch_s, a.bytes_per_step / 1e9);
}

// GB/s of each side of each pair, and the per-pair ratios to the bound.
struct PairFigures {
    std::vector<double> bound_gbs, kernel_gbs, ratios, scalar_gbs, scalar_ratios;
};

// Measure: one untimed round, then --pairs interleaved (bound, kernel) pairs with the scalar
// variant after each; each pair's row is printed as it completes.
Result<PairFigures> measure_pairs(const AdamOptions& o, const AdamKernels& k, const AdamArrays& a,
                                  PassTimer& timer) {
    // One untimed round warms the threads, the caches' page-table entries and the CPU clocks.
    (void)timer.bound();
    (void)timer.step(k.kernel);
    ZINF_TRY(timer.step_status());
    if (k.with_scalar) (void)timer.step(k.scalar);

    std::printf("\n%-5s %12s %12s %8s %14s", "pair", "bound GB/s", "kernel GB/s", "ratio",
                "kernel Gpar/s");
    if (k.with_scalar) std::printf(" %12s %8s", "scalar GB/s", "ratio");
    std::printf("\n");
    PairFigures f;
    for (int pair = 0; pair < o.pairs; ++pair) {
        // Flip the order every pair so that neither side always follows the other.
        double bound_s = 0, kernel_s = 0;
        if (pair % 2 == 0) {
            bound_s = timer.bound();
            kernel_s = timer.step(k.kernel);
        } else {
            kernel_s = timer.step(k.kernel);
            bound_s = timer.bound();
        }
        ZINF_TRY(timer.step_status());
        const double b = a.bytes_per_step / bound_s / 1e9;
        const double g = a.bytes_per_step / kernel_s / 1e9;
        f.bound_gbs.push_back(b);
        f.kernel_gbs.push_back(g);
        f.ratios.push_back(g / b);
        std::printf("%-5d %12.2f %12.2f %8.3f %14.3f", pair + 1, b, g, g / b,
                    static_cast<double>(a.numel) / kernel_s / 1e9);
        if (k.with_scalar) {
            const double scalar_s = timer.step(k.scalar);
            ZINF_TRY(timer.step_status());
            const double s = a.bytes_per_step / scalar_s / 1e9;
            f.scalar_gbs.push_back(s);
            f.scalar_ratios.push_back(s / b);
            std::printf(" %12.2f %8.3f", s, s / b);
        }
        std::printf("\n");
        std::fflush(stdout);  // one line per pair as it completes, also when piped
    }
    return f;
}

// Report: the medians; an error when the median ratio is below --min-ratio.
Status report(const AdamOptions& o, const AdamKernels& k, const AdamArrays& a,
              const PairFigures& f) {
    const double ratio = median(f.ratios);
    const double per_param = a.bytes_per_param;
    std::printf("\nmedian bound:  %7.2f GB/s = %.3fe9 params/s\n", median(f.bound_gbs),
                median(f.bound_gbs) * 1e9 / per_param / 1e9);
    std::printf("median kernel: %7.2f GB/s = %.3fe9 params/s (%s, %d threads)\n",
                median(f.kernel_gbs), median(f.kernel_gbs) / per_param,
                std::string(kernels::isa_name(k.isa)).c_str(), k.kernel.threads());
    std::printf("ratio to bound: %.3f (median of per-pair ratios; min %.3f, max %.3f)\n", ratio,
                *std::min_element(f.ratios.begin(), f.ratios.end()),
                *std::max_element(f.ratios.begin(), f.ratios.end()));
    if (k.with_scalar) {
        std::printf("scalar beside: %7.2f GB/s = %.3fe9 params/s, ratio %.3f\n",
                    median(f.scalar_gbs), median(f.scalar_gbs) / per_param,
                    median(f.scalar_ratios));
    }
    if (o.min_ratio > 0.0 && ratio < o.min_ratio) {
        return Status::internal(str_cat("ratio ", ratio, " is below --min-ratio ", o.min_ratio));
    }
    return Status::ok();
}

Status run(const AdamOptions& o) {
    // oneTBB caps its workers at the core count; lift the cap so that --threads is what runs.
    const int wanted_threads = o.threads == 0 ? tbb::info::default_concurrency() : o.threads;
    const tbb::global_control allow_threads(tbb::global_control::max_allowed_parallelism,
                                            static_cast<std::size_t>(wanted_threads));
    ZINF_ASSIGN_OR_RETURN(const AdamKernels k, make_kernels(o));
    ZINF_ASSIGN_OR_RETURN(AdamArrays a, allocate_arrays(o, k.loop));
    PassTimer timer(o, k, a);
    print_header(o, k, a);
    ZINF_ASSIGN_OR_RETURN(const PairFigures figures, measure_pairs(o, k, a, timer));
    return report(o, k, a, figures);
}

}  // namespace

int run_adam(int argc, char** argv) {
    cli::Args args(
        "zinfinity-bench adam [flags]",
        "Times the CPU optimizer step (kernels::OptimizerKernel) over --params parameters and\n"
        "compares it with the memory-bandwidth bound measured in the same run: a kernel\n"
        "that moves exactly the step's bytes (Adam: 4 fp32 streams read, 3 written in\n"
        "place, 28 B/param; 26 with bf16 grads; +2 with --bf16-copy) with no arithmetic.\n"
        "--state-dtype bf16 or int8 stores the moments in 2 or 1 B (+ a 4 B scale per\n"
        "2048 for int8): 20 or about 16 B/param with fp32 grads, and the bound moves\n"
        "the moments at that width.\n"
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
