// The insides of io::Engine, shared by its two source files: engine.cc (workers, the queue of
// operations, completion, statistics) and engine_files.cc (the file table: open, close, sync).
// Private to io/.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "io/backend.h"
#include "io/engine.h"
#include "io/faulty_backend.h"
#include "io/storage.h"
#include "src/base/status.h"

namespace zinf::io {

class EngineWorker;

namespace detail {

// Latency histogram: 4 buckets per power of two of microseconds, up to 2^44 us.
constexpr int kSubBuckets = 4;
constexpr int kHistogramBuckets = 45 * kSubBuckets;

// One stripe of a logical file, as its storage opened it, and its fixed-file slots (-1: none).
struct Stripe : StorageFile {
    int buffered_slot = -1;
    int direct_slot = -1;
};

struct File {
    FileId id = 0;
    std::vector<Stripe> stripes;
    std::uint64_t chunk_bytes = 0;
    bool direct = false;
    bool read_only = false;
    std::size_t alignment_bytes = 1;
    std::atomic<std::uint32_t> ops_in_flight{0};
};

// A registered buffer piece, by address, for finding the slot of a piece's buffer.
struct Region {
    std::uintptr_t begin;
    std::uintptr_t end;
    int index;
};

// One piece of a caller operation, in a worker's fixed array.
struct Piece {
    Request request;
    IoHandle* handle = nullptr;
    File* file = nullptr;
    std::uint32_t stripe = 0;
    std::uint64_t logical_offset_bytes = 0;
    EngineWorker* worker = nullptr;
    std::uint32_t index = 0;
};

}  // namespace detail

struct Engine::Impl {
    explicit Impl(const EngineOptions& o) : options(o), aio(o.aio) {}

    EngineOptions options;
    AioOptions aio;
    std::string backend_name;
    // Where the files live: options.storage, or the one the engine made (owned_storage), which
    // outlives the workers and files below.
    std::unique_ptr<Storage> owned_storage;
    Storage* storage = nullptr;
    std::unique_ptr<FaultyBackend::Shared> fault_shared;
    std::vector<std::unique_ptr<EngineWorker>> workers;

    // Guards the operation queue, the file table, worker control and stopping.
    std::mutex mutex;
    std::condition_variable work_cv;     // workers wait here when idle
    std::condition_variable control_cv;  // callers of run_on_workers wait here
    IoHandle* head = nullptr;
    IoHandle* tail = nullptr;
    // The last urgent operation queued (IoHandle::set_urgent): urgent ones are a prefix of the
    // queue, this its end; null when none is queued.
    IoHandle* urgent_tail = nullptr;
    std::atomic<std::size_t> queued_ops{0};
    bool stopping = false;
    std::vector<std::unique_ptr<detail::File>> files;  // indexed by FileId; closed files are null
    std::vector<bool> fixed_slot_used = std::vector<bool>(kFixedFileSlots, false);
    std::vector<std::span<std::byte>> regions;  // registered buffer pieces, in slot order

    // Statistics (relaxed atomics: counters only).
    std::atomic<std::uint64_t> bytes_read{0};
    std::atomic<std::uint64_t> bytes_written{0};
    std::atomic<std::uint64_t> requests_completed{0};
    std::atomic<std::uint64_t> pieces_completed{0};
    std::atomic<std::uint64_t> short_transfers{0};
    std::atomic<std::uint64_t> retries{0};
    std::atomic<std::uint64_t> pieces_fixed_buffer_read{0};
    std::atomic<std::uint64_t> pieces_fixed_buffer_written{0};
    std::atomic<std::uint64_t> pieces_fixed_file{0};
    std::atomic<std::uint64_t> pieces_plain{0};
    std::atomic<std::uint64_t> ops_discarded{0};
    // set_discard: operations complete at submit without touching a file or a buffer.
    std::atomic<bool> discard{false};
    std::array<std::atomic<std::uint64_t>, detail::kHistogramBuckets> latency{};

    // Runs `fn` once on every worker's own thread, between its batches, and waits for all of
    // them; returns the first error. One such call at a time.
    Status run_on_workers(const std::function<Status(EngineWorker&)>& fn);
    detail::File* file_locked(FileId id) {
        if (id >= files.size() || files[id] == nullptr) return nullptr;
        return files[id].get();
    }
    int allocate_slot_locked() {
        for (int i = 0; i < kFixedFileSlots; ++i) {
            if (!fixed_slot_used[static_cast<std::size_t>(i)]) {
                fixed_slot_used[static_cast<std::size_t>(i)] = true;
                return i;
            }
        }
        return -1;
    }
    // Gives an opened file its id and fixed-file slots, registers the slots with every worker's
    // backend and adds the file to the table (engine_files.cc).
    FileId add_file(std::unique_ptr<detail::File> file);
    // Counts one piece (or the cutting token) of `handle` as finished; the last one completes
    // the operation and wakes its waiters. Called by workers only.
    void finish(IoHandle& handle, Status* error) noexcept;
};

// One I/O thread of the engine: owns its backend (made on the thread) and queue_depth pieces,
// cuts pieces off the shared queue, submits them in batches and reaps their completions.
class EngineWorker {
public:
    EngineWorker(Engine::Impl& impl, std::size_t index);
    ~EngineWorker();

    // Starts the thread, which creates the backend (io_uring with SINGLE_ISSUER must be set up
    // by the thread that submits), and waits for the outcome.
    Status start(const std::string& kind);

    std::string_view backend_name() const { return backend_->name(); }

    // Called by submitters after they enqueue: ends a blocking reap of a worker that has room.
    void wake_if_sleeping() noexcept {
        if (sleeping_in_reap_.load(std::memory_order_seq_cst)) backend_->wake();
    }
    std::atomic<bool> sleeping_in_reap_{false};

    Backend& backend() { return *backend_; }

    // Control: guarded by impl_.mutex.
    const std::function<Status(EngineWorker&)>* control_fn_ = nullptr;
    bool control_done_ = false;
    Status control_status_;
    std::vector<detail::Region> regions_;  // owned by the worker thread

private:
    static void on_piece_complete(Request& request, const Status& status);

    void run(const std::string& kind);
    Status init_backend(const std::string& kind);
    void loop();
    void carve_locked();
    void submit_batch() noexcept;
    int buffer_index(const std::byte* buffer, std::uint32_t length) const noexcept;

    Engine::Impl& impl_;
    const std::size_t index_;
    std::thread thread_;
    bool init_done_ = false;
    Status init_status_;
    std::unique_ptr<Backend> base_backend_;
    std::unique_ptr<FaultyBackend> faulty_;
    Backend* backend_ = nullptr;
    std::vector<detail::Piece> pieces_;
    std::vector<std::uint32_t> free_;  // stack of free piece indices
    std::size_t free_count_ = 0;
    std::vector<Request*> batch_;  // cut, not yet accepted by the backend
    std::size_t batch_count_ = 0;
    int reap_errors_logged_ = 0;
};

}  // namespace zinf::io
