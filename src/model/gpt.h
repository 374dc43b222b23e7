// Gpt: a byte-level decoder-only transformer language model (GPT-2's layout) built from the
// module library and three Compute operations of its own (embeddings, causal softmax):
//
//   x0 = dropout(wte[token] + wpe[position])
//   block i (pre-LayerNorm):  x += dropout(c_proj(attention(c_attn(ln_1(x)))))
//                             x += dropout(mlp.c_proj(gelu(mlp.c_fc(ln_2(x)))))
//   logits = ln_f(x) wte^T    (the LM head is tied to the token embedding)
//   loss = mean over every position of the softmax cross-entropy against the next byte
//
// Attention is causal multi-head self-attention computed one (sequence, head) at a time: the
// only scores ever held are one head's seq_len x seq_len matrix (and its gradient in backward),
// recomputed in backward from q and k rather than kept.
//
// Activation checkpointing keeps only each block's input and recomputes the inside of a block
// in backward, with the same dropout masks (Philox, keyed by the step), so the loss and the
// gradients are bitwise those of the run without it. The kept inputs may live in host memory
// (cpu_checkpointing) and are copied back before their block's backward.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/base/aligned.h"
#include "src/base/device.h"
#include "src/base/device_buffer.h"
#include "src/base/status.h"
#include "src/model/activation_store.h"
#include "src/model/layers.h"
#include "src/model/model.h"
#include "src/model/module.h"
#include "src/model/parameter.h"

namespace zinf::model {

// Where activation checkpointing keeps each block's input between forward and backward.
enum class CheckpointPlace : std::uint8_t {
    kDevice,  // device memory
    kHost,    // pinned host memory (DeepSpeed's cpu_checkpointing)
    kStore,   // an ActivationStore (NVMe: zinfinity's nvme_checkpointing)
};

struct GptConfig {
    std::size_t vocab = 256;  // bytes
    std::size_t n_layer = 4;
    std::size_t n_head = 4;
    std::size_t d_model = 128;
    std::size_t seq_len = 128;
    float dropout = 0.0f;  // embeddings and both residual branches
    float layer_norm_eps = 1e-5f;
    std::size_t batch_rows_max = 8;  // sequences per forward
    std::uint64_t seed = 1234;       // dropout masks
    // Activation checkpointing: keep block inputs only, recompute the inside in backward.
    bool checkpoint_activations = false;
    CheckpointPlace checkpoint_place = CheckpointPlace::kDevice;
    // The kept inputs in one contiguous allocation (DeepSpeed's contiguous_memory_optimization)
    // rather than one per block.
    bool contiguous_checkpoints = true;
    // Synchronize the stream at each block boundary (synchronize_checkpoint_boundary).
    bool synchronize_boundaries = false;
    // Time forward, recompute and backward of the blocks; read with checkpoint_profile().
    bool profile = false;
};

// Seconds spent in the blocks since creation (GptConfig::profile).
struct CheckpointProfile {
    double forward_seconds = 0;
    double recompute_seconds = 0;
    double backward_seconds = 0;
    std::uint64_t blocks_forward = 0;
    std::uint64_t blocks_recomputed = 0;
};

// Parameter names follow nanoGPT / Hugging Face GPT-2: wte.weight (vocab x d), wpe.weight
// (seq_len x d), blocks.<i>.{ln_1,attn.c_attn,attn.c_proj,ln_2,mlp.c_fc,mlp.c_proj}.{weight,bias},
// ln_f.{weight,bias}. Embeddings start uniform with the standard deviation 0.02 of GPT-2;
// Linear and LayerNorm as the module library does.
class Gpt final : public Model {
public:
    // Errors: kInvalidArgument naming the key (model.d_model not divisible by model.n_head, a
    // zero size, dropout outside [0, 1)); kNoSpace from the device budget. `store` (owned)
    // is required for CheckpointPlace::kStore: n_layer inputs of batch_rows_max x seq_len x
    // d_model floats.
    static Result<std::unique_ptr<Gpt>> create(const GptConfig& config, Device& device,
                                               std::unique_ptr<ActivationStore> store = nullptr);
    ~Gpt() override;
    Gpt(const Gpt&) = delete;
    Gpt& operator=(const Gpt&) = delete;

    // ---- Model ----
    std::string_view name() const noexcept override { return "gpt"; }
    const ParameterRegistry& parameters() const noexcept override { return registry_; }
    BatchShape batch_shape() const noexcept override {
        return BatchShape{InputKind::kInt32, config_.seq_len, config_.seq_len, config_.vocab};
    }
    std::size_t batch_rows_max() const noexcept override { return config_.batch_rows_max; }
    std::size_t workspace_bytes() const noexcept override { return workspace_bytes_; }
    // A module's parameters, and the embeddings (wte and wpe) together.
    std::vector<std::vector<ParamId>> fetch_groups() const override;
    // inputs: rows x seq_len int32 tokens; labels: rows x seq_len next tokens (or null).
    Status forward(const Context& outer, const void* inputs, const std::int32_t* labels,
                   std::size_t rows) override;
    Status backward(const Context& outer, float grad_scale) override;
    Result<float> read_loss(StreamId stream) const override;
    // Counts positions whose most likely next byte is the label.
    Status count_correct(const Context& ctx, std::uint64_t* correct_count,
                         bool accumulate) const override;
    Status read_predictions(StreamId stream, std::span<std::int32_t> out) const override;
    Status read_logits(StreamId stream, std::span<float> out) const override;

    const GptConfig& config() const noexcept { return config_; }
    // The last forward's logits; valid until the next backward (with checkpointing they may
    // live in the recompute workspace).
    const float* logits() const noexcept { return logits_; }
    // Device bytes of activations kept for backward (block inputs and, without checkpointing,
    // every block's insides), and host bytes of the kept inputs under kHost.
    std::size_t kept_activation_bytes() const noexcept { return kept_device_bytes_; }
    std::size_t host_checkpoint_bytes() const noexcept { return host_kept_.size(); }
    const ActivationStore* activation_store() const noexcept { return store_.get(); }
    void set_io_discard(bool on) noexcept override {
        if (store_) store_->set_io_discard(on);
    }
    const CheckpointProfile& checkpoint_profile() const noexcept { return profile_; }

private:
    struct Block;
    struct Workspace;
    struct Layout;
    Gpt(const GptConfig& config, Device& device);
    // create's plan, from the config alone, and its checks.
    static Layout layout_for(const GptConfig& config) noexcept;
    static Status check_config(const GptConfig& config, const Layout& layout,
                               const ActivationStore* store);
    // create's steps, in the order it takes them.
    Status add_modules(const Layout& layout);
    Status add_block(std::size_t i, std::size_t n);  // n: token rows
    Status allocate_workspaces(const Layout& layout);
    Status allocate_block_inputs(const Layout& layout);
    Status pin_host_inputs(const Layout& layout);
    Status wire_head(const Layout& layout);
    Status allocate_gradients(const Layout& layout);
    // Allocates numel floats of device memory and counts them in workspace_bytes_.
    Status allocate(DeviceBuffer& buffer, std::size_t numel, const char* what);
    // The seed of dropout module `index` (0: the embeddings'; block i: 2i + 1 and 2i + 2).
    std::uint64_t dropout_seed(std::size_t index) const noexcept;
    Context with_scratch(const Context& ctx) const;
    // Where block i's input is read from in forward (and restored to before its backward).
    float* block_input(std::size_t i) const noexcept;
    // Whether the kept inputs live outside device memory (two device slots rotate).
    bool inputs_off_device() const noexcept {
        return config_.checkpoint_activations &&
               config_.checkpoint_place != CheckpointPlace::kDevice;
    }
    Status block_forward(const Context& ctx, std::size_t i, Workspace& ws, const float* x,
                         float* out, bool recompute);
    Status block_backward(const Context& ctx, std::size_t i, Workspace& ws, float* dx);
    Status attention_forward(const Context& ctx, const Workspace& ws);
    Status attention_backward(const Context& ctx, const Workspace& ws, const float* datt,
                              float* dqkv);
    Workspace& workspace(std::size_t block) noexcept;

    GptConfig config_;
    Device& device_;
    ParameterRegistry registry_;
    ParamId wte_ = 0;
    ParamId wpe_ = 0;
    std::unique_ptr<Dropout> embed_dropout_;
    std::vector<std::unique_ptr<Block>> blocks_;
    std::unique_ptr<LayerNorm> ln_f_;
    std::unique_ptr<SoftmaxCrossEntropy> loss_;

    std::vector<std::unique_ptr<Workspace>> workspaces_;  // one per block, or one shared
    DeviceBuffer kept_;                       // block inputs 0..n_layer (contiguous), or:
    std::vector<DeviceBuffer> kept_each_;     // one per block input
    AlignedBuffer host_kept_;                 // kHost: block inputs 0..n_layer-1
    std::unique_ptr<ActivationStore> store_;  // kStore
    bool host_registered_ = false;
    // ln_f's output and the logits (rows x seq_len x vocab): their own buffers, or with
    // checkpointing the shared workspace's h1 and u (create says when).
    DeviceBuffer hf_own_, logits_own_;
    float* hf_ = nullptr;
    float* logits_ = nullptr;
    DeviceBuffer grad_x_, grad_t_, grad_u_;  // backward's d_model-wide gradients
    DeviceBuffer scores_, dscores_;          // one head's seq_len x seq_len
    DeviceBuffer wte_grad_;  // the tied embedding's gradient, summed over head and embedding
    DeviceBuffer grad_scratch_;
    DeviceBuffer scalars_;
    std::size_t grad_scratch_numel_ = 0;
    std::size_t workspace_bytes_ = 0;
    std::size_t kept_device_bytes_ = 0;
    const std::int32_t* tokens_ = nullptr;
    const std::int32_t* labels_ = nullptr;
    std::size_t rows_ = 0;
    bool trained_forward_ = false;
    CheckpointProfile profile_;
};

}  // namespace zinf::model
