// Google Benchmark microbenchmarks of kernels::OptimizerKernel: AdamW steps and the gradient
// stats pass for every variant this CPU has, fp32 and bf16 gradients, 4 Ki to 64 Mi parameters,
// on one thread and on all cores. Small sizes show per-call overhead (arena entry, chunking),
// large ones memory bandwidth; `zinfinity-bench adam` gives the figure against the bound.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cast.h"
#include "kernels/cpu_features.h"
#include "kernels/optimizer.h"
#include "src/base/log.h"

namespace {

using zinf::DType;
using zinf::kernels::Isa;

// Arrays for one size, filled once per benchmark (first touch outside the timed loop).
struct Arrays {
    explicit Arrays(std::size_t numel)
        : params(numel),
          exp_avg(numel, 0.0f),
          exp_avg_sq(numel, 0.0f),
          grads(numel),
          grads_bf16(numel),
          copy(numel) {
        for (std::size_t i = 0; i < numel; ++i) {
            params[i] = static_cast<float>(i % 1000) * 1e-3f - 0.5f;
            grads[i] = static_cast<float>(i % 777) * 1e-5f - 3e-3f;
            grads_bf16[i] = zinf::kernels::float_to_bf16(grads[i]);
        }
    }
    std::vector<float> params, exp_avg, exp_avg_sq, grads;
    std::vector<std::uint16_t> grads_bf16, copy;
};

void bm_adamw_step(benchmark::State& state, Isa isa, DType grad_dtype, int threads) {
    const auto numel = static_cast<std::size_t>(state.range(0));
    auto kernel = zinf::kernels::OptimizerKernel::create(isa, threads);
    if (!kernel.has_value()) {
        state.SkipWithError(kernel.error().to_string().c_str());
        return;
    }
    Arrays a(numel);
    zinf::kernels::OptimizerParams params;
    params.weight_decay = 0.01;
    const auto grads = grad_dtype == DType::kFloat32 ? zinf::kernels::GradView::fp32(a.grads)
                                                     : zinf::kernels::GradView::bf16(a.grads_bf16);
    for (auto _ : state) {
        const zinf::Status s = kernel->step(params, {a.params, a.exp_avg, a.exp_avg_sq}, grads);
        if (!s.is_ok()) state.SkipWithError(s.to_string().c_str());
        ++params.step;
        benchmark::ClobberMemory();
    }
    const auto bytes_per_param = static_cast<std::int64_t>(24 + zinf::dtype_size_bytes(grad_dtype));
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(numel));
    state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(numel) *
                            bytes_per_param);
}

void bm_grad_stats(benchmark::State& state, Isa isa, int threads) {
    const auto numel = static_cast<std::size_t>(state.range(0));
    auto kernel = zinf::kernels::OptimizerKernel::create(isa, threads);
    if (!kernel.has_value()) {
        state.SkipWithError(kernel.error().to_string().c_str());
        return;
    }
    Arrays a(numel);
    for (auto _ : state) {
        benchmark::DoNotOptimize(kernel->grad_stats(zinf::kernels::GradView::fp32(a.grads)));
    }
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(numel));
    state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(numel) * 4);
}

void register_all() {
    for (const Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kScalar}) {
        if (!zinf::kernels::isa_supported(isa)) continue;
        const std::string isa_name(zinf::kernels::isa_name(isa));
        for (const int threads : {1, 0}) {
            const std::string t = threads == 0 ? "all" : "1";
            for (const DType g : {DType::kFloat32, DType::kBFloat16}) {
                const std::string name = zinf::str_cat("adamw/", isa_name, "/grad_",
                                                       zinf::dtype_name(g), "/threads_", t);
                benchmark::RegisterBenchmark(name.c_str(), bm_adamw_step, isa, g, threads)
                    ->RangeMultiplier(4)
                    ->Range(4 << 10, 64 << 20)
                    ->UseRealTime()
                    ->Unit(benchmark::kMicrosecond);
            }
            const std::string name = zinf::str_cat("grad_stats/", isa_name, "/threads_", t);
            benchmark::RegisterBenchmark(name.c_str(), bm_grad_stats, isa, threads)
                ->RangeMultiplier(4)
                ->Range(4 << 10, 64 << 20)
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond);
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    register_all();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
