// `zinfinity-bench gpt`: the GPT model's training step (forward + backward) on the CPU against
// OpenBLAS's own GEMM on the same shapes, and the cost of activation checkpointing, in one run.
// The step's GEMMs are recorded through a Compute that forwards every call to CpuCompute; the
// baseline replays exactly those GEMMs through cblas_sgemm with OpenBLAS's threads. Step,
// checkpointed step and baseline alternate in --pairs rounds; medians are reported.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "src/base/device_buffer.h"
#include "src/base/log.h"
#include "src/device/cpu_compute.h"
#include "src/device/cpu_device.h"
#include "src/model/gpt.h"
#include "src/model/parameter_store.h"
#include "tools/bench/commands.h"
#include "tools/bench/stats.h"
#include "tools/cli/args.h"

namespace zinf::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct GemmCall {
    Transpose ta, tb;
    std::size_t m, n, k, lda, ldb, ldc;
    float alpha, beta;
    double flops() const { return 2.0 * static_cast<double>(m * n * k); }
};

// Forwards every operation to `inner`; records the shapes of the GEMMs while recording.
class RecordingCompute final : public Compute {
public:
    explicit RecordingCompute(Compute& inner) : inner_(inner) {}
    bool recording = false;
    std::vector<GemmCall> calls;

    std::string_view name() const noexcept override { return inner_.name(); }
    Status gemm(Transpose ta, Transpose tb, std::size_t m, std::size_t n, std::size_t k,
                float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb,
                float beta, float* c, std::size_t ldc, StreamId s) override {
        if (recording) calls.push_back({ta, tb, m, n, k, lda, ldb, ldc, alpha, beta});
        return inner_.gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, s);
    }
    Status bias_add(float* y, const float* bias, std::size_t r, std::size_t c,
                    StreamId s) override {
        return inner_.bias_add(y, bias, r, c, s);
    }
    Status bias_grad(const float* dy, std::size_t r, std::size_t c, float* g, StreamId s) override {
        return inner_.bias_grad(dy, r, c, g, s);
    }
    Status relu_forward(const float* x, float* y, std::size_t n, StreamId s) override {
        return inner_.relu_forward(x, y, n, s);
    }
    Status relu_backward(const float* x, const float* dy, float* dx, std::size_t n,
                         StreamId s) override {
        return inner_.relu_backward(x, dy, dx, n, s);
    }
    Status gelu_forward(const float* x, float* y, std::size_t n, StreamId s) override {
        return inner_.gelu_forward(x, y, n, s);
    }
    Status gelu_backward(const float* x, const float* dy, float* dx, std::size_t n,
                         StreamId s) override {
        return inner_.gelu_backward(x, dy, dx, n, s);
    }
    Status layer_norm_forward(const float* x, const float* g, const float* b, float eps,
                              std::size_t r, std::size_t c, float* y, float* mean, float* rstd,
                              StreamId s) override {
        return inner_.layer_norm_forward(x, g, b, eps, r, c, y, mean, rstd, s);
    }
    Status layer_norm_backward(const float* x, const float* g, const float* mean, const float* rstd,
                               const float* dy, std::size_t r, std::size_t c, float* dx, float* gg,
                               float* gb, StreamId s) override {
        return inner_.layer_norm_backward(x, g, mean, rstd, dy, r, c, dx, gg, gb, s);
    }
    Status dropout_forward(const float* x, float* y, std::uint8_t* mask, std::size_t n, float p,
                           std::uint64_t seed, std::uint64_t step, StreamId s) override {
        return inner_.dropout_forward(x, y, mask, n, p, seed, step, s);
    }
    Status dropout_backward(const float* dy, const std::uint8_t* mask, float* dx, std::size_t n,
                            float p, StreamId s) override {
        return inner_.dropout_backward(dy, mask, dx, n, p, s);
    }
    Status softmax_cross_entropy_forward(const float* logits, const std::int32_t* labels,
                                         std::size_t r, std::size_t c, float* probs, float* loss,
                                         StreamId s) override {
        return inner_.softmax_cross_entropy_forward(logits, labels, r, c, probs, loss, s);
    }
    Status softmax_cross_entropy_backward(const float* probs, const std::int32_t* labels,
                                          std::size_t r, std::size_t c, float scale, float* d,
                                          StreamId s) override {
        return inner_.softmax_cross_entropy_backward(probs, labels, r, c, scale, d, s);
    }
    Status count_correct(const float* logits, const std::int32_t* labels, std::size_t r,
                         std::size_t c, std::uint64_t* count, bool acc, StreamId s) override {
        return inner_.count_correct(logits, labels, r, c, count, acc, s);
    }
    Status embedding_forward(const std::int32_t* t, const float* table, const float* pos,
                             std::size_t r, std::size_t period, std::size_t c, std::size_t v,
                             float* y, StreamId s) override {
        return inner_.embedding_forward(t, table, pos, r, period, c, v, y, s);
    }
    Status embedding_backward(const std::int32_t* t, const float* dy, std::size_t r,
                              std::size_t period, std::size_t c, std::size_t v, float* gt,
                              float* gp, StreamId s) override {
        return inner_.embedding_backward(t, dy, r, period, c, v, gt, gp, s);
    }
    Status causal_softmax_forward(float* x, std::size_t n, std::size_t ld, StreamId s) override {
        return inner_.causal_softmax_forward(x, n, ld, s);
    }
    Status causal_softmax_backward(const float* p, float* dp, std::size_t n, std::size_t ld,
                                   StreamId s) override {
        return inner_.causal_softmax_backward(p, dp, n, ld, s);
    }
    Status scale(float* x, std::size_t n, float alpha, StreamId s) override {
        return inner_.scale(x, n, alpha, s);
    }
    Status axpy(float alpha, const float* x, float* y, std::size_t n, StreamId s) override {
        return inner_.axpy(alpha, x, y, n, s);
    }
    Status cast(const void* src, DType sd, void* dst, DType dd, std::size_t n,
                StreamId s) override {
        return inner_.cast(src, sd, dst, dd, n, s);
    }
    Status sum_squares(const float* x, std::size_t n, SumSquares* out, bool acc,
                       StreamId s) override {
        return inner_.sum_squares(x, n, out, acc, s);
    }

private:
    Compute& inner_;
};

struct GptBenchOptions {
    model::GptConfig model;
    int threads = 0;
    int pairs = 5;
    double min_gemm_ratio = 0;
    double max_checkpoint_ratio = 0;
};

void declare_flags(cli::Args& args) {
    args.add("n-layer", "4", "transformer blocks");
    args.add("n-head", "4", "attention heads (dividing --d-model)");
    args.add("d-model", "128", "embedding width");
    args.add("seq-len", "128", "context length (bytes)");
    args.add("batch", "16", "sequences per step (configs/gpt-small.json's micro-batch)");
    args.add("threads", "0", "compute threads, ours and OpenBLAS's baseline (0: all cores)");
    args.add("pairs", "5", "rounds of (step, checkpointed step, OpenBLAS replay)");
    args.add("min-gemm-ratio", "0",
             "exit with status 1 when the step's GEMM FLOP/s over OpenBLAS's on the same\n"
             "shapes is below this (0: report only)");
    args.add("max-checkpoint-ratio", "0",
             "exit with status 1 when the checkpointed step takes more than this many times\n"
             "the plain one (0: report only)");
}

Result<GptBenchOptions> parse_options(const cli::Args& args) {
    GptBenchOptions o;
    ZINF_ASSIGN_OR_RETURN(const auto layers, args.get_int("n-layer", 1, 4096));
    ZINF_ASSIGN_OR_RETURN(const auto heads, args.get_int("n-head", 1, 4096));
    ZINF_ASSIGN_OR_RETURN(const auto width, args.get_int("d-model", 1, 1 << 16));
    ZINF_ASSIGN_OR_RETURN(const auto seq, args.get_int("seq-len", 1, 1 << 16));
    ZINF_ASSIGN_OR_RETURN(const auto batch, args.get_int("batch", 1, 1 << 16));
    ZINF_ASSIGN_OR_RETURN(const auto threads, args.get_int("threads", 0, 4096));
    ZINF_ASSIGN_OR_RETURN(const auto pairs, args.get_int("pairs", 1, 1000));
    o.model.n_layer = static_cast<std::size_t>(layers);
    o.model.n_head = static_cast<std::size_t>(heads);
    o.model.d_model = static_cast<std::size_t>(width);
    o.model.seq_len = static_cast<std::size_t>(seq);
    o.model.batch_rows_max = static_cast<std::size_t>(batch);
    if (o.model.d_model % o.model.n_head != 0) {
        return Status::invalid_argument(str_cat("--d-model: ", o.model.d_model,
                                                " is not divisible by --n-head ", o.model.n_head));
    }
    o.threads = threads == 0 ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))
                             : static_cast<int>(threads);
    o.pairs = static_cast<int>(pairs);
    ZINF_ASSIGN_OR_RETURN(o.min_gemm_ratio, args.get_double("min-gemm-ratio", 0.0, 100.0));
    ZINF_ASSIGN_OR_RETURN(o.max_checkpoint_ratio,
                          args.get_double("max-checkpoint-ratio", 0.0, 100.0));
    return o;
}

// One model with its parameters, on the shared device and compute.
struct Trained {
    std::unique_ptr<model::Gpt> gpt;
    std::unique_ptr<model::DeviceParameterStore> store;
};

Result<Trained> make_model(const model::GptConfig& config, Device& device, Compute& compute) {
    Trained t;
    ZINF_ASSIGN_OR_RETURN(t.gpt, model::Gpt::create(config, device));
    ZINF_ASSIGN_OR_RETURN(
        t.store, model::DeviceParameterStore::create(t.gpt->parameters(), device, compute));
    ZINF_TRY(t.store->initialize(1234, 0));
    return t;
}

// One forward + backward; returns the loss.
Result<float> step(Trained& t, Compute& compute, const std::int32_t* tokens,
                   const std::int32_t* labels, std::size_t rows, std::uint64_t step_index) {
    model::Context ctx{compute, *t.store, *t.store};
    ctx.step = step_index;
    ZINF_TRY(t.store->zero_gradients(0));
    ZINF_TRY(t.gpt->forward(ctx, tokens, labels, rows));
    ZINF_TRY(t.gpt->backward(ctx, 1.0f));
    return t.gpt->read_loss(0);
}

// The recorded GEMMs through cblas_sgemm, with OpenBLAS's own threading.
class Replay {
public:
    explicit Replay(const std::vector<GemmCall>& calls) : calls_(calls) {
        std::size_t a = 0, b = 0, c = 0;
        for (const GemmCall& g : calls) {
            a = std::max(a, (g.ta == Transpose::kNo ? g.m : g.k) * g.lda);
            b = std::max(b, (g.tb == Transpose::kNo ? g.k : g.n) * g.ldb);
            c = std::max(c, g.m * g.ldc);
        }
        std::mt19937 rng(7);
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        for (auto* v : {&a_, &b_, &c_}) v->resize(v == &a_ ? a : v == &b_ ? b : c);
        for (auto* v : {&a_, &b_, &c_}) {
            for (float& x : *v) x = dist(rng);
        }
    }
    double run(int threads) {
        openblas_set_num_threads(threads);
        const auto t0 = Clock::now();
        for (const GemmCall& g : calls_) {
            cblas_sgemm(CblasRowMajor, g.ta == Transpose::kYes ? CblasTrans : CblasNoTrans,
                        g.tb == Transpose::kYes ? CblasTrans : CblasNoTrans, static_cast<int>(g.m),
                        static_cast<int>(g.n), static_cast<int>(g.k), g.alpha, a_.data(),
                        static_cast<int>(g.lda), b_.data(), static_cast<int>(g.ldb), g.beta,
                        c_.data(), static_cast<int>(g.ldc));
        }
        const double s = seconds_since(t0);
        openblas_set_num_threads(1);  // CpuCompute's setting: one BLAS thread per tile
        return s;
    }

private:
    const std::vector<GemmCall>& calls_;
    std::vector<float> a_, b_, c_;
};

// The run's device, compute and the two models it times (plain and checkpointed), with one
// batch of tokens and labels on the device.
struct GptRig {
    std::unique_ptr<device::CpuDevice> device;
    std::unique_ptr<device::CpuCompute> cpu;
    std::unique_ptr<RecordingCompute> compute;  // over `cpu`; both models run through it
    Trained plain;
    Trained ckpt;
    DeviceBuffer tokens;
    DeviceBuffer labels;
    std::size_t rows = 0;

    Result<float> run_step(Trained& t, std::uint64_t step_index) {
        return step(t, *compute, tokens.as<std::int32_t>(), labels.as<std::int32_t>(), rows,
                    step_index);
    }
};

// Set up: the CPU device and compute, both models, and a batch of random bytes.
Result<GptRig> set_up(const GptBenchOptions& o) {
    GptRig r;
    device::CpuDeviceOptions dopt;
    dopt.budget_bytes = std::size_t{16} << 30;
    ZINF_ASSIGN_OR_RETURN(r.device, device::CpuDevice::create(dopt));
    ZINF_ASSIGN_OR_RETURN(
        r.cpu, device::CpuCompute::create(r.device.get(), device::CpuComputeOptions{o.threads}));
    r.compute = std::make_unique<RecordingCompute>(*r.cpu);
    model::GptConfig plain_config = o.model;
    model::GptConfig ckpt_config = o.model;
    ckpt_config.checkpoint_activations = true;
    ZINF_ASSIGN_OR_RETURN(r.plain, make_model(plain_config, *r.device, *r.compute));
    ZINF_ASSIGN_OR_RETURN(r.ckpt, make_model(ckpt_config, *r.device, *r.compute));

    r.rows = o.model.batch_rows_max;
    const std::size_t n = r.rows * o.model.seq_len;
    std::vector<std::int32_t> tokens(n), labels(n);
    std::mt19937 rng(3);
    for (std::size_t i = 0; i < n; ++i) {
        tokens[i] = static_cast<std::int32_t>(rng() % 256);
        labels[i] = static_cast<std::int32_t>(rng() % 256);
    }
    ZINF_ASSIGN_OR_RETURN(r.tokens, DeviceBuffer::allocate(*r.device, n * 4, "tokens"));
    ZINF_ASSIGN_OR_RETURN(r.labels, DeviceBuffer::allocate(*r.device, n * 4, "labels"));
    ZINF_TRY(r.device->copy_to_device(r.tokens.data(), tokens.data(), n * 4, 0));
    ZINF_TRY(r.device->copy_to_device(r.labels.data(), labels.data(), n * 4, 0));
    ZINF_TRY(r.device->synchronize(0));
    return r;
}

// Warm-up, the GEMM record, and the check that the recompute is exact: one step of each model,
// the plain one recorded. Returns the FLOPs of the recorded GEMMs.
Result<double> record_step(GptRig& r) {
    r.compute->recording = true;
    ZINF_ASSIGN_OR_RETURN(const float loss_plain, r.run_step(r.plain, 1));
    r.compute->recording = false;
    ZINF_ASSIGN_OR_RETURN(const float loss_ckpt, r.run_step(r.ckpt, 1));
    // Bitwise: the checkpointed pass must reproduce the plain one exactly.
    // NOLINTNEXTLINE(bugprone-suspicious-memory-comparison)
    if (std::memcmp(&loss_plain, &loss_ckpt, sizeof(float)) != 0) {
        return Status::internal(
            str_cat("checkpointed loss ", loss_ckpt, " differs from ", loss_plain));
    }
    double flops = 0;
    for (const GemmCall& g : r.compute->calls) flops += g.flops();
    return flops;
}

// Seconds of each leg per round.
struct RoundFigures {
    std::vector<double> plain_s, ckpt_s, blas_s, gemm_ratio, ckpt_ratio;
};

// Measure: --pairs rounds of (step, checkpointed step, OpenBLAS replay), each round's line
// printed as it completes.
Result<RoundFigures> measure_rounds(const GptBenchOptions& o, GptRig& r, Replay& replay,
                                    double flops) {
    RoundFigures f;
    for (int p = 0; p < o.pairs; ++p) {
        // Rotate the order so no leg always runs first.
        double tp = 0, tc = 0, tb = 0;
        for (int leg = 0; leg < 3; ++leg) {
            const int which = (leg + p) % 3;
            const auto t0 = Clock::now();
            if (which == 0) {
                ZINF_TRY(r.run_step(r.plain, 2).status());
                tp = seconds_since(t0);
            } else if (which == 1) {
                ZINF_TRY(r.run_step(r.ckpt, 2).status());
                tc = seconds_since(t0);
            } else {
                tb = replay.run(o.threads);
            }
        }
        f.plain_s.push_back(tp);
        f.ckpt_s.push_back(tc);
        f.blas_s.push_back(tb);
        f.gemm_ratio.push_back(tb / tp);
        f.ckpt_ratio.push_back(tc / tp);
        std::printf(
            "  round %d: step %.1f ms (%.1f GFLOP/s of GEMM), checkpointed %.1f ms "
            "(x%.3f), OpenBLAS on the same GEMMs %.1f ms (%.1f GFLOP/s)\n",
            p + 1, 1e3 * tp, flops / tp / 1e9, 1e3 * tc, tc / tp, 1e3 * tb, flops / tb / 1e9);
    }
    return f;
}

// Report: the medians against their targets; the status of --min-gemm-ratio and
// --max-checkpoint-ratio.
Status report(const GptBenchOptions& o, const GptRig& r, const RoundFigures& f, double flops) {
    const double gr = median(f.gemm_ratio);
    const double cr = median(f.ckpt_ratio);
    std::printf(
        "summary: step %.1f ms = %.1f GFLOP/s of its GEMMs; OpenBLAS alone on the same "
        "GEMMs %.1f GFLOP/s; ratio %.3f (target >= 0.7: %s)\n",
        1e3 * median(f.plain_s), flops / median(f.plain_s) / 1e9, flops / median(f.blas_s) / 1e9,
        gr, gr >= 0.7 ? "met" : "NOT met");
    std::printf(
        "summary: checkpointed step %.1f ms, x%.3f the plain step (target <= 1.4: %s); "
        "activations kept %.1f MiB -> %.1f MiB\n",
        1e3 * median(f.ckpt_s), cr, cr <= 1.4 ? "met" : "NOT met",
        static_cast<double>(r.plain.gpt->kept_activation_bytes()) / (1 << 20),
        static_cast<double>(r.ckpt.gpt->kept_activation_bytes()) / (1 << 20));
    if (o.min_gemm_ratio > 0 && gr < o.min_gemm_ratio) {
        return Status::internal(
            str_cat("GEMM ratio ", gr, " below --min-gemm-ratio ", o.min_gemm_ratio));
    }
    if (o.max_checkpoint_ratio > 0 && cr > o.max_checkpoint_ratio) {
        return Status::internal(str_cat("checkpoint ratio ", cr, " above --max-checkpoint-ratio ",
                                        o.max_checkpoint_ratio));
    }
    return Status::ok();
}

Status run(const GptBenchOptions& o) {
    ZINF_ASSIGN_OR_RETURN(GptRig rig, set_up(o));
    ZINF_ASSIGN_OR_RETURN(const double flops, record_step(rig));
    Replay replay(rig.compute->calls);
    replay.run(o.threads);
    std::printf(
        "gpt %zu layers x d_model %zu (%zu heads), %zu x %zu tokens per step, %d "
        "threads; %s\n",
        o.model.n_layer, o.model.d_model, o.model.n_head, rig.rows, o.model.seq_len, o.threads,
        rig.cpu->name().data());
    std::printf("  %zu GEMMs per step, %.2f GFLOP\n", rig.compute->calls.size(), flops / 1e9);
    ZINF_ASSIGN_OR_RETURN(const RoundFigures figures, measure_rounds(o, rig, replay, flops));
    return report(o, rig, figures, flops);
}

}  // namespace

int run_gpt(int argc, char** argv) {
    cli::Args args(
        "zinfinity-bench gpt [flags]",
        "Times the GPT model's training step (forward + backward, CPU device) and compares it\n"
        "with OpenBLAS alone running exactly the step's GEMMs (recorded from the step, replayed\n"
        "through cblas_sgemm with OpenBLAS's own threads): the step's GEMM FLOP/s over\n"
        "OpenBLAS's on the same shapes. Also times the step with activation checkpointing\n"
        "(each block recomputed in backward) and checks its loss is bitwise the same.");
    declare_flags(args);
    constexpr std::string_view kProgram = "zinfinity-bench gpt";
    if (auto exit_code = args.parse_or_exit(argc, argv, kProgram)) return *exit_code;
    auto options = parse_options(args);
    if (!options.has_value()) return cli::report_error(kProgram, options.error());
    const Status status = run(*options);
    return status.is_ok() ? 0 : cli::report_error(kProgram, status, 1);
}

}  // namespace zinf::bench
