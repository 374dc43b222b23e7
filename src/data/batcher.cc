// Batcher: seeded Fisher-Yates order per epoch, batches gathered from the source.
#include "src/data/batcher.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "src/base/log.h"
#include "src/base/philox.h"

namespace zinf::data {
namespace {
constexpr std::uint64_t kShuffleTag = 0x53485546464C45ull;  // 'SHUFFLE'
// GCC's 128-bit integer; __extension__ keeps -Wpedantic quiet about it.
__extension__ using Uint128 = unsigned __int128;
}  // namespace

Result<Batcher> Batcher::create(const DataSource& source, const BatcherOptions& options) {
    if (options.batch_rows == 0) return Status::invalid_argument("batcher: batch_rows must be > 0");
    if (source.count() == 0) return Status::invalid_argument("batcher: the data source is empty");
    if (source.count() > std::size_t{0xFFFFFFFFu}) {
        return Status::invalid_argument(
            str_cat("batcher: at most 2^32 - 1 samples, got ", source.count()));
    }
    if (options.shard_count == 0 || options.shard_index >= options.shard_count) {
        return Status::invalid_argument(
            str_cat("batcher: shard ", options.shard_index, " of ", options.shard_count));
    }
    if (options.drop_last && source.count() < options.batch_rows * options.shard_count) {
        return Status::invalid_argument(str_cat(
            "batcher: ", source.count(), " samples make no full batch of ", options.batch_rows,
            options.shard_count > 1 ? str_cat(" rows on each of ", options.shard_count, " ranks")
                                    : std::string(),
            " with drop_last"));
    }
    Batcher batcher(source, options);
    batcher.order_.resize(source.count());
    batcher.start_epoch(0);
    return batcher;
}

void Batcher::start_epoch(std::uint64_t epoch) {
    epoch_ = epoch;
    std::iota(order_.begin(), order_.end(), 0u);
    if (!options_.shuffle) return;
    const philox::Key key = philox::make_key(philox::mix64(options_.seed ^ kShuffleTag));
    for (std::size_t i = order_.size() - 1; i > 0; --i) {
        const philox::Counter words = philox::philox4x32_10(
            philox::Counter{{static_cast<std::uint32_t>(i), 0u, static_cast<std::uint32_t>(epoch),
                             static_cast<std::uint32_t>(epoch >> 32)}},
            key);
        const std::uint64_t r = std::uint64_t{words.v[0]} | (std::uint64_t{words.v[1]} << 32);
        const auto j = static_cast<std::size_t>((static_cast<Uint128>(r) * (i + 1)) >> 64);
        ZINF_DASSERT(j <= i);
        std::swap(order_[i], order_[j]);
    }
}

std::size_t Batcher::batches_per_epoch() const noexcept {
    const std::size_t count = order_.size();
    return options_.drop_last ? count / global_rows() : (count + global_rows() - 1) / global_rows();
}

std::span<const std::uint32_t> Batcher::batch_indices(std::size_t batch_index) const {
    ZINF_ASSERT_LT(batch_index, batches_per_epoch());
    const std::size_t begin = std::min(
        order_.size(), batch_index * global_rows() + options_.shard_index * options_.batch_rows);
    const std::size_t end = std::min(order_.size(), begin + options_.batch_rows);
    return std::span<const std::uint32_t>(order_).subspan(begin, end - begin);
}

std::size_t Batcher::fill(std::size_t batch_index, std::span<float> inputs,
                          std::span<std::int32_t> labels) const {
    const std::span<const std::uint32_t> indices = batch_indices(batch_index);
    const std::size_t rows = indices.size();
    const std::size_t features = source_->features();
    const std::size_t label_numel = source_->label_numel();
    ZINF_ASSERT_MSG(!source_->token_inputs(), "Batcher::fill on a token source: use fill_tokens");
    ZINF_ASSERT_GE(inputs.size(), rows * features);
    ZINF_ASSERT_GE(labels.size(), rows * label_numel);
    source_->gather(indices, inputs.first(rows * features), labels.first(rows * label_numel));
    return rows;
}

std::size_t Batcher::fill_tokens(std::size_t batch_index, std::span<std::int32_t> tokens,
                                 std::span<std::int32_t> labels) const {
    const std::span<const std::uint32_t> indices = batch_indices(batch_index);
    const std::size_t rows = indices.size();
    const std::size_t features = source_->features();
    const std::size_t label_numel = source_->label_numel();
    ZINF_ASSERT_MSG(source_->token_inputs(), "Batcher::fill_tokens on a feature source: use fill");
    ZINF_ASSERT_GE(tokens.size(), rows * features);
    ZINF_ASSERT_GE(labels.size(), rows * label_numel);
    source_->gather_tokens(indices, tokens.first(rows * features),
                           labels.first(rows * label_numel));
    return rows;
}

}  // namespace zinf::data
