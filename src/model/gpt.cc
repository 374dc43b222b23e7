// Gpt: construction and workspace sizing, the block's forward and backward, attention one head
// at a time, and activation checkpointing (recompute, host-kept block inputs).
#include "src/model/gpt.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "src/base/log.h"
#include "src/base/philox.h"
#include "src/model/fetched.h"

namespace zinf::model {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

// GPT-2 draws embeddings from N(0, 0.02); a uniform of the same standard deviation keeps the
// registry's two init rules.
constexpr float kEmbeddingBound = 0.02f * 1.7320508f;  // 0.02 * sqrt(3)

}  // namespace

// The modules of one transformer block.
struct Gpt::Block {
    std::unique_ptr<LayerNorm> ln_1;
    std::unique_ptr<Linear> c_attn;  // d -> 3d: q, k, v side by side in each row
    std::unique_ptr<Linear> c_proj;
    std::unique_ptr<Dropout> drop_attn;
    std::unique_ptr<LayerNorm> ln_2;
    std::unique_ptr<Linear> c_fc;  // d -> 4d
    std::unique_ptr<Gelu> gelu;
    std::unique_ptr<Linear> mlp_proj;  // 4d -> d
    std::unique_ptr<Dropout> drop_mlp;
};

// The insides of one block's forward, kept for its backward: one per block without
// checkpointing, one shared by every block (and refilled by the recompute) with it. Backward
// reuses them for the gradients as they fall free (15 floats per token and d_model in all).
struct Gpt::Workspace {
    DeviceBuffer h1, qkv, att, x1, h2, u, g;
    std::size_t rows = 0;  // token rows of the last forward through it
};

Gpt::Gpt(const GptConfig& config, Device& device) : config_(config), device_(device) {}

Gpt::~Gpt() {
    if (host_registered_) {
        const Status ignored = device_.unregister_host_memory(host_kept_.data());
        (void)ignored;
    }
}

// What create allocates, from the config alone: no allocation, no failure. With checkpointing
// one workspace serves every block (refilled by the recompute) and only the block inputs are
// kept; kept off the device (kHost, kStore), they pass through two device slots in turn.
struct Gpt::Layout {
    std::size_t token_rows = 0;          // batch_rows_max x seq_len, the largest batch's
    std::size_t input_bytes = 0;         // one block input: token_rows x d_model floats
    std::size_t workspace_count = 0;     // one per block, or one shared
    std::size_t device_input_count = 0;  // block inputs on the device: n_layer + 1, or 2
    bool inputs_contiguous = false;      // the device block inputs in one allocation
    bool inputs_on_host = false;         // kHost: n_layer inputs in pinned host memory
    // ln_f's output, the logits and the loss's probabilities in the shared workspace's h1, u
    // and g (create's wire_head says when and why).
    bool head_in_workspace = false;
};

Gpt::Layout Gpt::layout_for(const GptConfig& config) noexcept {
    const bool checkpoint = config.checkpoint_activations;
    const bool off_device = checkpoint && config.checkpoint_place != CheckpointPlace::kDevice;
    Layout layout;
    layout.token_rows = config.batch_rows_max * config.seq_len;
    layout.input_bytes = layout.token_rows * config.d_model * sizeof(float);
    layout.workspace_count = checkpoint ? 1 : config.n_layer;
    layout.device_input_count = off_device ? 2 : config.n_layer + 1;
    layout.inputs_contiguous = config.contiguous_checkpoints || off_device;
    layout.inputs_on_host = checkpoint && config.checkpoint_place == CheckpointPlace::kHost;
    layout.head_in_workspace = checkpoint && config.vocab <= 4 * config.d_model;
    return layout;
}

Status Gpt::check_config(const GptConfig& config, const Layout& layout,
                         const ActivationStore* store) {
    const auto positive = [](std::size_t v, const char* key) -> Status {
        if (v == 0) return Status::invalid_argument(str_cat(key, ": must be > 0"));
        return Status::ok();
    };
    ZINF_TRY(positive(config.vocab, "model.vocab"));
    ZINF_TRY(positive(config.n_layer, "model.n_layer"));
    ZINF_TRY(positive(config.n_head, "model.n_head"));
    ZINF_TRY(positive(config.d_model, "model.d_model"));
    ZINF_TRY(positive(config.seq_len, "model.seq_len"));
    ZINF_TRY(positive(config.batch_rows_max, "train_micro_batch_size_per_gpu"));
    if (config.d_model % config.n_head != 0) {
        return Status::invalid_argument(str_cat("model.d_model: ", config.d_model,
                                                " is not divisible by model.n_head (",
                                                config.n_head, ")"));
    }
    if (!(config.dropout >= 0.0f && config.dropout < 1.0f)) {
        return Status::invalid_argument(
            str_cat("model.dropout: expected [0, 1), got ", config.dropout));
    }
    if (!(config.layer_norm_eps > 0.0f)) {
        return Status::invalid_argument("model.layer_norm_eps: must be > 0");
    }
    if (config.checkpoint_activations && config.checkpoint_place == CheckpointPlace::kStore &&
        (store == nullptr || store->input_count() < config.n_layer ||
         store->input_bytes() < layout.input_bytes)) {
        return Status::invalid_argument(
            str_cat("activation_checkpointing.nvme_checkpointing: the activation store must hold ",
                    config.n_layer, " inputs of ", layout.input_bytes, " bytes"));
    }
    return Status::ok();
}

Result<std::unique_ptr<Gpt>> Gpt::create(const GptConfig& config, Device& device,
                                         std::unique_ptr<ActivationStore> store) {
    const Layout layout = layout_for(config);
    ZINF_TRY(check_config(config, layout, store.get()));
    auto gpt = std::unique_ptr<Gpt>(new Gpt(config, device));
    gpt->store_ = std::move(store);
    ZINF_TRY(gpt->add_modules(layout));
    ZINF_TRY(gpt->allocate_workspaces(layout));
    ZINF_TRY(gpt->allocate_block_inputs(layout));
    // kept_activation_bytes(): everything allocated so far, the workspaces and block inputs.
    gpt->kept_device_bytes_ = gpt->workspace_bytes_;
    ZINF_TRY(gpt->pin_host_inputs(layout));
    ZINF_TRY(gpt->wire_head(layout));
    ZINF_TRY(gpt->allocate_gradients(layout));
    ZINF_ASSIGN_OR_RETURN(gpt->scalars_, DeviceBuffer::allocate(device, 64, "gpt: loss"));
    // The loss's probabilities (rows x vocab) are the SoftmaxCrossEntropy's, unless borrowed.
    gpt->workspace_bytes_ +=
        64 + (layout.head_in_workspace ? 0 : layout.token_rows * config.vocab * sizeof(float));
    return gpt;
}

std::vector<std::vector<ParamId>> Gpt::fetch_groups() const {
    std::vector<std::vector<ParamId>> groups = groups_by_module(registry_);
    groups.push_back({wte_, wpe_});  // the embedding's forward holds both
    return groups;
}

// The seed of dropout module `index`: 0 for the embeddings', 2i + 1 and 2i + 2 for block i's
// attention and MLP branches.
std::uint64_t Gpt::dropout_seed(std::size_t index) const noexcept {
    return philox::mix64(config_.seed ^ philox::mix64(index + 1));
}

Status Gpt::add_modules(const Layout& layout) {
    const std::size_t d = config_.d_model;
    const std::size_t n = layout.token_rows;
    wte_ = registry_.add("wte.weight", {config_.vocab, d},
                         InitRule{InitKind::kUniform, kEmbeddingBound});
    wpe_ = registry_.add("wpe.weight", {config_.seq_len, d},
                         InitRule{InitKind::kUniform, kEmbeddingBound});
    ZINF_ASSIGN_OR_RETURN(embed_dropout_,
                          Dropout::create(device_, d, n, config_.dropout, dropout_seed(0)));
    grad_scratch_numel_ = config_.seq_len * d;  // wpe's gradient
    for (std::size_t i = 0; i < config_.n_layer; ++i) ZINF_TRY(add_block(i, n));
    ZINF_ASSIGN_OR_RETURN(
        ln_f_, LayerNorm::create(registry_, device_, "ln_f", d, n, config_.layer_norm_eps));
    return Status::ok();
}

// Registers block i's parameters, creates its modules for batches of up to n token rows and
// widens the gradient scratch to its largest parameter's.
Status Gpt::add_block(std::size_t i, std::size_t n) {
    const std::size_t d = config_.d_model;
    const float eps = config_.layer_norm_eps;
    ParameterRegistry& reg = registry_;
    auto b = std::make_unique<Block>();
    const std::string p = str_cat("blocks.", i, ".");
    ZINF_ASSIGN_OR_RETURN(b->ln_1, LayerNorm::create(reg, device_, p + "ln_1", d, n, eps));
    b->c_attn = Linear::create(reg, p + "attn.c_attn", d, 3 * d);
    b->c_proj = Linear::create(reg, p + "attn.c_proj", d, d);
    ZINF_ASSIGN_OR_RETURN(b->drop_attn,
                          Dropout::create(device_, d, n, config_.dropout, dropout_seed(2 * i + 1)));
    ZINF_ASSIGN_OR_RETURN(b->ln_2, LayerNorm::create(reg, device_, p + "ln_2", d, n, eps));
    b->c_fc = Linear::create(reg, p + "mlp.c_fc", d, 4 * d);
    b->gelu = std::make_unique<Gelu>(4 * d);
    b->mlp_proj = Linear::create(reg, p + "mlp.c_proj", 4 * d, d);
    ZINF_ASSIGN_OR_RETURN(b->drop_mlp,
                          Dropout::create(device_, d, n, config_.dropout, dropout_seed(2 * i + 2)));
    grad_scratch_numel_ =
        std::max({grad_scratch_numel_, b->c_fc->grad_scratch_numel(),
                  b->mlp_proj->grad_scratch_numel(), b->c_attn->grad_scratch_numel()});
    blocks_.push_back(std::move(b));
    return Status::ok();
}

Status Gpt::allocate(DeviceBuffer& buffer, std::size_t numel, const char* what) {
    ZINF_ASSIGN_OR_RETURN(buffer, DeviceBuffer::allocate(device_, numel * sizeof(float), what));
    workspace_bytes_ += numel * sizeof(float);
    return Status::ok();
}

Status Gpt::allocate_workspaces(const Layout& layout) {
    const std::size_t n = layout.token_rows;
    const std::size_t d = config_.d_model;
    for (std::size_t i = 0; i < layout.workspace_count; ++i) {
        auto ws = std::make_unique<Workspace>();
        ZINF_TRY(allocate(ws->h1, n * d, "gpt: activations"));
        ZINF_TRY(allocate(ws->qkv, n * 3 * d, "gpt: activations"));
        ZINF_TRY(allocate(ws->att, n * d, "gpt: activations"));
        ZINF_TRY(allocate(ws->x1, n * d, "gpt: activations"));
        ZINF_TRY(allocate(ws->h2, n * d, "gpt: activations"));
        ZINF_TRY(allocate(ws->u, n * 4 * d, "gpt: activations"));
        ZINF_TRY(allocate(ws->g, n * 4 * d, "gpt: activations"));
        workspaces_.push_back(std::move(ws));
    }
    return Status::ok();
}

// Block inputs: all n_layer + 1 on the device, or two (the current input and output) when
// the kept ones live in host memory or the store.
Status Gpt::allocate_block_inputs(const Layout& layout) {
    const std::size_t numel = layout.token_rows * config_.d_model;
    if (layout.inputs_contiguous) {
        return allocate(kept_, layout.device_input_count * numel, "gpt: block inputs");
    }
    kept_each_.resize(layout.device_input_count);
    for (DeviceBuffer& b : kept_each_) ZINF_TRY(allocate(b, numel, "gpt: block inputs"));
    return Status::ok();
}

// kHost: the n_layer kept inputs in host memory, registered with the device for its copies.
Status Gpt::pin_host_inputs(const Layout& layout) {
    if (!layout.inputs_on_host) return Status::ok();
    ZINF_ASSIGN_OR_RETURN(host_kept_,
                          AlignedBuffer::allocate(config_.n_layer * layout.input_bytes));
    ZINF_TRY(device_.register_host_memory(host_kept_.span())
                 .with_context("gpt: pinning the host checkpoints"));
    host_registered_ = true;
    return Status::ok();
}

// With checkpointing the one workspace is idle while the head runs (after the last block in
// forward, before the first recompute in backward), so the final norm's output, the logits
// and the loss's probabilities live in its h1, u and g when the vocabulary fits in 4 x
// d_model: at gpt-small's shape that is a sixth of the device peak.
Status Gpt::wire_head(const Layout& layout) {
    const std::size_t n = layout.token_rows;
    float* probabilities = nullptr;
    if (layout.head_in_workspace) {
        Workspace& ws = *workspaces_.front();
        hf_ = ws.h1.as<float>();
        logits_ = ws.u.as<float>();
        probabilities = ws.g.as<float>();
    } else {
        ZINF_TRY(allocate(hf_own_, n * config_.d_model, "gpt: final norm"));
        ZINF_TRY(allocate(logits_own_, n * config_.vocab, "gpt: logits"));
        hf_ = hf_own_.as<float>();
        logits_ = logits_own_.as<float>();
    }
    ZINF_ASSIGN_OR_RETURN(loss_,
                          SoftmaxCrossEntropy::create(device_, config_.vocab, n, probabilities));
    return Status::ok();
}

// Backward's gradients, one head's attention scores and the gradient scratch add_modules sized.
Status Gpt::allocate_gradients(const Layout& layout) {
    const std::size_t n = layout.token_rows;
    const std::size_t d = config_.d_model;
    const std::size_t t = config_.seq_len;
    ZINF_TRY(allocate(grad_x_, n * d, "gpt: gradients"));
    ZINF_TRY(allocate(grad_t_, n * d, "gpt: gradients"));
    ZINF_TRY(allocate(grad_u_, n * d, "gpt: gradients"));
    ZINF_TRY(allocate(scores_, t * t, "gpt: attention scores"));
    ZINF_TRY(allocate(dscores_, t * t, "gpt: attention scores"));
    ZINF_TRY(allocate(wte_grad_, config_.vocab * d, "gpt: embedding gradient"));
    return allocate(grad_scratch_, grad_scratch_numel_, "gpt: gradient scratch");
}

Context Gpt::with_scratch(const Context& ctx) const {
    Context inner = ctx;
    inner.grad_scratch = grad_scratch_.as<float>();
    inner.grad_scratch_numel = grad_scratch_numel_;
    return inner;
}

float* Gpt::block_input(std::size_t i) const noexcept {
    const std::size_t numel = config_.batch_rows_max * config_.seq_len * config_.d_model;
    const std::size_t slot = inputs_off_device() ? i % 2 : i;
    if (!kept_each_.empty()) return kept_each_[slot].as<float>();
    return kept_.as<float>() + slot * numel;
}

Gpt::Workspace& Gpt::workspace(std::size_t block) noexcept {
    return *workspaces_[config_.checkpoint_activations ? 0 : block];
}

Status Gpt::attention_forward(const Context& ctx, const Workspace& ws) {
    const std::size_t t = config_.seq_len;
    const std::size_t d = config_.d_model;
    const std::size_t hd = d / config_.n_head;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    float* s = scores_.as<float>();
    const std::size_t sequences = ws.rows / t;
    for (std::size_t b = 0; b < sequences; ++b) {
        const float* qkv = ws.qkv.as<float>() + b * t * 3 * d;
        float* out = ws.att.as<float>() + b * t * d;
        for (std::size_t h = 0; h < config_.n_head; ++h) {
            const float* q = qkv + h * hd;
            const float* k = qkv + d + h * hd;
            const float* v = qkv + 2 * d + h * hd;
            // s = scale * q k^T (t x t), then the causal softmax in place, then out_h = p v.
            ZINF_TRY(ctx.compute.gemm(Transpose::kNo, Transpose::kYes, t, t, hd, scale, q, 3 * d, k,
                                      3 * d, 0.0f, s, t, ctx.stream));
            ZINF_TRY(ctx.compute.causal_softmax_forward(s, t, t, ctx.stream));
            ZINF_TRY(ctx.compute.gemm(Transpose::kNo, Transpose::kNo, t, hd, t, 1.0f, s, t, v,
                                      3 * d, 0.0f, out + h * hd, d, ctx.stream));
        }
    }
    return Status::ok();
}

Status Gpt::attention_backward(const Context& ctx, const Workspace& ws, const float* datt,
                               float* dqkv) {
    const std::size_t t = config_.seq_len;
    const std::size_t d = config_.d_model;
    const std::size_t hd = d / config_.n_head;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    float* p = scores_.as<float>();
    float* dp = dscores_.as<float>();
    const std::size_t sequences = ws.rows / t;
    for (std::size_t b = 0; b < sequences; ++b) {
        const float* qkv = ws.qkv.as<float>() + b * t * 3 * d;
        const float* dout = datt + b * t * d;
        float* dq_base = dqkv + b * t * 3 * d;
        for (std::size_t h = 0; h < config_.n_head; ++h) {
            const float* q = qkv + h * hd;
            const float* k = qkv + d + h * hd;
            const float* v = qkv + 2 * d + h * hd;
            const float* doh = dout + h * hd;
            // The probabilities again (the forward kept none).
            ZINF_TRY(ctx.compute.gemm(Transpose::kNo, Transpose::kYes, t, t, hd, scale, q, 3 * d, k,
                                      3 * d, 0.0f, p, t, ctx.stream));
            ZINF_TRY(ctx.compute.causal_softmax_forward(p, t, t, ctx.stream));
            // dp = dout v^T; dv = p^T dout.
            ZINF_TRY(ctx.compute.gemm(Transpose::kNo, Transpose::kYes, t, t, hd, 1.0f, doh, d, v,
                                      3 * d, 0.0f, dp, t, ctx.stream));
            ZINF_TRY(ctx.compute.gemm(Transpose::kYes, Transpose::kNo, t, hd, t, 1.0f, p, t, doh, d,
                                      0.0f, dq_base + 2 * d + h * hd, 3 * d, ctx.stream));
            // ds (over dp), then dq = scale * ds k and dk = scale * ds^T q.
            ZINF_TRY(ctx.compute.causal_softmax_backward(p, dp, t, t, ctx.stream));
            ZINF_TRY(ctx.compute.gemm(Transpose::kNo, Transpose::kNo, t, hd, t, scale, dp, t, k,
                                      3 * d, 0.0f, dq_base + h * hd, 3 * d, ctx.stream));
            ZINF_TRY(ctx.compute.gemm(Transpose::kYes, Transpose::kNo, t, hd, t, scale, dp, t, q,
                                      3 * d, 0.0f, dq_base + d + h * hd, 3 * d, ctx.stream));
        }
    }
    return Status::ok();
}

Status Gpt::block_forward(const Context& ctx, std::size_t i, Workspace& ws, const float* x,
                          float* out, bool recompute) {
    Block& b = *blocks_[i];
    const std::size_t n = rows_ * config_.seq_len;
    const std::size_t d = config_.d_model;
    ws.rows = n;
    ZINF_TRY(b.ln_1->forward(ctx, x, ws.h1.as<float>(), n));
    ZINF_TRY(b.c_attn->forward(ctx, ws.h1.as<float>(), ws.qkv.as<float>(), n));
    ZINF_TRY(attention_forward(ctx, ws));
    // x1 = drop(c_proj(att)) + x, the branch written straight into x1 (backward needs neither
    // it nor the MLP branch's output, only their dropout masks): one addition per element, the
    // same bits as x + branch.
    ZINF_TRY(b.c_proj->forward(ctx, ws.att.as<float>(), ws.x1.as<float>(), n));
    ZINF_TRY(b.drop_attn->forward(ctx, ws.x1.as<float>(), ws.x1.as<float>(), n));
    ZINF_TRY(ctx.compute.axpy(1.0f, x, ws.x1.as<float>(), n * d, ctx.stream));
    ZINF_TRY(b.ln_2->forward(ctx, ws.x1.as<float>(), ws.h2.as<float>(), n));
    ZINF_TRY(b.c_fc->forward(ctx, ws.h2.as<float>(), ws.u.as<float>(), n));
    ZINF_TRY(b.gelu->forward(ctx, ws.u.as<float>(), ws.g.as<float>(), n));
    // The recompute needs the insides only: the block's output was kept as the next input, and
    // the MLP branch's dropout mask is still the module's.
    if (recompute) return Status::ok();
    // out = drop(mlp_proj(g)) + x1.
    ZINF_TRY(b.mlp_proj->forward(ctx, ws.g.as<float>(), out, n));
    ZINF_TRY(b.drop_mlp->forward(ctx, out, out, n));
    return ctx.compute.axpy(1.0f, ws.x1.as<float>(), out, n * d, ctx.stream);
}

Status Gpt::block_backward(const Context& ctx, std::size_t i, Workspace& ws, float* dx) {
    Block& b = *blocks_[i];
    const std::size_t n = ws.rows;
    const std::size_t d = config_.d_model;
    float* gt = grad_t_.as<float>();
    float* gu = grad_u_.as<float>();
    // Each input gradient goes where the forward's input was once the module's parameter
    // gradients have read it (Linear allows it): g, h2, att, the u region (for d qkv) and h1.
    float* g = ws.g.as<float>();
    // dx holds d(out) on entry. The MLP branch: out = x1 + drop(mlp_proj(gelu(c_fc(ln_2(x1))))).
    ZINF_TRY(b.drop_mlp->backward(ctx, dx, gt));
    ZINF_TRY(b.mlp_proj->backward(ctx, gt, g));  // d g
    ZINF_TRY(b.gelu->backward(ctx, g, g));       // d u, in place
    ZINF_TRY(b.c_fc->backward(ctx, g, ws.h2.as<float>()));
    ZINF_TRY(b.ln_2->backward(ctx, ws.h2.as<float>(), gu));
    ZINF_TRY(ctx.compute.axpy(1.0f, gu, dx, n * d, ctx.stream));  // dx = d(x1)
    // The attention branch: x1 = x + drop(c_proj(attention(c_attn(ln_1(x))))).
    ZINF_TRY(b.drop_attn->backward(ctx, dx, gt));
    ZINF_TRY(b.c_proj->backward(ctx, gt, ws.att.as<float>()));
    float* dqkv = ws.u.as<float>();  // free since the MLP branch's backward; 4d >= 3d wide
    ZINF_TRY(attention_backward(ctx, ws, ws.att.as<float>(), dqkv));
    ZINF_TRY(b.c_attn->backward(ctx, dqkv, ws.h1.as<float>()));
    ZINF_TRY(b.ln_1->backward(ctx, ws.h1.as<float>(), gu));
    return ctx.compute.axpy(1.0f, gu, dx, n * d, ctx.stream);  // dx = d(x)
}

Status Gpt::forward(const Context& outer, const void* inputs, const std::int32_t* labels,
                    std::size_t rows) {
    ZINF_ASSERT_GT(rows, 0u);
    ZINF_ASSERT_LE(rows, config_.batch_rows_max);
    ZINF_ASSERT(inputs != nullptr);
    trained_forward_ = false;
    const Context ctx = with_scratch(outer);
    const auto* tokens = static_cast<const std::int32_t*>(inputs);
    const std::size_t t = config_.seq_len;
    const std::size_t d = config_.d_model;
    const std::size_t n = rows * t;
    tokens_ = tokens;
    rows_ = rows;
    {
        Fetched wte(ctx, wte_);
        Fetched wpe(ctx, wpe_);
        ZINF_TRY(wte.fetch());
        ZINF_TRY(wpe.fetch());
        ZINF_TRY(ctx.compute
                     .embedding_forward(tokens, wte.get(), wpe.get(), n, t, d, config_.vocab,
                                        block_input(0), ctx.stream)
                     .with_context("embedding forward"));
        ZINF_TRY(wpe.release());
        ZINF_TRY(wte.release());
    }
    ZINF_TRY(embed_dropout_->forward(ctx, block_input(0), block_input(0), n));
    const bool keep = inputs_off_device() && ctx.training;
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
        const auto t0 = Clock::now();
        if (keep && config_.checkpoint_place == CheckpointPlace::kHost) {
            ZINF_TRY(device_.copy_to_host(host_kept_.as<float>() + i * n * d, block_input(i),
                                          n * d * sizeof(float), ctx.stream));
        } else if (keep) {
            ZINF_TRY(store_->save(i, block_input(i), n * d * sizeof(float), ctx.stream)
                         .with_context(str_cat("block ", i, ": keeping its input")));
        }
        Status status =
            block_forward(ctx, i, workspace(i), block_input(i), block_input(i + 1), false);
        if (!status.is_ok()) return status.with_context(str_cat("block ", i, " forward"));
        if (config_.synchronize_boundaries) ZINF_TRY(device_.synchronize(ctx.stream));
        if (config_.profile) {
            profile_.forward_seconds += seconds_since(t0);
            ++profile_.blocks_forward;
        }
    }
    ZINF_TRY(ln_f_->forward(ctx, block_input(blocks_.size()), hf_, n));
    {
        Fetched wte(ctx, wte_);
        ZINF_TRY(wte.fetch());
        // logits (n x vocab) = hf (n x d) wte^T.
        ZINF_TRY(ctx.compute.gemm(Transpose::kNo, Transpose::kYes, n, config_.vocab, d, 1.0f, hf_,
                                  d, wte.get(), d, 0.0f, logits_, config_.vocab, ctx.stream));
        ZINF_TRY(wte.release());
    }
    labels_ = labels;
    if (labels != nullptr) {
        ZINF_TRY(loss_->forward(ctx, logits_, labels, n, scalars_.as<float>()));
        trained_forward_ = ctx.training;
    }
    return Status::ok();
}

Status Gpt::backward(const Context& outer, float grad_scale) {
    ZINF_ASSERT(outer.training);
    ZINF_ASSERT_MSG(trained_forward_, "Gpt::backward needs a training forward with labels");
    const Context ctx = with_scratch(outer);
    const std::size_t t = config_.seq_len;
    const std::size_t d = config_.d_model;
    const std::size_t v = config_.vocab;
    const std::size_t n = rows_ * t;
    // The logits' gradient over the loss's probabilities (the loss allows it).
    float* dlogits = loss_->probabilities();
    float* gx = grad_x_.as<float>();
    float* gt = grad_t_.as<float>();
    ZINF_TRY(loss_->backward(ctx, grad_scale, dlogits));
    {
        Fetched wte(ctx, wte_);
        ZINF_TRY(wte.fetch());
        // d(hf) = dlogits wte; the head's share of wte's gradient = dlogits^T hf, which the
        // embedding's share is added to at the end (one accumulate for the tied weight).
        ZINF_TRY(ctx.compute.gemm(Transpose::kNo, Transpose::kNo, n, d, v, 1.0f, dlogits, v,
                                  wte.get(), d, 0.0f, gt, d, ctx.stream));
        ZINF_TRY(wte.release());
    }
    ZINF_TRY(ctx.compute.gemm(Transpose::kYes, Transpose::kNo, v, d, n, 1.0f, dlogits, v, hf_, d,
                              0.0f, wte_grad_.as<float>(), d, ctx.stream));
    ZINF_TRY(ln_f_->backward(ctx, gt, gx));
    for (std::size_t i = blocks_.size(); i-- > 0;) {
        Workspace& ws = workspace(i);
        if (config_.checkpoint_activations) {
            const auto t0 = Clock::now();
            if (config_.checkpoint_place == CheckpointPlace::kHost) {
                ZINF_TRY(device_.copy_to_device(block_input(i), host_kept_.as<float>() + i * n * d,
                                                n * d * sizeof(float), ctx.stream));
            } else if (config_.checkpoint_place == CheckpointPlace::kStore) {
                ZINF_TRY(store_->restore(i, block_input(i), n * d * sizeof(float), ctx.stream)
                             .with_context(str_cat("block ", i, ": restoring its input")));
            }
            Status status = block_forward(ctx, i, ws, block_input(i), nullptr, true);
            if (!status.is_ok()) return status.with_context(str_cat("block ", i, " recompute"));
            if (config_.profile) {
                profile_.recompute_seconds += seconds_since(t0);
                ++profile_.blocks_recomputed;
            }
        }
        const auto t0 = Clock::now();
        Status status = block_backward(ctx, i, ws, gx);
        if (!status.is_ok()) return status.with_context(str_cat("block ", i, " backward"));
        if (config_.synchronize_boundaries) ZINF_TRY(device_.synchronize(ctx.stream));
        if (config_.profile) profile_.backward_seconds += seconds_since(t0);
    }
    ZINF_TRY(embed_dropout_->backward(ctx, gx, gx));
    float* wpe_grad = ctx.grad_scratch;
    ZINF_TRY(ctx.compute
                 .embedding_backward(tokens_, gx, n, t, d, v, wte_grad_.as<float>(), wpe_grad,
                                     ctx.stream)
                 .with_context("embedding backward"));
    ZINF_TRY(ctx.grads.accumulate(wpe_, wpe_grad, ctx.stream));
    ZINF_TRY(ctx.grads.accumulate(wte_, wte_grad_.as<float>(), ctx.stream));
    trained_forward_ = false;
    return Status::ok();
}

Result<float> Gpt::read_loss(StreamId stream) const {
    float loss = 0;
    ZINF_TRY(device_.copy_to_host(&loss, scalars_.data(), sizeof loss, stream));
    ZINF_TRY(device_.synchronize(stream));
    return loss;
}

Status Gpt::count_correct(const Context& ctx, std::uint64_t* correct_count, bool accumulate) const {
    ZINF_ASSERT(labels_ != nullptr);
    return ctx.compute.count_correct(logits_, labels_, rows_ * config_.seq_len, config_.vocab,
                                     correct_count, accumulate, ctx.stream);
}

Status Gpt::read_logits(StreamId stream, std::span<float> out) const {
    ZINF_ASSERT_EQ(out.size(), rows_ * config_.seq_len * config_.vocab);
    ZINF_TRY(device_.copy_to_host(out.data(), logits_, out.size_bytes(), stream));
    return device_.synchronize(stream);
}

Status Gpt::read_predictions(StreamId stream, std::span<std::int32_t> out) const {
    const std::size_t positions = rows_ * config_.seq_len;
    ZINF_ASSERT_EQ(out.size(), positions);
    std::vector<float> logits(positions * config_.vocab);
    ZINF_TRY(read_logits(stream, logits));
    for (std::size_t r = 0; r < positions; ++r) {
        const float* row = logits.data() + r * config_.vocab;
        out[r] = static_cast<std::int32_t>(std::max_element(row, row + config_.vocab) - row);
    }
    return Status::ok();
}

}  // namespace zinf::model
