// io::Engine: the thread-safe front end of the asynchronous block I/O layer. It owns
// `intra_op_parallelism` worker threads, each with one io::Backend made by the engine's
// io::Storage (io/storage.h: by default the operating system's files, moved by io_uring, libaio
// or posix; the simulated device is another storage), optionally wrapped by io::FaultyBackend.
// The engine itself has no case for any storage. Callers submit reads and writes of
// (file, offset, buffer) and get them back through an IoHandle they own. Every request is cut
// into `block_size` pieces that the workers pull from one shared queue, so that each worker keeps
// up to `queue_depth` pieces in flight however small the request (no fixed slice per worker).
//
// Files are logical: one path, or several paths striped round robin in fixed chunks, so that
// several drives add up. O_DIRECT is used where the file system accepts it (see FileOptions);
// pieces that are not aligned to the file's logical block size (an odd tail, an odd offset) go
// through a buffered descriptor of the same file, so the caller's bytes never see garbage and
// nothing is written past the intended extent. Direct and buffered pieces of one request never
// share a page (see EngineWorker::carve_locked).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/fault.h"
#include "io/file_system.h"
#include "io/seams.h"
#include "src/base/status.h"

namespace zinf::io {

class Storage;

enum class OpKind : std::uint8_t { kRead, kWrite };

using FileId = std::uint32_t;

struct FileOptions {
    bool create = false;     // O_CREAT
    bool exclusive = false;  // O_EXCL (with create): refuse an existing file
    bool truncate = false;   // O_TRUNC
    bool read_only = false;
    unsigned mode = 0600;
    // With several paths: bytes per stripe chunk, a multiple of the logical block size.
    // 0 picks aio.block_size.
    std::uint64_t stripe_chunk_bytes = 0;
    // When > 0, space for this many logical bytes is reserved up front (fallocate), so that a
    // full disk is met here and not in the middle of training.
    std::uint64_t preallocate_bytes = 0;
    // Each path's directory is opened first and the file relative to it, never through a
    // symbolic link as the file's last component. With trusted_directory, a link as the
    // directory's own last component is refused too (the swap store's run directories, whose
    // path was resolved and checked when they were made).
    bool trusted_directory = false;
};

// O_DIRECT: kAuto uses it where the file system accepts it (else buffered, with one warning),
// kOn makes a refusal an error, kOff is buffered I/O.
enum class DirectMode : std::uint8_t { kAuto, kOn, kOff };

// How files are read and written: DeepSpeed's `aio` block, as the engine's plan hands it down.
struct AioOptions {
    std::uint64_t block_size_bytes = 1u << 20;  // bytes per piece
    int queue_depth = 32;                       // pieces in flight per worker thread
    int intra_op_parallelism = 1;               // worker threads
    bool single_submit = false;                 // one piece per submission syscall
    bool overlap_events = true;                 // keep submitting while completions are reaped
    std::string backend = "auto";               // auto | io_uring | libaio | posix
    DirectMode use_direct = DirectMode::kAuto;
    bool register_buffers = true;  // io_uring fixed buffers and files
    bool sqpoll = false;           // io_uring kernel submission thread
};

// Options of the simulated in-memory device (io/sim_storage.h; aio.backend is then ignored).
struct SimOptions {
    std::uint64_t seed = 1;
    std::uint32_t latency_us_min = 0;
    std::uint32_t latency_us_max = 50;
    std::uint64_t capacity_bytes = 1ULL << 40;  // writes beyond it fail with ENOSPC
    std::size_t logical_block_bytes = 512;
};

struct EngineOptions {
    AioOptions aio;
    // When set, each worker's backend is wrapped in a FaultyBackend following this plan.
    std::optional<FaultPlan> faults;
    // Where the engine's files live and what moves their bytes (borrowed; outlives the engine).
    // Null: a storage the engine makes and owns (io::make_storage): the simulated device when
    // `sim` is set, else the operating system's files through `file_system`, moved by the backend
    // that aio.backend names. Setting both this and `sim` is an error.
    Storage* storage = nullptr;
    // When set, files live in memory on a simulated device (an io::SimStorage the engine makes)
    // instead of the file system. A shorthand for tests: the engine treats that storage as any
    // other.
    std::optional<SimOptions> sim;
    // Where files are opened, preallocated, synced and removed (borrowed; outlives the engine):
    // the operating system's storage that the engine makes (storage null, sim unset) works
    // through it, and Engine::file_system() returns it for the directories and files that
    // callers set up beside the engine's (run directories, checkpoints). Null: the operating
    // system's (io::posix_file_system()). A FaultyFileSystem here fails file set-up as `faults`
    // fails reads and writes.
    FileSystem* file_system = nullptr;
    // Fault injection at each worker backend's kernel boundary (tests); none by default.
    Seams seams;
};

struct EngineStats {
    std::uint64_t bytes_read = 0;
    std::uint64_t bytes_written = 0;
    std::uint64_t requests_completed = 0;  // caller-level operations
    std::uint64_t pieces_completed = 0;    // block-sized pieces
    std::uint64_t short_transfers_resubmitted = 0;
    std::uint64_t retries = 0;  // EAGAIN / EINTR
    // How the completed pieces went to the kernel, so that a silent fallback to plain opcodes
    // shows: io_uring's registered (fixed) buffers and files; the other backends have neither.
    std::uint64_t pieces_fixed_buffer_read = 0;     // READ_FIXED
    std::uint64_t pieces_fixed_buffer_written = 0;  // WRITE_FIXED
    std::uint64_t pieces_fixed_file = 0;            // IOSQE_FIXED_FILE (either direction)
    std::uint64_t pieces_plain = 0;                 // neither a fixed buffer nor a fixed file
    // Faults injected by EngineOptions::faults (0 without a plan): a sweep knows whether its
    // n-th piece was reached.
    std::uint64_t faults_injected = 0;
    // Operations completed at submit without I/O while Engine::set_discard was on.
    std::uint64_t ops_discarded = 0;
    double latency_us_p50 = 0;  // per caller-level operation, submit to completion
    double latency_us_p99 = 0;
};

class Engine;

// The caller's handle on one asynchronous operation. Owned by the caller, reused freely after
// completion, and must stay alive (and not be resubmitted) until done() is true. Thread-safe to
// poll and wait from any thread.
class IoHandle {
public:
    IoHandle() = default;
    IoHandle(const IoHandle&) = delete;
    IoHandle& operator=(const IoHandle&) = delete;
    ~IoHandle();  // asserts that no operation is in flight

    // True when the operation has completed (successfully or not); never blocks.
    bool done() const noexcept { return state_.load(std::memory_order_acquire) == 0; }
    // Blocks until completion and returns its status: the first error met, with the file,
    // offset, length and operation in its message. An operation that fails still waits for its
    // other pieces, so no piece touches the buffer after done() turns true.
    Status wait();
    // As wait(), but gives up after `timeout` with Status::timeout (the operation continues).
    Status wait_for(std::chrono::microseconds timeout);
    std::uint64_t bytes() const noexcept { return length_bytes_; }
    // True when the last operation completed without I/O (Engine::set_discard): a read left
    // the buffer as it was, a write wrote nothing. Read after done().
    bool discarded() const noexcept { return discarded_; }
    // Urgent operations (someone computes nothing until they are done, e.g. a parameter's
    // fetch) are queued ahead of every operation that is not, in submission order among
    // themselves: they wait for a free piece, never behind a long queue. Pieces already in
    // flight are not preempted. Kept across operations; set it while the handle is idle.
    void set_urgent(bool on) noexcept { urgent_ = on; }
    bool urgent() const noexcept { return urgent_; }

private:
    friend class Engine;
    friend class EngineWorker;
    // state_: 0 once the operation has completed (or before its first submit), else kBusy, with
    // kWaiterBit set by a thread about to sleep on it. Waiters sleep on this word itself (a
    // futex), so completing an operation costs one atomic exchange, and a wake-up system call
    // only when somebody sleeps: no mutex, no condition variable (whose notification would
    // also keep the handle's memory in use after done() turns true).
    static constexpr std::uint32_t kBusy = 1;
    static constexpr std::uint32_t kWaiterBit = 2;
    std::atomic<std::uint32_t> state_{0};
    // One sleep on state_ while the operation is in flight (sets kWaiterBit first); returns on
    // completion, after `relative` (null: no limit), or spuriously. Callers loop on done().
    void sleep_once(const timespec* relative) noexcept;
    // Pieces in flight plus one while the operation is still being cut into pieces (the
    // cutting token): whichever completion takes it to 0 completes the operation.
    std::atomic<std::uint32_t> pending_{0};
    std::atomic<bool> failed_{false};  // set on the first error: stop cutting new pieces
    std::mutex error_mutex_;           // orders concurrent failures of several pieces
    Status error_;  // written under error_mutex_ until the operation completes; read after
    std::uint64_t length_bytes_ = 0;
    std::chrono::steady_clock::time_point submitted_at_;
    // The operation, while queued in the engine (guarded by the engine's queue mutex).
    IoHandle* next_ = nullptr;
    void* file_ = nullptr;
    std::byte* buffer_ = nullptr;
    std::uint64_t offset_bytes_ = 0;
    std::uint64_t cursor_bytes_ = 0;
    OpKind op_ = OpKind::kRead;
    bool discarded_ = false;
    bool urgent_ = false;
};

class Engine {
public:
    // Builds the workers and their backends, which the storage makes (EngineOptions::storage).
    // On the operating system's storage, aio.backend == "auto" tries io_uring, then libaio, then
    // posix, and logs which it chose and why it passed over the others; a backend named
    // explicitly that cannot be set up is an error (kNotSupported) saying why.
    static Result<std::unique_ptr<Engine>> create(const EngineOptions& options);
    // Waits for everything in flight, then stops the workers and closes every file.
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    std::string_view backend_name() const noexcept;
    const AioOptions& aio() const noexcept;
    // EngineOptions::file_system, or the OS's: where callers set up their own directories and
    // files beside the engine's.
    FileSystem& file_system() const noexcept;

    // Opens one logical file over `paths` (several paths: one file per path, striped) on the
    // engine's storage. Applies aio.use_direct: auto falls back to buffered I/O with one warning
    // where O_DIRECT is refused, on (DirectMode::kOn) makes the refusal an error. A failed open
    // removes the files it created. Errors name the path.
    Result<FileId> open(std::span<const std::string> paths, const FileOptions& options);
    Result<FileId> open(const std::string& path, const FileOptions& options) {
        return open(std::span<const std::string>(&path, 1), options);
    }
    // Closes a file. Precondition: nothing in flight on it.
    Status close(FileId id);
    bool is_direct(FileId id) const;
    // The alignment (bytes) of buffers, offsets and lengths that go straight to O_DIRECT: the
    // largest logical block size over the file's stripes (queried, not assumed). 1 if buffered.
    std::size_t alignment_bytes(FileId id) const;
    // Makes what was written durable (fdatasync) on every stripe, through the storage.
    Status sync(FileId id);

    // Registers a caller-owned region (e.g. the pinned pool) with every worker's backend as
    // fixed buffers (io_uring; split into pieces of at most 1 GiB). Pieces of requests whose
    // buffers lie inside use the fixed-buffer opcodes. Call before submitting I/O on it; the
    // region must outlive the engine or be unregistered by destroying the engine. A no-op when
    // aio.register_buffers is false or the storage's backends have no fixed buffers (the
    // simulated device's, Storage::registers_buffers). On failure (e.g. RLIMIT_MEMLOCK) the
    // engine keeps working with plain opcodes and returns the error.
    Status register_buffers(std::span<std::byte> region);

    // Starts an asynchronous read into `buffer` (caller-owned until done). Returns an error
    // without starting anything for bad arguments (unknown file, handle in use, empty buffer).
    Status submit_read(IoHandle& handle, FileId file, std::uint64_t offset_bytes,
                       std::span<std::byte> buffer);
    Status submit_write(IoHandle& handle, FileId file, std::uint64_t offset_bytes,
                        std::span<const std::byte> buffer);

    struct BatchItem {
        IoHandle* handle;
        OpKind op;
        FileId file;
        std::uint64_t offset_bytes;
        std::span<std::byte> buffer;
    };
    // Submits several operations at once (one wake-up of the workers).
    Status submit(std::span<const BatchItem> items);

    // Synchronous conveniences: submit and wait.
    Status read(FileId file, std::uint64_t offset_bytes, std::span<std::byte> buffer);
    Status write(FileId file, std::uint64_t offset_bytes, std::span<const std::byte> buffer);

    EngineStats stats() const;
    void reset_stats();

    // While on, every submitted operation completes at once, successfully, without I/O: reads
    // leave their buffers as they are, writes write nothing (IoHandle::discarded() tells).
    // Operations already in flight are not affected. For timing everything but the I/O
    // (zinfinity-train --measure-overlap's compute-only pass); the files' contents no longer
    // match what the callers believe they wrote, so a caller that turns it on stops trusting
    // what it reads back. Thread-safe.
    void set_discard(bool on) noexcept;
    bool discarding() const noexcept;

private:
    friend class EngineWorker;
    Engine();
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::io
