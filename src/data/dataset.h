// Datasets for training and tests: the DataSource interface (samples by index, into host
// buffers), an in-memory dataset with the Fashion-MNIST loader, and a seeded synthetic
// classification dataset of any width that computes each sample on demand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "src/base/status.h"

namespace zinf::data {

// Samples by index, in one of two kinds, told apart by token_inputs():
// - feature sources (the default): fp32 rows of features() values and label_numel() int32
//   class labels in [0, classes) per sample, read with gather();
// - token sources (token_inputs() true, e.g. TextDataset): int32 rows of features() token ids
//   and label_numel() int32 labels in [0, classes) per sample, read with gather_tokens().
// A source implements the gather of its kind; the other one asserts, as calling it is a bug.
class DataSource {
public:
    virtual ~DataSource() = default;
    virtual std::size_t count() const noexcept = 0;
    // Input values per sample: features, or tokens for a token source.
    virtual std::size_t features() const noexcept = 0;
    virtual std::size_t classes() const noexcept = 0;
    // True for a source of int32 token ids (read with gather_tokens), false for fp32 features.
    virtual bool token_inputs() const noexcept { return false; }
    // Labels per sample: 1 for a classifier, seq_len for a language model's next tokens.
    virtual std::size_t label_numel() const noexcept { return 1; }
    // Writes sample indices[r] to row r of `inputs` (indices.size() x features()) and of
    // `labels` (indices.size() x label_numel()). Preconditions (asserted): indices < count(),
    // spans of exactly those sizes. Host memory; allocates nothing; const and thread-safe.
    virtual void gather(std::span<const std::uint32_t> indices, std::span<float> inputs,
                        std::span<std::int32_t> labels) const = 0;
    // The token twin of gather(): row r of `tokens` (indices.size() x features()) and of
    // `labels` (indices.size() x label_numel()) receive sample indices[r]; the same
    // preconditions and guarantees. The default asserts: only token sources override it.
    virtual void gather_tokens(std::span<const std::uint32_t> indices,
                               std::span<std::int32_t> tokens,
                               std::span<std::int32_t> labels) const;
};

// A dataset held in host memory.
class InMemoryDataset final : public DataSource {
public:
    // inputs: count x features, labels: count values in [0, classes) (asserted).
    InMemoryDataset(std::size_t features, std::size_t classes, std::vector<float> inputs,
                    std::vector<std::int32_t> labels);
    std::size_t count() const noexcept override { return labels_.size(); }
    std::size_t features() const noexcept override { return features_; }
    std::size_t classes() const noexcept override { return classes_; }
    void gather(std::span<const std::uint32_t> indices, std::span<float> inputs,
                std::span<std::int32_t> labels) const override;
    std::span<const float> inputs() const noexcept { return inputs_; }
    std::span<const std::int32_t> labels() const noexcept { return labels_; }

private:
    std::size_t features_;
    std::size_t classes_;
    std::vector<float> inputs_;
    std::vector<std::int32_t> labels_;
};

// ---- Fashion-MNIST --------------------------------------------------------------------------

inline constexpr const char* kFashionMnistDirectory = "/usr/share/datasets/fashion-mnist";
inline constexpr const char* kFashionMnistPackageHint =
    "install the Debian package: apt-get install dataset-fashion-mnist";
inline constexpr std::size_t kFashionMnistFeatures = std::size_t{28} * 28;
inline constexpr std::size_t kFashionMnistClasses = 10;
inline constexpr std::size_t kFashionMnistTrainCount = 60000;
inline constexpr std::size_t kFashionMnistTestCount = 10000;
// Mean and standard deviation of pixel / 255 over the 60000 training images (rounded to 4
// digits, the values commonly used with torchvision's Normalize).
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

enum class Split : std::uint8_t { kTrain, kTest };

struct FashionMnistOptions {
    std::string directory = kFashionMnistDirectory;
    Split split = Split::kTrain;
    // true: x = (pixel / 255 - kFashionMnistMean) / kFashionMnistStd, in fp32 (the same
    // constants for both splits); false: x = pixel / 255.
    bool normalize = true;
    // Keep only the first `limit` samples of the file (0: all), for tests.
    std::size_t limit = 0;
};

// Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz from options.directory. Checks the
// files against the published sizes (60000 or 10000 images of 28 x 28, as many labels, labels
// in 0..9). Errors: kNotFound naming the file and the Debian package to install, and the
// errors of read_idx_images / read_idx_labels; kCorruption for sizes that do not match.
Result<std::unique_ptr<InMemoryDataset>> load_fashion_mnist(const FashionMnistOptions& options);

// ---- Synthetic ------------------------------------------------------------------------------

struct SyntheticOptions {
    std::size_t count = 10000;
    std::size_t features = 784;
    std::size_t classes = 10;
    std::uint64_t seed = 1;
    float noise = 1.0f;  // half-width of the uniform noise around each class centre
};

// A Gaussian-free "mixture of boxes": sample i has label
//   (uint64(element_word(s1, 0, i)) * classes) >> 32
// and feature j = centre[label][j] + noise * (2 u - 1), with centre[c][j] = 2 u' - 1, where u
// and u' are philox::word_to_unit_float of element_word(s2, i, j) and element_word(s3, c, j)
// (s1..s3 derived from seed with philox::mix64). Every value is a pure function of (seed, i, j):
// nothing is stored, any width works, and the classes are separable enough for loss to fall.
class SyntheticDataset final : public DataSource {
public:
    // Errors: kInvalidArgument for zero count, features or classes, classes > 2^31, count
    // over 2^32 or negative noise.
    static Result<std::unique_ptr<SyntheticDataset>> create(const SyntheticOptions& options);
    std::size_t count() const noexcept override { return options_.count; }
    std::size_t features() const noexcept override { return options_.features; }
    std::size_t classes() const noexcept override { return options_.classes; }
    void gather(std::span<const std::uint32_t> indices, std::span<float> inputs,
                std::span<std::int32_t> labels) const override;
    // The label of sample `index`.
    std::int32_t label(std::uint64_t index) const noexcept;

private:
    explicit SyntheticDataset(const SyntheticOptions& options) noexcept;
    SyntheticOptions options_;
    std::uint64_t label_seed_;
    std::uint64_t noise_seed_;
    std::uint64_t centre_seed_;
};

}  // namespace zinf::data
