// The module library's forward and backward passes, each a few Compute calls between fetching
// and releasing the parameters it reads.
#include "src/model/layers.h"

#include <cmath>
#include <utility>

#include "src/base/log.h"
#include "src/model/fetched.h"

namespace zinf::model {
namespace {

void check_rows(std::size_t rows, std::size_t rows_max) {
    ZINF_ASSERT_GT(rows, 0u);
    ZINF_ASSERT_LE(rows, rows_max);
}

}  // namespace

// ---- Linear ----------------------------------------------------------------------------------

std::unique_ptr<Linear> Linear::create(ParameterRegistry& registry, const std::string& prefix,
                                       std::size_t in_features, std::size_t out_features) {
    ZINF_ASSERT_GT(in_features, 0u);
    ZINF_ASSERT_GT(out_features, 0u);
    const float bound = 1.0f / std::sqrt(static_cast<float>(in_features));
    const ParamId weight = registry.add(prefix + ".weight", {out_features, in_features},
                                        InitRule{InitKind::kUniform, bound});
    const ParamId bias =
        registry.add(prefix + ".bias", {out_features}, InitRule{InitKind::kUniform, bound});
    return std::unique_ptr<Linear>(new Linear(in_features, out_features, weight, bias));
}

Status Linear::forward(const Context& ctx, const float* x, float* y, std::size_t rows) {
    ZINF_ASSERT_GT(rows, 0u);
    Fetched weight(ctx, ids_[0]);
    Fetched bias(ctx, ids_[1]);
    ZINF_TRY(weight.fetch());
    ZINF_TRY(bias.fetch());
    // y (rows x out) = x (rows x in) * W^T, W stored out x in.
    ZINF_TRY(ctx.compute.gemm(Transpose::kNo, Transpose::kYes, rows, out_, in_, 1.0f, x, in_,
                              weight.get(), in_, 0.0f, y, out_, ctx.stream));
    ZINF_TRY(ctx.compute.bias_add(y, bias.get(), rows, out_, ctx.stream));
    ZINF_TRY(bias.release());
    ZINF_TRY(weight.release());
    x_ = x;
    rows_ = rows;
    return Status::ok();
}

Status Linear::backward(const Context& ctx, const float* dy, float* dx) {
    ZINF_ASSERT(ctx.training);
    ZINF_ASSERT(x_ != nullptr);
    ZINF_ASSERT_GE(ctx.grad_scratch_numel, grad_scratch_numel());
    // The parameter gradients first: the input x is then no longer read, so dx may overwrite it.
    float* grad_weight = ctx.grad_scratch;
    float* grad_bias = ctx.grad_scratch + out_ * in_;
    // grad W (out x in) = dy^T (out x rows) * x (rows x in).
    ZINF_TRY(ctx.compute.gemm(Transpose::kYes, Transpose::kNo, out_, in_, rows_, 1.0f, dy, out_, x_,
                              in_, 0.0f, grad_weight, in_, ctx.stream));
    ZINF_TRY(ctx.grads.accumulate(ids_[0], grad_weight, ctx.stream));
    ZINF_TRY(ctx.compute.bias_grad(dy, rows_, out_, grad_bias, ctx.stream));
    ZINF_TRY(ctx.grads.accumulate(ids_[1], grad_bias, ctx.stream));
    if (dx != nullptr) {
        Fetched weight(ctx, ids_[0]);
        ZINF_TRY(weight.fetch());
        // dx (rows x in) = dy (rows x out) * W (out x in).
        ZINF_TRY(ctx.compute.gemm(Transpose::kNo, Transpose::kNo, rows_, in_, out_, 1.0f, dy, out_,
                                  weight.get(), in_, 0.0f, dx, in_, ctx.stream));
        ZINF_TRY(weight.release());
    }
    return Status::ok();
}

// ---- Activations -----------------------------------------------------------------------------

Status Relu::forward(const Context& ctx, const float* x, float* y, std::size_t rows) {
    ZINF_ASSERT_GT(rows, 0u);
    ZINF_TRY(ctx.compute.relu_forward(x, y, rows * features_, ctx.stream));
    y_ = y;
    rows_ = rows;
    return Status::ok();
}

Status Relu::backward(const Context& ctx, const float* dy, float* dx) {
    ZINF_ASSERT(ctx.training);
    ZINF_ASSERT(y_ != nullptr);
    if (dx == nullptr) return Status::ok();
    // y > 0 exactly where x > 0, so the saved output serves as the mask.
    return ctx.compute.relu_backward(y_, dy, dx, rows_ * features_, ctx.stream);
}

Status Gelu::forward(const Context& ctx, const float* x, float* y, std::size_t rows) {
    ZINF_ASSERT_GT(rows, 0u);
    ZINF_ASSERT(x != y);
    ZINF_TRY(ctx.compute.gelu_forward(x, y, rows * features_, ctx.stream));
    x_ = x;
    rows_ = rows;
    return Status::ok();
}

Status Gelu::backward(const Context& ctx, const float* dy, float* dx) {
    ZINF_ASSERT(ctx.training);
    ZINF_ASSERT(x_ != nullptr);
    if (dx == nullptr) return Status::ok();
    return ctx.compute.gelu_backward(x_, dy, dx, rows_ * features_, ctx.stream);
}

// ---- LayerNorm -------------------------------------------------------------------------------

Result<std::unique_ptr<LayerNorm>> LayerNorm::create(ParameterRegistry& registry, Device& device,
                                                     const std::string& prefix,
                                                     std::size_t features, std::size_t rows_max,
                                                     float eps) {
    ZINF_ASSERT_GT(features, 0u);
    ZINF_ASSERT_GT(rows_max, 0u);
    ZINF_ASSIGN_OR_RETURN(
        DeviceBuffer mean,
        DeviceBuffer::allocate(device, rows_max * sizeof(float), "layer norm: mean"));
    ZINF_ASSIGN_OR_RETURN(
        DeviceBuffer rstd,
        DeviceBuffer::allocate(device, rows_max * sizeof(float), "layer norm: rstd"));
    const ParamId gamma =
        registry.add(prefix + ".weight", {features}, InitRule{InitKind::kConstant, 1.0f});
    const ParamId beta =
        registry.add(prefix + ".bias", {features}, InitRule{InitKind::kConstant, 0.0f});
    return std::unique_ptr<LayerNorm>(
        new LayerNorm(features, rows_max, eps, gamma, beta, std::move(mean), std::move(rstd)));
}

LayerNorm::LayerNorm(std::size_t features, std::size_t rows_max, float eps, ParamId gamma,
                     ParamId beta, DeviceBuffer mean, DeviceBuffer rstd) noexcept
    : features_(features),
      rows_max_(rows_max),
      eps_(eps),
      ids_{gamma, beta},
      mean_(std::move(mean)),
      rstd_(std::move(rstd)) {}

Status LayerNorm::forward(const Context& ctx, const float* x, float* y, std::size_t rows) {
    check_rows(rows, rows_max_);
    ZINF_ASSERT(x != y);
    Fetched gamma(ctx, ids_[0]);
    Fetched beta(ctx, ids_[1]);
    ZINF_TRY(gamma.fetch());
    ZINF_TRY(beta.fetch());
    ZINF_TRY(ctx.compute.layer_norm_forward(x, gamma.get(), beta.get(), eps_, rows, features_, y,
                                            mean_.as<float>(), rstd_.as<float>(), ctx.stream));
    ZINF_TRY(beta.release());
    ZINF_TRY(gamma.release());
    x_ = x;
    rows_ = rows;
    return Status::ok();
}

Status LayerNorm::backward(const Context& ctx, const float* dy, float* dx) {
    ZINF_ASSERT(ctx.training);
    ZINF_ASSERT(x_ != nullptr);
    ZINF_ASSERT_GE(ctx.grad_scratch_numel, grad_scratch_numel());
    float* grad_gamma = ctx.grad_scratch;
    float* grad_beta = ctx.grad_scratch + features_;
    Fetched gamma(ctx, ids_[0]);
    ZINF_TRY(gamma.fetch());
    ZINF_TRY(ctx.compute.layer_norm_backward(x_, gamma.get(), mean_.as<float>(), rstd_.as<float>(),
                                             dy, rows_, features_, dx, grad_gamma, grad_beta,
                                             ctx.stream));
    ZINF_TRY(gamma.release());
    ZINF_TRY(ctx.grads.accumulate(ids_[0], grad_gamma, ctx.stream));
    ZINF_TRY(ctx.grads.accumulate(ids_[1], grad_beta, ctx.stream));
    return Status::ok();
}

// ---- Dropout ---------------------------------------------------------------------------------

Result<std::unique_ptr<Dropout>> Dropout::create(Device& device, std::size_t features,
                                                 std::size_t rows_max, float p,
                                                 std::uint64_t seed) {
    ZINF_ASSERT_GT(features, 0u);
    ZINF_ASSERT_GT(rows_max, 0u);
    if (!(p >= 0.0f && p < 1.0f)) {
        return Status::invalid_argument(str_cat("dropout probability must be in [0, 1), got ", p));
    }
    DeviceBuffer mask;
    if (p > 0.0f) {
        ZINF_ASSIGN_OR_RETURN(mask,
                              DeviceBuffer::allocate(device, rows_max * features, "dropout: mask"));
    }
    return std::unique_ptr<Dropout>(new Dropout(features, rows_max, p, seed, std::move(mask)));
}

Status Dropout::forward(const Context& ctx, const float* x, float* y, std::size_t rows) {
    check_rows(rows, rows_max_);
    rows_ = rows;
    masked_ = ctx.training && p_ > 0.0f;
    const std::size_t numel = rows * features_;
    if (!masked_) {
        if (x == y) return Status::ok();
        return ctx.compute.cast(x, DType::kFloat32, y, DType::kFloat32, numel, ctx.stream);
    }
    return ctx.compute.dropout_forward(x, y, mask_.as<std::uint8_t>(), numel, p_, seed_, ctx.step,
                                       ctx.stream);
}

Status Dropout::backward(const Context& ctx, const float* dy, float* dx) {
    ZINF_ASSERT(ctx.training);
    ZINF_ASSERT_GT(rows_, 0u);
    if (dx == nullptr) return Status::ok();
    const std::size_t numel = rows_ * features_;
    if (!masked_) {
        if (dx == dy) return Status::ok();
        return ctx.compute.cast(dy, DType::kFloat32, dx, DType::kFloat32, numel, ctx.stream);
    }
    return ctx.compute.dropout_backward(dy, mask_.as<std::uint8_t>(), dx, numel, p_, ctx.stream);
}

// ---- SoftmaxCrossEntropy ---------------------------------------------------------------------

Result<std::unique_ptr<SoftmaxCrossEntropy>> SoftmaxCrossEntropy::create(Device& device,
                                                                         std::size_t classes,
                                                                         std::size_t rows_max,
                                                                         float* probabilities) {
    ZINF_ASSERT_GT(classes, 0u);
    ZINF_ASSERT_GT(rows_max, 0u);
    DeviceBuffer own;
    if (probabilities == nullptr) {
        ZINF_ASSIGN_OR_RETURN(own,
                              DeviceBuffer::allocate(device, rows_max * classes * sizeof(float),
                                                     "softmax cross-entropy: probabilities"));
        probabilities = own.as<float>();
    }
    return std::unique_ptr<SoftmaxCrossEntropy>(
        new SoftmaxCrossEntropy(classes, rows_max, std::move(own), probabilities));
}

Status SoftmaxCrossEntropy::forward(const Context& ctx, const float* logits,
                                    const std::int32_t* labels, std::size_t rows, float* loss) {
    check_rows(rows, rows_max_);
    ZINF_TRY(ctx.compute.softmax_cross_entropy_forward(logits, labels, rows, classes_, probs_, loss,
                                                       ctx.stream));
    labels_ = labels;
    rows_ = rows;
    return Status::ok();
}

Status SoftmaxCrossEntropy::backward(const Context& ctx, float grad_scale, float* dlogits) {
    ZINF_ASSERT(ctx.training);
    ZINF_ASSERT(labels_ != nullptr);
    return ctx.compute.softmax_cross_entropy_backward(probs_, labels_, rows_, classes_, grad_scale,
                                                      dlogits, ctx.stream);
}

}  // namespace zinf::model
