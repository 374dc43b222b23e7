// The measuring code shared by `zinfinity-bench io`, `sweep` and `tune`: the bench's own test
// files (created exclusively, removed at exit), one io::Engine per configuration, and one timed
// sequential pass over the file that reports GB/s, IOPS, op latency and CPU seconds per GB.
#pragma once

#include <csignal>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/engine.h"
#include "io/fault.h"
#include "src/base/aligned.h"
#include "src/base/config.h"
#include "src/base/status.h"

namespace zinf::bench {

// SIGINT and SIGTERM set a flag that the run loops poll: they stop submitting, drain what is in
// flight, and return Status::interrupted-like errors so that the files are removed on the way
// out. A second signal restores the default action (quit at once). Safe to call repeatedly.
void install_interrupt_handler();
bool interrupted() noexcept;
Status interrupted_status();

enum class IoOp : std::uint8_t { kRead, kWrite };
std::string_view io_op_name(IoOp op) noexcept;
// "read", "write", "write,read" (also "both", which means write then read), "read,write".
Result<std::vector<IoOp>> parse_io_ops(const std::string& text);

// Decimal gigabytes: GB/s in this tool is always 1e9 bytes per second.
constexpr double kBytesPerGb = 1e9;

// The bench's own test files: one per directory, named zinf-bench-<pid>-<n>.dat, striped by the
// engine into one logical file of `size_bytes`. The object records exactly which files it
// created (O_CREAT | O_EXCL, and their inode), refuses names that already exist, and removes what
// it created when destroyed (only if the name still refers to the same inode).
class BenchFiles {
public:
    // Validates the directories (each an existing writable directory), checks the free space of
    // each file system against the share of `size_bytes` that lands on it (directories on one file
    // system add up), picks names, and creates each file exclusively (empty). Errors name the
    // directory, the bytes needed and the bytes free, or the file that already exists.
    static Result<std::unique_ptr<BenchFiles>> create(const std::vector<std::string>& dirs,
                                                      std::uint64_t size_bytes);
    ~BenchFiles();
    BenchFiles(const BenchFiles&) = delete;
    BenchFiles& operator=(const BenchFiles&) = delete;

    const std::vector<std::string>& paths() const noexcept { return paths_; }
    std::uint64_t size_bytes() const noexcept { return size_bytes_; }
    // Whether the whole logical file holds written data (reads then measure the disk, not holes).
    bool written() const noexcept { return written_; }
    void mark_written() noexcept { written_ = true; }
    // Removes the files now (idempotent); used by the destructor.
    void remove() noexcept;

    // The name the next BenchFiles of this process would use in `dir` (tests and messages).
    static std::string file_name(int pid, int index);

private:
    BenchFiles() = default;
    struct Created {
        std::string path;
        std::uint64_t device = 0;
        std::uint64_t inode = 0;
    };
    std::vector<std::string> paths_;
    std::vector<Created> created_;
    std::uint64_t size_bytes_ = 0;
    bool written_ = false;
};

// One timed pass: what was moved, how fast, and at what CPU cost.
struct PassFigures {
    IoOp op = IoOp::kRead;
    std::uint64_t bytes = 0;
    double seconds = 0;
    double gb_per_s = 0;  // decimal GB (1e9 bytes) per second
    double iops = 0;      // block-size pieces completed per second
    std::uint64_t pieces = 0;
    std::uint64_t ops = 0;      // caller-level operations (of op_size_bytes each)
    double latency_us_p50 = 0;  // per caller-level operation, submit to completion
    double latency_us_p99 = 0;
    double cpu_seconds = 0;  // whole process, user + system (getrusage RUSAGE_SELF)
    double cpu_seconds_per_gb = 0;
    // Voluntary + involuntary context switches of the whole process (every thread, the kernel's
    // io_uring workers too): each hand-off between the caller, the engine's workers and the
    // kernel's costs one where a thread sleeps.
    std::uint64_t context_switches = 0;
    double context_switches_per_gb = 0;
    std::uint64_t short_transfers = 0;
    std::uint64_t retries = 0;
    // How the pieces went to the kernel (io::EngineStats), so that a silent fallback from
    // io_uring's registered buffers and files to plain opcodes shows.
    std::uint64_t pieces_fixed_buffer = 0;  // READ_FIXED / WRITE_FIXED
    std::uint64_t pieces_fixed_file = 0;    // on a registered file
    std::uint64_t pieces_plain = 0;         // neither
    // Bytes of the buffer region backed by transparent huge pages after the pass (0 where the
    // kernel has none to give): with them a piece is one physically contiguous segment.
    std::uint64_t buffer_huge_page_bytes = 0;
};

struct SessionOptions {
    io::AioOptions aio;
    std::optional<io::FaultPlan> faults;
    // Bytes per caller-level operation handed to the engine; 0 picks max(block size, 1 MiB)
    // rounded to a multiple of the block size. The engine cuts each operation into block-size
    // pieces.
    std::uint64_t op_size_bytes = 0;
    // Bytes of aligned buffer memory the pass may use at most (one region, registered once).
    std::uint64_t buffer_limit_bytes = 1ULL << 30;
    bool show_progress = true;
};

// The pass plan derived from the options: how many operations are kept outstanding so that
// every worker keeps queue_depth pieces in flight with some queued behind them.
struct PassPlan {
    std::uint64_t op_size_bytes = 0;
    std::size_t ops_outstanding = 0;
    std::uint64_t buffer_bytes = 0;
    bool limited_by_buffer = false;  // fewer than queue_depth x threads pieces fit in the limit
};
PassPlan plan_pass(const io::AioOptions& aio, std::uint64_t op_size_bytes,
                   std::uint64_t buffer_limit_bytes, std::uint64_t file_size_bytes);

// An io::Engine with the bench file open and one aligned buffer region (registered with the
// engine when aio.register_buffers is on). Not thread-safe; one caller thread.
class IoSession {
public:
    // Errors: the engine's (backend unavailable: kNotSupported; O_DIRECT refused with
    // use_direct on), allocation, and a block size that is not a multiple of the file's logical
    // block size (kInvalidArgument naming both).
    static Result<std::unique_ptr<IoSession>> create(BenchFiles& files,
                                                     const SessionOptions& options);
    ~IoSession();
    IoSession(const IoSession&) = delete;
    IoSession& operator=(const IoSession&) = delete;

    std::string_view backend_name() const noexcept { return engine_->backend_name(); }
    bool is_direct() const { return engine_->is_direct(file_); }
    std::size_t alignment_bytes() const { return engine_->alignment_bytes(file_); }
    const PassPlan& plan() const noexcept { return plan_; }
    const io::AioOptions& aio() const noexcept { return options_.aio; }

    // Writes the whole file once (untimed) unless it already holds data, so that a read pass
    // reads real blocks; with buffered I/O it then syncs and drops the file's cached pages.
    Status prepare_for_read();
    // One timed sequential pass over the whole file. Buffered passes: a write includes the final
    // fdatasync; a read starts after the file's pages were dropped from the page cache
    // (posix_fadvise DONTNEED), though read-ahead and other cache effects may still apply.
    // Errors: the first failed operation's Status (with file, offset, length, operation), or an
    // interruption.
    Result<PassFigures> run_pass(IoOp op, std::string_view progress_label = {});

private:
    IoSession(BenchFiles& files, const SessionOptions& options)
        : files_(files), options_(options) {}
    Status drop_page_cache();
    void fill_for_writes();

    BenchFiles& files_;
    SessionOptions options_;
    PassPlan plan_;
    // Declared before the engine so that it outlives it: the engine holds it registered.
    AlignedBuffer region_;
    std::unique_ptr<io::Engine> engine_;
    io::FileId file_ = 0;
    bool file_open_ = false;
    bool filled_ = false;
};

// Median, minimum and maximum of a non-empty list.
struct Spread {
    double median = 0;
    double min = 0;
    double max = 0;
};
Spread spread_of(std::vector<double> values);

// What this process has used so far, all threads (getrusage RUSAGE_SELF).
struct ProcessUsage {
    double cpu_seconds = 0;              // user + system
    std::uint64_t context_switches = 0;  // voluntary + involuntary
};
ProcessUsage process_usage();

}  // namespace zinf::bench
