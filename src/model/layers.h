// The module library: Linear, ReLU, GELU, LayerNorm, Dropout, and the softmax cross-entropy loss.
// Each module registers its parameters at creation and fetches them around each use (see
// module.h); the math of each operation is documented on the Compute call it makes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "src/base/device.h"
#include "src/base/device_buffer.h"
#include "src/model/module.h"
#include "src/model/parameter.h"

namespace zinf::model {

// y = x W^T + b with W (out x in) "<prefix>.weight" and b (out) "<prefix>.bias". Both are
// initialised like PyTorch's nn.Linear: U[-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform_ with
// a = sqrt(5) gives exactly that bound for the weight; the bias uses the same bound).
// Backward: grad W = dy^T x, grad b = column sums of dy, then dx = dy W; it needs
// grad_scratch_numel() of scratch and fetches W only when dx is wanted. dx may be the forward's
// input x (the parameter gradients have read it by then), not dy.
class Linear final : public Module {
public:
    static std::unique_ptr<Linear> create(ParameterRegistry& registry, const std::string& prefix,
                                          std::size_t in_features, std::size_t out_features);

    std::string_view kind() const noexcept override { return "linear"; }
    std::size_t in_features() const noexcept override { return in_; }
    std::size_t out_features() const noexcept override { return out_; }
    std::span<const ParamId> parameter_ids() const noexcept override { return ids_; }
    ParamId weight_id() const noexcept { return ids_[0]; }
    ParamId bias_id() const noexcept { return ids_[1]; }
    std::size_t grad_scratch_numel() const noexcept { return out_ * in_ + out_; }

    Status forward(const Context& ctx, const float* x, float* y, std::size_t rows) override;
    Status backward(const Context& ctx, const float* dy, float* dx) override;

private:
    Linear(std::size_t in, std::size_t out, ParamId weight, ParamId bias) noexcept
        : in_(in), out_(out), ids_{weight, bias} {}
    std::size_t in_;
    std::size_t out_;
    std::array<ParamId, 2> ids_;
    const float* x_ = nullptr;
    std::size_t rows_ = 0;
};

// y = max(x, 0). Saves y (not x), so y may equal x (in place); dx may equal dy.
class Relu final : public Module {
public:
    explicit Relu(std::size_t features) noexcept : features_(features) {}
    std::string_view kind() const noexcept override { return "relu"; }
    std::size_t in_features() const noexcept override { return features_; }
    std::size_t out_features() const noexcept override { return features_; }
    Status forward(const Context& ctx, const float* x, float* y, std::size_t rows) override;
    Status backward(const Context& ctx, const float* dy, float* dx) override;

private:
    std::size_t features_;
    const float* y_ = nullptr;
    std::size_t rows_ = 0;
};

// GELU, tanh approximation (Compute::gelu_forward). Saves x, so y must not equal x; dx may
// equal dy.
class Gelu final : public Module {
public:
    explicit Gelu(std::size_t features) noexcept : features_(features) {}
    std::string_view kind() const noexcept override { return "gelu"; }
    std::size_t in_features() const noexcept override { return features_; }
    std::size_t out_features() const noexcept override { return features_; }
    Status forward(const Context& ctx, const float* x, float* y, std::size_t rows) override;
    Status backward(const Context& ctx, const float* dy, float* dx) override;

private:
    std::size_t features_;
    const float* x_ = nullptr;
    std::size_t rows_ = 0;
};

// LayerNorm over the features of each row with gamma "<prefix>.weight" (ones) and beta
// "<prefix>.bias" (zeros), eps as in PyTorch (1e-5 by default). Saves x and its own mean and
// rstd (rows_max floats each, device memory), so y must not equal x. Needs 2 x features of
// gradient scratch.
class LayerNorm final : public Module {
public:
    // Errors: kNoSpace from the device for the statistics.
    static Result<std::unique_ptr<LayerNorm>> create(ParameterRegistry& registry, Device& device,
                                                     const std::string& prefix,
                                                     std::size_t features, std::size_t rows_max,
                                                     float eps = 1e-5f);

    std::string_view kind() const noexcept override { return "layer_norm"; }
    std::size_t in_features() const noexcept override { return features_; }
    std::size_t out_features() const noexcept override { return features_; }
    std::span<const ParamId> parameter_ids() const noexcept override { return ids_; }
    std::size_t grad_scratch_numel() const noexcept { return 2 * features_; }

    Status forward(const Context& ctx, const float* x, float* y, std::size_t rows) override;
    Status backward(const Context& ctx, const float* dy, float* dx) override;

private:
    LayerNorm(std::size_t features, std::size_t rows_max, float eps, ParamId gamma, ParamId beta,
              DeviceBuffer mean, DeviceBuffer rstd) noexcept;
    std::size_t features_;
    std::size_t rows_max_;
    float eps_;
    std::array<ParamId, 2> ids_;
    DeviceBuffer mean_;
    DeviceBuffer rstd_;
    const float* x_ = nullptr;
    std::size_t rows_ = 0;
};

// Inverted dropout with probability p in [0, 1): in training, keeps each element with
// probability 1 - p and scales it by 1 / (1 - p); the mask of element i at step s is
// philox::dropout_keep(seed, s, i, ...) (src/base/philox.h), so replaying a step reproduces it.
// Outside training, y = x. y may equal x and dx may equal dy. Owns its mask (rows_max x
// features bytes of device memory).
class Dropout final : public Module {
public:
    // `seed` should differ per Dropout module of a model (Mlp derives it from the model seed
    // and the module's index). Errors: kNoSpace from the device for the mask.
    static Result<std::unique_ptr<Dropout>> create(Device& device, std::size_t features,
                                                   std::size_t rows_max, float p,
                                                   std::uint64_t seed);

    std::string_view kind() const noexcept override { return "dropout"; }
    std::size_t in_features() const noexcept override { return features_; }
    std::size_t out_features() const noexcept override { return features_; }
    float p() const noexcept { return p_; }
    std::uint64_t seed() const noexcept { return seed_; }
    // The mask of the last training forward (rows x features bytes, device memory).
    const std::uint8_t* mask() const noexcept { return mask_.as<std::uint8_t>(); }

    Status forward(const Context& ctx, const float* x, float* y, std::size_t rows) override;
    Status backward(const Context& ctx, const float* dy, float* dx) override;

private:
    Dropout(std::size_t features, std::size_t rows_max, float p, std::uint64_t seed,
            DeviceBuffer mask) noexcept
        : features_(features), rows_max_(rows_max), p_(p), seed_(seed), mask_(std::move(mask)) {}
    std::size_t features_;
    std::size_t rows_max_;
    float p_;
    std::uint64_t seed_;
    DeviceBuffer mask_;
    std::size_t rows_ = 0;
    bool masked_ = false;  // whether the last forward applied a mask
};

// Softmax over classes and cross-entropy against integer labels, the mean over rows
// (Compute::softmax_cross_entropy_forward). Owns the probabilities it saves for backward
// (rows_max x classes floats of device memory).
class SoftmaxCrossEntropy {
public:
    // Errors: kNoSpace from the device. `probabilities`: borrowed device memory of rows_max x
    // classes floats to keep them in (a workspace idle while the loss runs); null: its own.
    static Result<std::unique_ptr<SoftmaxCrossEntropy>> create(Device& device, std::size_t classes,
                                                               std::size_t rows_max,
                                                               float* probabilities = nullptr);

    std::size_t classes() const noexcept { return classes_; }
    // Writes the mean loss to *loss (one device float). labels: rows int32 in [0, classes),
    // device memory, kept (the pointer) for backward.
    Status forward(const Context& ctx, const float* logits, const std::int32_t* labels,
                   std::size_t rows, float* loss);
    // dlogits = d(mean loss * grad_scale)/d(logits) for the last forward. dlogits may be
    // probabilities() (the probabilities are then overwritten).
    Status backward(const Context& ctx, float grad_scale, float* dlogits);
    // The probabilities of the last forward (rows x classes, device memory).
    float* probabilities() const noexcept { return probs_; }

private:
    SoftmaxCrossEntropy(std::size_t classes, std::size_t rows_max, DeviceBuffer own,
                        float* probs) noexcept
        : classes_(classes), rows_max_(rows_max), own_(std::move(own)), probs_(probs) {}
    std::size_t classes_;
    std::size_t rows_max_;
    DeviceBuffer own_;  // empty when the probabilities are borrowed
    float* probs_ = nullptr;
    const std::int32_t* labels_ = nullptr;
    std::size_t rows_ = 0;
};

}  // namespace zinf::model
