// NvmeActivationStore: activation checkpointing's kept block inputs on NVMe
// (activation_checkpointing.nvme_checkpointing), through a swap::SwapStore of its own (its own
// run directory under activation_checkpointing.nvme_path, checksummed blocks) and an io::Engine
// with the config's aio settings. Two pinned write buffers let block i's input go to disk while
// block i + 1 computes; two read buffers bring input i - 1 in while block i's backward runs. The
// inputs still in a write buffer when backward starts (the last two) are never read back.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "io/engine.h"
#include "src/base/aligned.h"
#include "src/base/device.h"
#include "src/base/status.h"
#include "src/model/activation_store.h"
#include "swap/swap_store.h"

namespace zinf::engine {

struct NvmeActivationStoreOptions {
    std::vector<std::string> paths;  // nvme_path: created when missing, then checked trusted
    bool verify_checksums = true;
    io::AioOptions aio;
    std::size_t input_bytes = 0;
    std::size_t input_count = 0;
};

class NvmeActivationStore final : public model::ActivationStore {
public:
    // Creates the directory, the swap file (input_count x input_bytes, space checked before
    // anything is written) and four staging buffers of input_bytes, pinned with `device`
    // (borrowed; outlives the store). Errors name activation_checkpointing.nvme_path: kNoSpace,
    // kInvalidArgument (an untrusted directory), kBusy (another run holds it), kIo.
    static Result<std::unique_ptr<NvmeActivationStore>> create(
        const NvmeActivationStoreOptions& options, Device& device);
    ~NvmeActivationStore() override;
    NvmeActivationStore(const NvmeActivationStore&) = delete;
    NvmeActivationStore& operator=(const NvmeActivationStore&) = delete;

    std::size_t input_bytes() const noexcept override { return options_.input_bytes; }
    std::size_t input_count() const noexcept override { return options_.input_count; }
    Status save(std::size_t index, const void* src, std::size_t bytes, StreamId stream) override;
    Status restore(std::size_t index, void* dst, std::size_t bytes, StreamId stream) override;
    std::size_t bytes_written() const noexcept override { return bytes_written_; }
    std::size_t bytes_read() const noexcept override { return bytes_read_; }
    void set_io_discard(bool on) noexcept override { io_->set_discard(on); }

private:
    static constexpr std::size_t kSlots = 2;
    static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
    struct Slot {
        AlignedBuffer buffer;
        swap::SwapHandle handle;
        std::size_t holds = kNone;  // the input whose bytes the buffer holds
    };
    NvmeActivationStore(const NvmeActivationStoreOptions& options, Device& device)
        : options_(options), device_(device) {}
    Status wait_writes();
    // Waits for every read in flight; their results are dropped (prefetches nobody needs now).
    void drop_reads() noexcept;
    Status start_read(std::size_t index);

    NvmeActivationStoreOptions options_;
    Device& device_;
    std::unique_ptr<io::Engine> io_;
    std::unique_ptr<swap::SwapStore> store_;
    std::array<Slot, kSlots> writes_;
    std::array<Slot, kSlots> reads_;
    std::size_t next_write_ = 0;
    std::size_t next_read_ = 0;
    std::vector<bool> registered_;
    std::size_t bytes_written_ = 0;
    std::size_t bytes_read_ = 0;
};

}  // namespace zinf::engine
