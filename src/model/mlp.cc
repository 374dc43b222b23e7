// Mlp: module construction, workspace sizing and the forward/backward sweeps.
#include "src/model/mlp.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "src/base/log.h"
#include "src/base/philox.h"

namespace zinf::model {

Result<std::unique_ptr<Mlp>> Mlp::create(const MlpConfig& config, Device& device) {
    ZINF_TRY(check_config(config));
    auto mlp = std::unique_ptr<Mlp>(new Mlp(config, device));
    ZINF_TRY(mlp->add_modules());
    ZINF_TRY(mlp->allocate_buffers());
    return mlp;
}

Status Mlp::check_config(const MlpConfig& config) {
    if (config.layer_sizes.size() < 2) {
        return Status::invalid_argument(
            str_cat("mlp.layer_sizes: expected at least 2 sizes (input and classes), got ",
                    config.layer_sizes.size()));
    }
    for (std::size_t i = 0; i < config.layer_sizes.size(); ++i) {
        if (config.layer_sizes[i] == 0) {
            return Status::invalid_argument(str_cat("mlp.layer_sizes[", i, "]: must be > 0"));
        }
    }
    if (config.batch_rows_max == 0) {
        return Status::invalid_argument("mlp.batch_rows_max: must be > 0");
    }
    if (!(config.dropout_prob >= 0.0f && config.dropout_prob < 1.0f)) {
        return Status::invalid_argument(
            str_cat("mlp.dropout_prob: expected [0, 1), got ", config.dropout_prob));
    }
    if (!(config.layer_norm_eps > 0.0f)) {
        return Status::invalid_argument(
            str_cat("mlp.layer_norm_eps: expected > 0, got ", config.layer_norm_eps));
    }
    return Status::ok();
}

// Each Linear but the last is followed by [LayerNorm], the activation and [Dropout]; the last
// one's logits go straight to the loss. The gradient scratch is sized to the largest module's.
Status Mlp::add_modules() {
    const std::size_t rows_max = config_.batch_rows_max;
    const std::size_t linear_count = config_.layer_sizes.size() - 1;
    for (std::size_t i = 0; i < linear_count; ++i) {
        const std::size_t in = config_.layer_sizes[i];
        const std::size_t out = config_.layer_sizes[i + 1];
        auto linear = Linear::create(registry_, str_cat("layers.", i), in, out);
        grad_scratch_numel_ = std::max(grad_scratch_numel_, linear->grad_scratch_numel());
        modules_.push_back(std::move(linear));
        if (i + 1 == linear_count) break;
        if (config_.layer_norm) {
            ZINF_ASSIGN_OR_RETURN(auto norm,
                                  LayerNorm::create(registry_, device_, str_cat("norms.", i), out,
                                                    rows_max, config_.layer_norm_eps));
            grad_scratch_numel_ = std::max(grad_scratch_numel_, norm->grad_scratch_numel());
            modules_.push_back(std::move(norm));
        }
        if (config_.activation == Activation::kRelu) {
            modules_.push_back(std::make_unique<Relu>(out));
        } else {
            modules_.push_back(std::make_unique<Gelu>(out));
        }
        if (config_.dropout_prob > 0.0f) {
            const std::uint64_t seed = philox::mix64(config_.seed ^ philox::mix64(modules_.size()));
            ZINF_ASSIGN_OR_RETURN(
                auto dropout, Dropout::create(device_, out, rows_max, config_.dropout_prob, seed));
            modules_.push_back(std::move(dropout));
        }
    }
    ZINF_ASSIGN_OR_RETURN(loss_, SoftmaxCrossEntropy::create(device_, classes(), rows_max));
    return Status::ok();
}

// One output buffer per module (every module keeps its input or output for backward), and two
// gradient buffers as wide as the widest activation, the gradient scratch and the loss.
Status Mlp::allocate_buffers() {
    const std::size_t rows_max = config_.batch_rows_max;
    std::size_t width_max = config_.layer_sizes.front();
    std::size_t bytes = 0;
    for (const auto& module : modules_) {
        const std::size_t size_bytes = rows_max * module->out_features() * sizeof(float);
        ZINF_ASSIGN_OR_RETURN(DeviceBuffer buffer,
                              DeviceBuffer::allocate(device_, size_bytes, "mlp: activations"));
        activations_.push_back(std::move(buffer));
        bytes += size_bytes;
        width_max = std::max(width_max, module->out_features());
    }
    const std::size_t grad_bytes = rows_max * width_max * sizeof(float);
    ZINF_ASSIGN_OR_RETURN(grad_a_, DeviceBuffer::allocate(device_, grad_bytes, "mlp: gradients"));
    ZINF_ASSIGN_OR_RETURN(grad_b_, DeviceBuffer::allocate(device_, grad_bytes, "mlp: gradients"));
    const std::size_t scratch_bytes = grad_scratch_numel_ * sizeof(float);
    ZINF_ASSIGN_OR_RETURN(grad_scratch_,
                          DeviceBuffer::allocate(device_, scratch_bytes, "mlp: gradient scratch"));
    ZINF_ASSIGN_OR_RETURN(scalars_, DeviceBuffer::allocate(device_, 64, "mlp: loss"));
    // The loss's probabilities (rows x classes) are the SoftmaxCrossEntropy's.
    workspace_bytes_ =
        bytes + 2 * grad_bytes + scratch_bytes + 64 + rows_max * classes() * sizeof(float);
    return Status::ok();
}

Mlp::~Mlp() = default;

Context Mlp::with_scratch(const Context& ctx) const {
    Context inner = ctx;
    inner.grad_scratch = grad_scratch_.as<float>();
    inner.grad_scratch_numel = grad_scratch_numel_;
    return inner;
}

Status Mlp::forward(const Context& ctx, const float* x, const std::int32_t* labels,
                    std::size_t rows) {
    ZINF_ASSERT_GT(rows, 0u);
    ZINF_ASSERT_LE(rows, config_.batch_rows_max);
    ZINF_ASSERT(x != nullptr);
    trained_forward_ = false;
    const Context inner = with_scratch(ctx);
    const float* input = x;
    for (std::size_t i = 0; i < modules_.size(); ++i) {
        float* output = activations_[i].as<float>();
        Status status = modules_[i]->forward(inner, input, output, rows);
        // The context is formatted only on failure: forward is on the hot path.
        if (!status.is_ok()) {
            return status.with_context(
                str_cat("module ", i, " (", modules_[i]->kind(), ") forward"));
        }
        input = output;
    }
    labels_ = labels;
    rows_ = rows;
    if (labels != nullptr) {
        ZINF_TRY(loss_->forward(inner, logits(), labels, rows, scalars_.as<float>()));
        trained_forward_ = ctx.training;
    }
    return Status::ok();
}

Status Mlp::backward(const Context& ctx, float grad_scale) {
    ZINF_ASSERT(ctx.training);
    ZINF_ASSERT_MSG(trained_forward_, "Mlp::backward needs a training forward with labels");
    const Context inner = with_scratch(ctx);
    float* dy = grad_a_.as<float>();
    float* dx = grad_b_.as<float>();
    ZINF_TRY(loss_->backward(inner, grad_scale, dy));
    for (std::size_t i = modules_.size(); i-- > 0;) {
        // The input gradient of the first module is not needed: skip it (and its GEMM).
        float* input_grad = i == 0 ? nullptr : dx;
        Status status = modules_[i]->backward(inner, dy, input_grad);
        if (!status.is_ok()) {
            return status.with_context(
                str_cat("module ", i, " (", modules_[i]->kind(), ") backward"));
        }
        std::swap(dy, dx);
    }
    trained_forward_ = false;
    return Status::ok();
}

Result<float> Mlp::read_loss(StreamId stream) const {
    float loss = 0;
    ZINF_TRY(device_.copy_to_host(&loss, scalars_.data(), sizeof loss, stream));
    ZINF_TRY(device_.synchronize(stream));
    return loss;
}

Status Mlp::count_correct(const Context& ctx, std::uint64_t* correct_count, bool accumulate) const {
    ZINF_ASSERT(labels_ != nullptr);
    return ctx.compute.count_correct(logits(), labels_, rows_, classes(), correct_count, accumulate,
                                     ctx.stream);
}

Status Mlp::read_predictions(StreamId stream, std::span<std::int32_t> out) const {
    ZINF_ASSERT_EQ(out.size(), rows_);
    const std::size_t classes = this->classes();
    std::vector<float> logits(rows_ * classes);
    ZINF_TRY(
        device_.copy_to_host(logits.data(), this->logits(), logits.size() * sizeof(float), stream));
    ZINF_TRY(device_.synchronize(stream));
    for (std::size_t r = 0; r < rows_; ++r) {
        const float* row = logits.data() + r * classes;
        // The first maximum, as Compute::count_correct takes it.
        out[r] = static_cast<std::int32_t>(std::max_element(row, row + classes) - row);
    }
    return Status::ok();
}

}  // namespace zinf::model
