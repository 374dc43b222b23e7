// NvmeActivationStore: double-buffered writes behind the forward, one-ahead reads in backward.
#include "src/engine/activation_store.h"

#include "io/file_system.h"
#include "src/base/file.h"
#include "src/base/log.h"

namespace zinf::engine {
namespace {

constexpr const char* kKey = "activation_checkpointing.nvme_path";

}  // namespace

Result<std::unique_ptr<NvmeActivationStore>> NvmeActivationStore::create(
    const NvmeActivationStoreOptions& options, Device& device) {
    ZINF_ASSERT_GT(options.input_bytes, 0u);
    ZINF_ASSERT_GT(options.input_count, 0u);
    if (options.paths.empty()) {
        return Status::invalid_argument(str_cat(kKey, ": required with nvme_checkpointing"));
    }
    for (const std::string& p : options.paths) {
        ZINF_TRY(
            io::open_trusted_directory(io::posix_file_system(), p, kKey, /*create=*/true).status());
    }
    auto s = std::unique_ptr<NvmeActivationStore>(new NvmeActivationStore(options, device));
    io::EngineOptions eo;
    eo.aio = options.aio;
    ZINF_ASSIGN_OR_RETURN(s->io_, io::Engine::create(eo));
    swap::SwapStoreOptions so;
    so.paths = options.paths;
    so.verify_checksums = options.verify_checksums;
    so.name = "activations";
    auto store = swap::SwapStore::create(*s->io_, so);
    if (!store.has_value()) return store.error().with_context(kKey);
    s->store_ = std::move(*store);
    for (std::size_t i = 0; i < options.input_count; ++i) {
        ZINF_TRY(s->store_->reserve(static_cast<swap::PartitionId>(i), options.input_bytes));
    }
    ZINF_TRY(s->store_->commit().with_context(kKey));
    for (auto* slots : {&s->writes_, &s->reads_}) {
        for (Slot& slot : *slots) {
            ZINF_ASSIGN_OR_RETURN(slot.buffer, AlignedBuffer::allocate(options.input_bytes, 4096));
            const Status pinned = device.register_host_memory(slot.buffer.span());
            s->registered_.push_back(pinned.is_ok());
            ZINF_TRY(pinned.with_context("activation checkpoints: pinning the staging buffers"));
        }
    }
    return s;
}

NvmeActivationStore::~NvmeActivationStore() {
    for (auto* slots : {&writes_, &reads_}) {
        for (Slot& slot : *slots) {
            if (slot.handle.in_use()) {
                const Status ignored = slot.handle.wait();
                (void)ignored;
            }
        }
    }
    std::size_t i = 0;
    for (auto* slots : {&writes_, &reads_}) {
        for (Slot& slot : *slots) {
            if (i < registered_.size() && registered_[i]) {
                const Status ignored = device_.unregister_host_memory(slot.buffer.data());
                (void)ignored;
            }
            ++i;
        }
    }
}

Status NvmeActivationStore::wait_writes() {
    Status first = Status::ok();
    for (Slot& slot : writes_) {
        if (!slot.handle.in_use()) continue;
        Status s = slot.handle.wait();
        if (!s.is_ok() && first.is_ok()) first = s.with_context(str_cat("input ", slot.holds));
    }
    return first;
}

void NvmeActivationStore::drop_reads() noexcept {
    for (Slot& slot : reads_) {
        if (slot.handle.in_use()) {
            const Status ignored = slot.handle.wait();
            (void)ignored;
        }
        slot.holds = kNone;
    }
}

Status NvmeActivationStore::save(std::size_t index, const void* src, std::size_t bytes,
                                 StreamId stream) {
    ZINF_ASSERT_LT(index, options_.input_count);
    ZINF_ASSERT_LE(bytes, options_.input_bytes);
    // A read still in flight from an earlier backward must not meet this write.
    if (index == 0) drop_reads();
    Slot& slot = writes_[next_write_];
    next_write_ = (next_write_ + 1) % kSlots;
    if (slot.handle.in_use()) {
        Status s = slot.handle.wait();
        if (!s.is_ok()) return s.with_context(str_cat("writing kept input ", slot.holds));
    }
    slot.holds = kNone;
    ZINF_TRY(device_.copy_to_host(slot.buffer.data(), src, bytes, stream));
    ZINF_TRY(device_.synchronize(stream));
    slot.holds = index;
    ZINF_TRY(
        store_->swap_out(static_cast<swap::PartitionId>(index), slot.buffer.span(), slot.handle));
    bytes_written_ += options_.input_bytes;
    return Status::ok();
}

Status NvmeActivationStore::start_read(std::size_t index) {
    for (const Slot& w : writes_) {
        if (w.holds == index) return Status::ok();  // still in memory: no read needed
    }
    for (const Slot& r : reads_) {
        if (r.holds == index) return Status::ok();  // already on its way
    }
    Slot& slot = reads_[next_read_];
    next_read_ = (next_read_ + 1) % kSlots;
    if (slot.handle.in_use()) {
        const Status ignored = slot.handle.wait();  // a prefetch nobody took
        (void)ignored;
    }
    slot.holds = index;
    Status s =
        store_->swap_in(static_cast<swap::PartitionId>(index), slot.buffer.span(), slot.handle);
    if (!s.is_ok()) {
        slot.holds = kNone;
        return s;
    }
    bytes_read_ += options_.input_bytes;
    return Status::ok();
}

Status NvmeActivationStore::restore(std::size_t index, void* dst, std::size_t bytes,
                                    StreamId stream) {
    ZINF_ASSERT_LT(index, options_.input_count);
    ZINF_ASSERT_LE(bytes, options_.input_bytes);
    const std::byte* from = nullptr;
    for (const Slot& w : writes_) {
        if (w.holds == index) from = w.buffer.data();
    }
    if (from == nullptr) {
        // Reading needs the partition's write completed (wait() is what marks it valid).
        ZINF_TRY(wait_writes().with_context("writing kept inputs"));
        ZINF_TRY(start_read(index));
        for (Slot& r : reads_) {
            if (r.holds != index) continue;
            if (r.handle.in_use()) {
                Status s = r.handle.wait();
                if (!s.is_ok()) {
                    r.holds = kNone;
                    return s.with_context(str_cat("reading kept input ", index));
                }
            }
            from = r.buffer.data();
        }
        ZINF_ASSERT(from != nullptr);
    }
    ZINF_TRY(device_.copy_to_device(dst, from, bytes, stream));
    ZINF_TRY(device_.synchronize(stream));
    // The buffer is free again; backward wants index - 1 next.
    for (Slot& r : reads_) {
        if (r.holds == index) r.holds = kNone;
    }
    if (index > 0) {
        if (Status s = wait_writes(); !s.is_ok()) return s.with_context("writing kept inputs");
        ZINF_TRY(start_read(index - 1));
    }
    return Status::ok();
}

}  // namespace zinf::engine
