// InMemoryDataset, the Fashion-MNIST loader and SyntheticDataset.
#include "src/data/dataset.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "src/base/log.h"
#include "src/base/philox.h"
#include "src/data/idx.h"

namespace zinf::data {

void DataSource::gather_tokens(std::span<const std::uint32_t> /*indices*/,
                               std::span<std::int32_t> /*tokens*/,
                               std::span<std::int32_t> /*labels*/) const {
    // A feature source reached here through a caller that did not check token_inputs(), or a
    // token source forgot to override this: either way the caller would train on nothing.
    ZINF_ASSERT_MSG(false, str_cat("gather_tokens on a source without token inputs (",
                                   token_inputs() ? "token_inputs() is true but gather_tokens "
                                                    "is not overridden"
                                                  : "fp32 features: use gather",
                                   ")"));
}

InMemoryDataset::InMemoryDataset(std::size_t features, std::size_t classes,
                                 std::vector<float> inputs, std::vector<std::int32_t> labels)
    : features_(features),
      classes_(classes),
      inputs_(std::move(inputs)),
      labels_(std::move(labels)) {
    ZINF_ASSERT_GT(features_, 0u);
    ZINF_ASSERT_GT(classes_, 0u);
    ZINF_ASSERT_EQ(inputs_.size(), labels_.size() * features_);
    for (const std::int32_t label : labels_) {
        ZINF_ASSERT_GE(label, 0);
        ZINF_ASSERT_LT(static_cast<std::size_t>(label), classes_);
    }
}

void InMemoryDataset::gather(std::span<const std::uint32_t> indices, std::span<float> inputs,
                             std::span<std::int32_t> labels) const {
    ZINF_ASSERT_EQ(inputs.size(), indices.size() * features_);
    ZINF_ASSERT_EQ(labels.size(), indices.size());
    for (std::size_t r = 0; r < indices.size(); ++r) {
        const std::size_t index = indices[r];
        ZINF_ASSERT_LT(index, labels_.size());
        std::memcpy(inputs.data() + r * features_, inputs_.data() + index * features_,
                    features_ * sizeof(float));
        labels[r] = labels_[index];
    }
}

Result<std::unique_ptr<InMemoryDataset>> load_fashion_mnist(const FashionMnistOptions& options) {
    const bool train = options.split == Split::kTrain;
    const std::string prefix = options.directory + (train ? "/train" : "/t10k");
    const std::string images_path = prefix + "-images-idx3-ubyte.gz";
    const std::string labels_path = prefix + "-labels-idx1-ubyte.gz";
    const std::size_t expected_count = train ? kFashionMnistTrainCount : kFashionMnistTestCount;

    ZINF_ASSIGN_OR_RETURN(IdxImages images, read_idx_images(images_path, kFashionMnistPackageHint));
    if (images.count != expected_count || images.rows != 28 || images.cols != 28) {
        return Status::corruption(str_cat(images_path, ": expected ", expected_count,
                                          " images of 28 x 28, found ", images.count, " of ",
                                          images.rows, " x ", images.cols));
    }
    ZINF_ASSIGN_OR_RETURN(IdxLabels labels, read_idx_labels(labels_path, kFashionMnistPackageHint));
    if (labels.labels.size() != expected_count) {
        return Status::corruption(str_cat(labels_path, ": expected ", expected_count,
                                          " labels, found ", labels.labels.size()));
    }
    for (std::size_t i = 0; i < labels.labels.size(); ++i) {
        if (labels.labels[i] >= kFashionMnistClasses) {
            return Status::corruption(str_cat(labels_path, ": label ", int{labels.labels[i]},
                                              " of sample ", i, " is not in 0..9"));
        }
    }

    const std::size_t count =
        options.limit == 0 ? expected_count : std::min(options.limit, expected_count);
    const float mean = options.normalize ? kFashionMnistMean : 0.0f;
    const float inv_std = options.normalize ? 1.0f / kFashionMnistStd : 1.0f;
    std::vector<float> inputs(count * kFashionMnistFeatures);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        inputs[i] = (static_cast<float>(images.pixels[i]) * (1.0f / 255.0f) - mean) * inv_std;
    }
    std::vector<std::int32_t> label_values(count);
    for (std::size_t i = 0; i < count; ++i) label_values[i] = labels.labels[i];
    return std::make_unique<InMemoryDataset>(kFashionMnistFeatures, kFashionMnistClasses,
                                             std::move(inputs), std::move(label_values));
}

// ---- SyntheticDataset -------------------------------------------------------------------------

Result<std::unique_ptr<SyntheticDataset>> SyntheticDataset::create(
    const SyntheticOptions& options) {
    if (options.count == 0 || options.features == 0 || options.classes == 0) {
        return Status::invalid_argument(
            str_cat("synthetic dataset: count (", options.count, "), features (", options.features,
                    ") and classes (", options.classes, ") must be > 0"));
    }
    if (options.classes > (std::size_t{1} << 31) || options.count > (std::size_t{1} << 32)) {
        return Status::invalid_argument(
            str_cat("synthetic dataset: classes must be <= 2^31 and count <= 2^32, got ",
                    options.classes, " and ", options.count));
    }
    if (!(options.noise >= 0.0f)) {
        return Status::invalid_argument(
            str_cat("synthetic dataset: noise must be >= 0, got ", options.noise));
    }
    return std::unique_ptr<SyntheticDataset>(new SyntheticDataset(options));
}

SyntheticDataset::SyntheticDataset(const SyntheticOptions& options) noexcept
    : options_(options),
      label_seed_(philox::mix64(options.seed ^ 0x4C4142454Cull)),     // 'LABEL'
      noise_seed_(philox::mix64(options.seed ^ 0x4E4F495345ull)),     // 'NOISE'
      centre_seed_(philox::mix64(options.seed ^ 0x43454E5452ull)) {}  // 'CENTR'

std::int32_t SyntheticDataset::label(std::uint64_t index) const noexcept {
    const std::uint64_t word = philox::element_word(label_seed_, 0, index);
    return static_cast<std::int32_t>((word * options_.classes) >> 32);
}

void SyntheticDataset::gather(std::span<const std::uint32_t> indices, std::span<float> inputs,
                              std::span<std::int32_t> labels) const {
    const std::size_t features = options_.features;
    ZINF_ASSERT_EQ(inputs.size(), indices.size() * features);
    ZINF_ASSERT_EQ(labels.size(), indices.size());
    const philox::Key noise_key = philox::make_key(noise_seed_);
    const philox::Key centre_key = philox::make_key(centre_seed_);
    for (std::size_t r = 0; r < indices.size(); ++r) {
        const std::uint64_t index = indices[r];
        ZINF_ASSERT_LT(index, options_.count);
        const std::int32_t label_value = label(index);
        const auto centre_stream = static_cast<std::uint64_t>(label_value);
        labels[r] = label_value;
        float* row = inputs.data() + r * features;
        // One Philox call yields the words of four consecutive features (element_word's layout).
        for (std::size_t j0 = 0; j0 < features; j0 += 4) {
            const std::uint64_t group = j0 >> 2;
            const philox::Counter noise = philox::philox4x32_10(
                philox::Counter{
                    {static_cast<std::uint32_t>(group), static_cast<std::uint32_t>(group >> 32),
                     static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32)}},
                noise_key);
            const philox::Counter centre = philox::philox4x32_10(
                philox::Counter{{static_cast<std::uint32_t>(group),
                                 static_cast<std::uint32_t>(group >> 32),
                                 static_cast<std::uint32_t>(centre_stream),
                                 static_cast<std::uint32_t>(centre_stream >> 32)}},
                centre_key);
            const std::size_t end = std::min(features, j0 + 4);
            for (std::size_t j = j0; j < end; ++j) {
                const float c = 2.0f * philox::word_to_unit_float(centre.v[j & 3]) - 1.0f;
                const float n = 2.0f * philox::word_to_unit_float(noise.v[j & 3]) - 1.0f;
                row[j] = c + options_.noise * n;
            }
        }
    }
}

}  // namespace zinf::data
