// OptimizerKernel: validates a step, derives its constants once in double precision, and runs
// the chosen variant's chunk function over fixed chunks on the ChunkLoop.
#include "kernels/optimizer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/detail/kernel_table.h"
#include "kernels/detail/state_args.h"
#include "kernels/detail/state_table.h"
#include "kernels/state_codec.h"
#include "src/base/log.h"

namespace zinf::kernels {
namespace {

// Chunk partials of grad_stats live on the stack, this many per round (32 KiB): a fixed array
// instead of one sized by numel keeps the call allocation-free. More chunks take more rounds,
// each a parallel loop; the partials are still added in chunk order, so the sum does not
// depend on the round size either.
constexpr std::size_t kReductionRoundChunks = 4096;

static_assert(detail::kStepMoments == static_cast<int>(kMaxMoments));
static_assert(detail::kKindCount == kBuiltinOptimizerCount);
// A chunk holds whole int8 blocks, so the state chunk functions never split one.
static_assert(kChunkNumel % kStateBlockNumel == 0);
static_assert(static_cast<int>(StateDType::kBf16) - 1 == detail::kStateBf16);
static_assert(static_cast<int>(StateDType::kInt8) - 1 == detail::kStateInt8);

// The chunk functions of registered optimizers, per variant, by kind. Written once at
// registration (release), read by every step (acquire): no lock on the step's path.
struct RegisteredKernels {
    std::array<std::atomic<const OptimizerKernelEntries*>, kIsaCount> per_isa{};
};

std::array<RegisteredKernels, kMaxOptimizers>& registered_kernels() noexcept {
    static std::array<RegisteredKernels, kMaxOptimizers> kernels;
    return kernels;
}

bool in_unit_interval(double x) noexcept {
    return x >= 0.0 && x < 1.0;
}

const detail::StateKernelTable& state_kernel_table(Isa isa) noexcept {
    switch (isa) {
        case Isa::kAvx512:
            return detail::avx512_state_kernel_table();
        case Isa::kAvx2:
            return detail::avx2_state_kernel_table();
        case Isa::kScalar:
            break;
    }
    return detail::scalar_state_kernel_table();
}

// An fp32 StoredState as the fp32 step's view of it.
OptimizerState fp32_state_of(const StoredState& stored) noexcept {
    OptimizerState state;
    state.params = stored.params;
    for (std::size_t i = 0; i < kMaxMoments; ++i) {
        const std::span<std::byte> bytes = stored.moments[i];
        ZINF_ASSERT(bytes.size() % sizeof(float) == 0);
        ZINF_ASSERT(reinterpret_cast<std::uintptr_t>(bytes.data()) % alignof(float) == 0);
        ZINF_ASSERT(stored.scales[i].empty());
        state.moments[i] = {reinterpret_cast<float*>(bytes.data()), bytes.size() / sizeof(float)};
    }
    return state;
}

}  // namespace

// kernels/detail/state_args.h: shared with the CUDA step.
int detail::copy_index_for(ParamCopy copy, std::size_t numel) noexcept {
    if (copy.data == nullptr) return 0;
    ZINF_ASSERT_EQ(copy.numel, numel);
    ZINF_ASSERT(copy.dtype != DType::kFloat32);
    return copy.dtype == DType::kBFloat16 ? 1 : 2;
}

void detail::assert_stored_state(const StoredState& state, std::size_t kept) noexcept {
    const std::size_t numel = state.params.size();
    ZINF_ASSERT(state.first_index % kStateBlockNumel == 0);
    for (std::size_t i = 0; i < kMaxMoments; ++i) {
        if (i >= kept) {
            ZINF_ASSERT(state.moments[i].empty());
            ZINF_ASSERT(state.scales[i].empty());
            continue;
        }
        ZINF_ASSERT_EQ(state.moments[i].size(), numel * state_element_size_bytes(state.dtype));
        ZINF_ASSERT_EQ(state.scales[i].size(), state_scale_count(state.dtype, numel));
        const auto address = reinterpret_cast<std::uintptr_t>(state.moments[i].data());
        ZINF_ASSERT(address % state_element_size_bytes(state.dtype) == 0);
    }
}

detail::StateStepArgs detail::state_step_args(const OptimizerParams& params,
                                              const StoredState& state, GradView grads,
                                              ParamCopy copy, std::size_t kept) noexcept {
    const OptimizerDescriptor& d = optimizer_descriptor(params.kind);
    detail::StateStepArgs args{};
    args.step.params = state.params.data();
    args.step.grads = grads.data;
    args.step.param_copy = copy.data;
    args.step.c = detail::step_constants(params);
    for (std::size_t i = 0; i < kept; ++i) {
        args.stored[i] = state.moments[i].data();
        args.scales[i] = state.dtype == StateDType::kInt8 ? state.scales[i].data() : nullptr;
        if (d.moments[i].non_negative) args.unsigned_mask |= 1u << i;
    }
    args.moment_count = static_cast<int>(kept);
    args.first_index = state.first_index;
    args.rounding_keys[0] = rounding_key(state.rounding_seed, 0, params.step);
    args.rounding_keys[1] = rounding_key(state.rounding_seed, 1, params.step);
    return args;
}

detail::StepConstants detail::step_constants(const OptimizerParams& p) noexcept {
    detail::StepConstants c{};
    c.grad_scale = static_cast<float>(p.grad_scale);
    c.beta1 = static_cast<float>(p.beta1);
    c.one_minus_beta1 = static_cast<float>(1.0 - p.beta1);
    c.beta2 = static_cast<float>(p.beta2);
    c.one_minus_beta2 = static_cast<float>(1.0 - p.beta2);
    c.eps = static_cast<float>(p.eps);
    c.step_size = static_cast<float>(-p.lr);
    c.inv_sqrt_bias_correction2 = 1.0f;
    c.sqrt_bias_correction2 = 1.0f;
    c.torch_rounding = p.torch_rounding ? 1 : 0;
    c.l2_weight_decay = 0.0f;
    c.decay_factor = 1.0f;
    switch (p.kind) {
        case OptimizerKind::kAdam:
        case OptimizerKind::kAdamW: {
            if (p.bias_correction) {
                // In double from the 64-bit step: fp32 powers drift over thousands of steps.
                const double step = static_cast<double>(p.step);
                const double bias_correction1 = 1.0 - std::pow(p.beta1, step);
                const double bias_correction2 = 1.0 - std::pow(p.beta2, step);
                c.step_size = static_cast<float>(-p.lr / bias_correction1);
                c.inv_sqrt_bias_correction2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
                c.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
            }
            if (p.kind == OptimizerKind::kAdam) {
                c.l2_weight_decay = static_cast<float>(p.weight_decay);
            } else {
                c.decay_factor = static_cast<float>(1.0 - p.lr * p.weight_decay);
            }
            break;
        }
        case OptimizerKind::kAdagrad:
            c.l2_weight_decay = static_cast<float>(p.weight_decay);
            break;
        case OptimizerKind::kLion:
        default:  // registered optimizers: the generic constants (OptimizerKernelEntries)
            c.decay_factor = static_cast<float>(1.0 - p.lr * p.weight_decay);
            break;
    }
    return c;
}

Status validate(const OptimizerParams& p) {
    if (p.step < 1)
        return Status::invalid_argument("optimizer step: expected >= 1 (1-based), got 0");
    const auto check = [](const char* name, double value, bool ok) -> Status {
        if (ok && std::isfinite(value)) return Status::ok();
        return Status::invalid_argument(str_cat("optimizer ", name, ": out of range, got ", value));
    };
    ZINF_TRY(check("lr", p.lr, p.lr >= 0.0));
    ZINF_TRY(check("beta1", p.beta1, in_unit_interval(p.beta1)));
    ZINF_TRY(check("beta2", p.beta2, in_unit_interval(p.beta2)));
    ZINF_TRY(check("eps", p.eps, p.eps >= 0.0));
    ZINF_TRY(check("weight_decay", p.weight_decay, p.weight_decay >= 0.0));
    ZINF_TRY(check("grad_scale", p.grad_scale, true));
    if (!optimizer_registered(p.kind)) {
        return Status::invalid_argument(
            str_cat("optimizer kind ", static_cast<int>(p.kind), ": not registered"));
    }
    const OptimizerDescriptor& d = optimizer_descriptor(p.kind);
    if (p.torch_rounding && !d.has_torch_rounding) {
        return Status::invalid_argument(str_cat("optimizer torch_rounding: only ",
                                                optimizer_names_where(&has_torch_rounding),
                                                " have it, not ", d.name));
    }
    if (p.amsgrad && !d.has_amsgrad) {
        return Status::invalid_argument(str_cat("optimizer amsgrad: only ",
                                                optimizer_names_where(&has_amsgrad),
                                                " have it, got true for ", d.name));
    }
    return Status::ok();
}

const detail::KernelTable& kernel_table(Isa isa) noexcept {
    ZINF_ASSERT(isa_supported(isa));
    switch (isa) {
        case Isa::kAvx512:
            return detail::avx512_kernel_table();
        case Isa::kAvx2:
            return detail::avx2_kernel_table();
        case Isa::kScalar:
            break;
    }
    return detail::scalar_kernel_table();
}

OptimizerKernel::OptimizerKernel(Isa isa, const detail::KernelTable& table, ChunkLoop loop) noexcept
    : isa_(isa), table_(&table), loop_(std::move(loop)) {}
OptimizerKernel::OptimizerKernel(OptimizerKernel&&) noexcept = default;
OptimizerKernel& OptimizerKernel::operator=(OptimizerKernel&&) noexcept = default;
OptimizerKernel::~OptimizerKernel() = default;

Result<OptimizerKernel> OptimizerKernel::create(Isa isa, int threads) {
    if (!isa_supported(isa)) {
        return Status::not_supported(
            str_cat("CPU optimizer variant ", isa_name(isa),
                    ": not supported by this CPU (detected: ", cpu_features().to_string(), ")"));
    }
    ZINF_ASSIGN_OR_RETURN(ChunkLoop loop, ChunkLoop::create(threads));
    return OptimizerKernel(isa, kernel_table(isa), std::move(loop));
}

Result<OptimizerKernel> OptimizerKernel::create(std::string_view isa_request, int threads) {
    ZINF_ASSIGN_OR_RETURN(const Isa isa, resolve_isa(isa_request));
    ZINF_ASSIGN_OR_RETURN(OptimizerKernel kernel, create(isa, threads));
    log::info("cpu optimizer: ", isa_name(isa), " variant, ", kernel.threads(), " threads (",
              "cpu_optimizer.isa=", isa_request, ", detected: ", cpu_features().to_string(), ")");
    return kernel;
}

int OptimizerKernel::sum_lanes() const noexcept {
    return table_->sum_lanes;
}

// The chunk function of one step: the built-in kinds' from the variant's table, registered
// ones' from their entries (the variant's own, else the scalar ones).
detail::StepChunkFn OptimizerKernel::step_function(OptimizerKind kind, bool amsgrad,
                                                   DType grad_dtype,
                                                   int copy_index) const noexcept {
    const auto index = static_cast<std::size_t>(kind);
    if (index < kBuiltinOptimizerCount) {
        return table_->step[index][amsgrad ? 1 : 0][static_cast<int>(grad_dtype)][copy_index];
    }
    const RegisteredKernels& r = registered_kernels()[index];
    const OptimizerKernelEntries* e =
        r.per_isa[static_cast<int>(isa_)].load(std::memory_order_acquire);
    if (e == nullptr) e = r.per_isa[static_cast<int>(Isa::kScalar)].load(std::memory_order_acquire);
    if (e == nullptr) return nullptr;
    return e->step[amsgrad ? 1 : 0][static_cast<int>(grad_dtype)][copy_index];
}

Status OptimizerKernel::step(const OptimizerParams& params, const OptimizerState& state,
                             GradView grads, ParamCopy copy) const noexcept {
    ZINF_TRY(validate(params));
    const std::size_t numel = state.params.size();
    const std::size_t kept = optimizer_descriptor(params.kind).kept_moment_count(params.amsgrad);
    ZINF_ASSERT_EQ(grads.numel, numel);
    for (std::size_t i = 0; i < kMaxMoments; ++i) {
        if (i < kept) {
            ZINF_ASSERT_EQ(state.moments[i].size(), numel);
        } else {
            ZINF_ASSERT(state.moments[i].empty());
        }
    }
    if (numel > 0) ZINF_ASSERT(grads.data != nullptr);
    int copy_index = 0;
    if (copy.data != nullptr) {
        ZINF_ASSERT_EQ(copy.numel, numel);
        ZINF_ASSERT(copy.dtype != DType::kFloat32);
        copy_index = copy.dtype == DType::kBFloat16 ? 1 : 2;
    }
    // Adam without weight decay is AdamW without it; taking AdamW's path skips the 0 * p
    // term, which would turn an infinite parameter into NaN where PyTorch keeps it.
    OptimizerKind kind = params.kind;
    if (kind == OptimizerKind::kAdam && params.weight_decay == 0.0) kind = OptimizerKind::kAdamW;

    const detail::StepChunkFn fn = step_function(kind, params.amsgrad, grads.dtype, copy_index);
    if (fn == nullptr) {
        return Status::not_supported(str_cat("optimizer ", optimizer_kind_name(kind),
                                             ": no kernel for ", dtype_name(grads.dtype),
                                             " gradients", params.amsgrad ? " with amsgrad" : "",
                                             copy_index == 0 ? "" : " and a 16-bit copy"));
    }
    detail::StepArgs args{};
    args.params = state.params.data();
    for (std::size_t i = 0; i < kept; ++i) args.moments[i] = state.moments[i].data();
    args.grads = grads.data;
    args.param_copy = copy.data;
    args.c = detail::step_constants(params);
    loop_.run(chunk_count_for(numel), [&](std::size_t chunk) {
        const std::size_t begin = chunk * kChunkNumel;
        fn(args, begin, std::min(begin + kChunkNumel, numel));
    });
    return Status::ok();
}

Status OptimizerKernel::step(const OptimizerParams& params, const StoredState& state,
                             GradView grads, ParamCopy copy) const noexcept {
    if (state.dtype == StateDType::kFp32) return step(params, fp32_state_of(state), grads, copy);
    ZINF_TRY(validate(params));
    const std::size_t numel = state.params.size();
    const std::size_t kept = optimizer_descriptor(params.kind).kept_moment_count(params.amsgrad);
    detail::assert_stored_state(state, kept);
    ZINF_ASSERT_EQ(grads.numel, numel);
    if (numel > 0) ZINF_ASSERT(grads.data != nullptr);
    const int copy_index = detail::copy_index_for(copy, numel);
    // As the fp32 step: Adam without weight decay takes AdamW's path.
    OptimizerKind kind = params.kind;
    if (kind == OptimizerKind::kAdam && params.weight_decay == 0.0) kind = OptimizerKind::kAdamW;
    const auto index = static_cast<std::size_t>(kind);
    if (index >= kBuiltinOptimizerCount) {
        return Status::not_supported(str_cat("optimizer ", optimizer_kind_name(kind), ": no ",
                                             state_dtype_name(state.dtype),
                                             " state kernel (built-in optimizers only)"));
    }
    const detail::StateStepChunkFn fn =
        state_kernel_table(isa_)
            .step[static_cast<int>(state.dtype) - 1][index][params.amsgrad ? 1 : 0]
                 [static_cast<int>(grads.dtype)][copy_index];
    ZINF_ASSERT(fn != nullptr);
    const detail::StateStepArgs args = detail::state_step_args(params, state, grads, copy, kept);
    loop_.run(chunk_count_for(numel), [&](std::size_t chunk) {
        const std::size_t begin = chunk * kChunkNumel;
        fn(args, begin, std::min(begin + kChunkNumel, numel));
    });
    return Status::ok();
}

StoredState stored_state_view(StateDType dtype, std::span<float> params,
                              std::span<const std::span<std::byte>> moments,
                              std::uint64_t rounding_seed) noexcept {
    ZINF_ASSERT_LE(moments.size(), kMaxMoments);
    StoredState s;
    s.params = params;
    s.dtype = dtype;
    s.rounding_seed = rounding_seed;
    for (std::size_t i = 0; i < moments.size(); ++i) {
        const StoredMoment m = split_stored_moment(dtype, moments[i], params.size());
        s.moments[i] = m.elements;
        s.scales[i] = m.scales;
    }
    return s;
}

Status step_segments(const OptimizerKernel& kernel, const OptimizerParams& params,
                     const StoredState& chunk, std::uint64_t chunk_offset,
                     std::span<const StateSegment> segments, GradView grads,
                     ParamCopy copy) noexcept {
    const std::size_t numel = chunk.params.size();
    if (chunk.dtype == StateDType::kFp32 || numel == 0) {
        StoredState whole = chunk;
        whole.first_index = chunk_offset;
        return kernel.step(params, whole, grads, copy);
    }
    const StateSegment all{chunk_offset, numel, chunk_offset};
    if (segments.empty()) segments = std::span<const StateSegment>(&all, 1);
    const std::size_t eb = state_element_size_bytes(chunk.dtype);
    const std::size_t gb = dtype_size_bytes(grads.dtype);
    const std::uint64_t chunk_end = chunk_offset + numel;
    // The first segment that ends after chunk_offset.
    auto it = std::upper_bound(
        segments.begin(), segments.end(), chunk_offset,
        [](std::uint64_t at, const StateSegment& s) { return at < s.offset + s.numel; });
    std::uint64_t covered = chunk_offset;
    for (; it != segments.end() && it->offset < chunk_end; ++it) {
        const std::uint64_t lo = std::max(it->offset, chunk_offset);
        const std::uint64_t hi = std::min(it->offset + it->numel, chunk_end);
        ZINF_ASSERT_EQ(lo, covered);  // the segments cover the chunk without a gap
        const auto rel = static_cast<std::size_t>(lo - chunk_offset);
        const auto len = static_cast<std::size_t>(hi - lo);
        ZINF_ASSERT(rel % kStateBlockNumel == 0);
        StoredState part;
        part.params = chunk.params.subspan(rel, len);
        part.dtype = chunk.dtype;
        part.rounding_seed = chunk.rounding_seed;
        part.first_index = it->global_index + (lo - it->offset);
        for (std::size_t i = 0; i < kMaxMoments; ++i) {
            if (chunk.moments[i].empty()) continue;
            part.moments[i] = chunk.moments[i].subspan(rel * eb, len * eb);
            if (!chunk.scales[i].empty()) {
                part.scales[i] = chunk.scales[i].subspan(rel / kStateBlockNumel,
                                                         state_scale_count(chunk.dtype, len));
            }
        }
        const GradView g{static_cast<const std::byte*>(grads.data) + rel * gb, len, grads.dtype};
        ParamCopy c = ParamCopy::none();
        if (copy.data != nullptr) c = ParamCopy{copy.data + rel, len, copy.dtype};
        ZINF_TRY(kernel.step(params, part, g, c));
        covered = hi;
    }
    ZINF_ASSERT_EQ(covered, chunk_end);
    return Status::ok();
}

Result<OptimizerKind> register_optimizer(const OptimizerDescriptor& descriptor,
                                         const OptimizerKernelEntries& scalar,
                                         const OptimizerKernelEntries* avx2,
                                         const OptimizerKernelEntries* avx512) {
    ZINF_ASSIGN_OR_RETURN(const OptimizerKind kind, register_optimizer_descriptor(descriptor));
    RegisteredKernels& r = registered_kernels()[static_cast<std::size_t>(kind)];
    r.per_isa[static_cast<int>(Isa::kAvx2)].store(avx2, std::memory_order_release);
    r.per_isa[static_cast<int>(Isa::kAvx512)].store(avx512, std::memory_order_release);
    r.per_isa[static_cast<int>(Isa::kScalar)].store(&scalar, std::memory_order_release);
    return kind;
}

GradStats OptimizerKernel::grad_stats(GradView grads) const noexcept {
    if (grads.numel > 0) ZINF_ASSERT(grads.data != nullptr);
    const detail::SumSquaresChunkFn fn = table_->sum_squares[static_cast<int>(grads.dtype)];
    const std::size_t chunk_count = chunk_count_for(grads.numel);
    double partials[kReductionRoundChunks];
    double total = 0.0;
    for (std::size_t first = 0; first < chunk_count; first += kReductionRoundChunks) {
        const std::size_t count = std::min(kReductionRoundChunks, chunk_count - first);
        loop_.run(count, [&](std::size_t j) {
            const std::size_t begin = (first + j) * kChunkNumel;
            partials[j] = fn(grads.data, begin, std::min(begin + kChunkNumel, grads.numel));
        });
        for (std::size_t j = 0; j < count; ++j) total += partials[j];
    }
    // The squares of finite fp32 values are below 2^256 and sum exactly enough in double never
    // to overflow, so the sum is finite exactly when every gradient is.
    return GradStats{!std::isfinite(total), total};
}

}  // namespace zinf::kernels
