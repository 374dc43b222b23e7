// Batcher: cuts a DataSource into batches, in a seeded per-epoch shuffled order (or in file
// order), and gathers each batch into caller-provided host buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "src/base/status.h"
#include "src/data/dataset.h"

namespace zinf::data {

struct BatcherOptions {
    std::size_t batch_rows = 128;
    bool shuffle = true;
    // Drop the last batch of an epoch when it has fewer than batch_rows samples.
    bool drop_last = true;
    std::uint64_t seed = 1234;
    // Data-parallel sharding: a batch is batch_rows x shard_count samples of the epoch's order
    // (the global micro-batch of every rank), and this batcher's batch is rows [shard_index x
    // batch_rows, +batch_rows) of it. Every shard sees distinct samples, and the union over the
    // shards is what one batcher of batch_rows x shard_count would give, in the same order.
    std::size_t shard_count = 1;
    std::size_t shard_index = 0;
};

// The permutation of epoch e is a Fisher-Yates shuffle (i from count-1 down to 1, swap i with
// j = (r * (i + 1)) >> 64) whose 64-bit words r are
//   r_i = v0 | v1 << 32 of philox4x32_10({i, 0, e low, e high}, key(mix64(seed ^ 'SHUFFLE')))
// so it depends only on (seed, e, count), on every platform and standard library.
class Batcher {
public:
    // Borrows `source` (it outlives the Batcher). Allocates the permutation (count indices)
    // once and starts epoch 0. Errors: kInvalidArgument for batch_rows 0, or a source with no
    // sample or too few for one batch under drop_last.
    static Result<Batcher> create(const DataSource& source, const BatcherOptions& options);

    // Computes the order of `epoch` (in place: allocates nothing).
    void start_epoch(std::uint64_t epoch);
    std::uint64_t epoch() const noexcept { return epoch_; }
    // The same for every shard.
    std::size_t batches_per_epoch() const noexcept;
    // The sample indices of this shard's part of batch `batch_index` of the current epoch (empty
    // for a shard past the end of a last partial batch).
    std::span<const std::uint32_t> batch_indices(std::size_t batch_index) const;
    // Gathers batch `batch_index` into inputs (at least batch_rows x features) and labels (at
    // least batch_rows x label_numel); returns the rows written (batch_rows, or fewer, maybe
    // none, for a last partial batch). Allocates nothing. The source must be a feature source
    // (token_inputs() false, asserted).
    std::size_t fill(std::size_t batch_index, std::span<float> inputs,
                     std::span<std::int32_t> labels) const;
    // The token twin of fill() for a token source (token_inputs() true, asserted): tokens (at
    // least batch_rows x features) and labels (at least batch_rows x label_numel) receive the
    // rows of batch_indices(batch_index), through the source's gather_tokens. Returns the rows
    // written, as fill(). Allocates nothing.
    std::size_t fill_tokens(std::size_t batch_index, std::span<std::int32_t> tokens,
                            std::span<std::int32_t> labels) const;

private:
    Batcher(const DataSource& source, const BatcherOptions& options) noexcept
        : source_(&source), options_(options) {}
    std::size_t global_rows() const noexcept { return options_.batch_rows * options_.shard_count; }
    const DataSource* source_;
    BatcherOptions options_;
    std::vector<std::uint32_t> order_;
    std::uint64_t epoch_ = 0;
};

}  // namespace zinf::data
