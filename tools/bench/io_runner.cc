// The bench's measuring core: exclusive test files, one engine per configuration, timed passes.
#include "tools/bench/io_runner.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <random>

#include "src/base/file.h"
#include "src/base/log.h"
#include "src/base/units.h"
#include "tools/cli/progress.h"

namespace zinf::bench {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;

void on_interrupt(int signo) {
    if (g_interrupted != 0) {
        // Second signal: the user wants out now. Restore the default action and re-raise.
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(signo, &dfl, nullptr);
        raise(signo);
        return;
    }
    g_interrupted = 1;
    static const char kMessage[] =
        "\nzinfinity-bench: interrupted; stopping and removing the bench files "
        "(signal again to quit at once)\n";
    // write(2) is async-signal-safe; its result is irrelevant here.
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
}

// Bytes a pass may wait on one operation before calling the I/O hung: generous, because a
// virtual disk under host contention can stall for seconds.
constexpr auto kOpWaitSlice = std::chrono::milliseconds(100);
constexpr int kOpWaitSlicesMax = 10 * 60 * 10;  // ten minutes

}  // namespace

void install_interrupt_handler() {
    struct sigaction sa {};
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
}

bool interrupted() noexcept {
    return g_interrupted != 0;
}

Status interrupted_status() {
    return Status(StatusCode::kInternal, "interrupted by a signal", EINTR);
}

std::string_view io_op_name(IoOp op) noexcept {
    return op == IoOp::kRead ? "read" : "write";
}

Result<std::vector<IoOp>> parse_io_ops(const std::string& text) {
    if (text == "both") return std::vector<IoOp>{IoOp::kWrite, IoOp::kRead};
    std::vector<IoOp> ops;
    std::size_t start = 0;
    while (start <= text.size()) {
        const std::size_t comma = std::min(text.find(',', start), text.size());
        const std::string item = text.substr(start, comma - start);
        if (item == "read") {
            ops.push_back(IoOp::kRead);
        } else if (item == "write") {
            ops.push_back(IoOp::kWrite);
        } else {
            return Status::invalid_argument(
                str_cat("--op: expected read, write, write,read or both, got '", text, "'"));
        }
        start = comma + 1;
    }
    for (std::size_t i = 0; i < ops.size(); ++i) {
        for (std::size_t j = i + 1; j < ops.size(); ++j) {
            if (ops[i] == ops[j]) {
                return Status::invalid_argument(
                    str_cat("--op: '", text, "' names ", io_op_name(ops[i]), " twice"));
            }
        }
    }
    return ops;
}

// ---------------------------------------------------------------------------------------------
// BenchFiles

std::string BenchFiles::file_name(int pid, int index) {
    return str_cat("zinf-bench-", pid, "-", index, ".dat");
}

Result<std::unique_ptr<BenchFiles>> BenchFiles::create(const std::vector<std::string>& dirs,
                                                       std::uint64_t size_bytes) {
    if (dirs.empty()) return Status::invalid_argument("--path: at least one directory is required");
    if (size_bytes == 0) return Status::invalid_argument("--size: must be greater than zero");
    // Several directories on one file system share its free space; add their shares up.
    std::map<std::uint64_t, std::pair<std::uint64_t, std::string>> need_by_device;
    const std::uint64_t share_bytes = (size_bytes + dirs.size() - 1) / dirs.size();
    for (const auto& dir : dirs) {
        Status status = check_writable_directory(dir);
        if (!status.is_ok()) return status.with_context("--path");
        struct stat st {};
        if (::stat(dir.c_str(), &st) != 0) {
            return Status::from_errno(errno, str_cat("--path: stat ", dir));
        }
        auto& entry = need_by_device[static_cast<std::uint64_t>(st.st_dev)];
        entry.first += share_bytes;
        entry.second += entry.second.empty() ? dir : ", " + dir;
    }
    for (const auto& dir : dirs) {
        struct stat st {};
        if (::stat(dir.c_str(), &st) != 0) {
            return Status::from_errno(errno, str_cat("--path: stat ", dir));
        }
        const auto& [need, names] = need_by_device[static_cast<std::uint64_t>(st.st_dev)];
        ZINF_ASSIGN_OR_RETURN(const std::uint64_t free_bytes, free_space_bytes(dir));
        // Keep a margin so that the bench never fills a file system to the last block.
        const std::uint64_t margin_bytes =
            std::min<std::uint64_t>(need / 20 + (64ULL << 20), 1ULL << 30);
        if (free_bytes < need + margin_bytes) {
            return Status::no_space(
                str_cat("--path ", dir, ": not enough free space for the test file: needs ", need,
                        " bytes (", format_bytes(need), ", plus a margin of ",
                        format_bytes(margin_bytes), ") on the file system of ", names, ", has ",
                        free_bytes, " bytes (", format_bytes(free_bytes), ") free; lower --size"));
        }
    }

    auto files = std::unique_ptr<BenchFiles>(new BenchFiles());
    files->size_bytes_ = size_bytes;
    static int next_index = 0;
    const int pid = static_cast<int>(::getpid());
    const int index = next_index++;
    for (const auto& dir : dirs) {
        std::string path = dir;
        if (path.empty() || path.back() != '/') path += '/';
        path += file_name(pid, index);
        // O_EXCL: a file of this name that we did not create is never opened, let alone
        // overwritten or removed.
        const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0) {
            const int err = errno;
            if (err == EEXIST) {
                return Status::invalid_argument(
                    str_cat(path, ": a file of this name already exists and was not created by ",
                            "this run; refusing to overwrite it (remove it if it is a leftover ",
                            "of an earlier bench)"));
            }
            return Status::from_errno(err, str_cat("creating bench file ", path));
        }
        FileDescriptor owned(fd);
        struct stat st {};
        if (::fstat(fd, &st) != 0) {
            const int err = errno;
            ::unlink(path.c_str());
            return Status::from_errno(err, str_cat("fstat ", path));
        }
        files->created_.push_back(Created{path, static_cast<std::uint64_t>(st.st_dev),
                                          static_cast<std::uint64_t>(st.st_ino)});
        files->paths_.push_back(path);
    }
    return files;
}

BenchFiles::~BenchFiles() {
    remove();
}

void BenchFiles::remove() noexcept {
    for (const auto& c : created_) {
        struct stat st {};
        if (::lstat(c.path.c_str(), &st) != 0) continue;  // already gone
        if (static_cast<std::uint64_t>(st.st_dev) != c.device ||
            static_cast<std::uint64_t>(st.st_ino) != c.inode) {
            log::warning(c.path, ": not removed: it is no longer the file this bench created");
            continue;
        }
        if (::unlink(c.path.c_str()) != 0) {
            log::warning(c.path, ": could not remove the bench file: ", std::strerror(errno));
        }
    }
    created_.clear();
}

// ---------------------------------------------------------------------------------------------
// Pass planning and figures

PassPlan plan_pass(const io::AioOptions& aio, std::uint64_t op_size_bytes,
                   std::uint64_t buffer_limit_bytes, std::uint64_t file_size_bytes) {
    ZINF_ASSERT_GT(aio.block_size_bytes, 0u);
    ZINF_ASSERT_GT(aio.queue_depth, 0);
    ZINF_ASSERT_GT(aio.intra_op_parallelism, 0);
    const std::uint64_t block = aio.block_size_bytes;
    PassPlan plan;
    std::uint64_t op =
        op_size_bytes != 0 ? op_size_bytes : std::max<std::uint64_t>(block, 1ULL << 20);
    op = (op + block - 1) / block * block;  // whole pieces only
    plan.op_size_bytes = op;
    // Keep every worker's queue full (queue_depth pieces each) and one operation per worker
    // queued behind, so that a worker finds the next piece waiting when one completes, without a
    // round trip through this thread. No more: each buffer is reused after all the others, and
    // on memory-speed storage a larger set of buffers costs copy bandwidth (tmpfs, libaio reads
    // at 1 MiB / queue depth 8, median ratio to fio in alternated runs: a quarter more queued
    // 0.91-0.98, one more 0.96-1.00, a whole queue more 0.76-0.81; fio cycles through exactly
    // queue_depth buffers).
    const std::uint64_t pieces_in_flight = static_cast<std::uint64_t>(aio.queue_depth) *
                                           static_cast<std::uint64_t>(aio.intra_op_parallelism);
    const std::uint64_t bytes_in_flight = pieces_in_flight * block;
    std::uint64_t ops = (bytes_in_flight + op - 1) / op;
    ops += static_cast<std::uint64_t>(aio.intra_op_parallelism);
    const std::uint64_t ops_by_limit = std::max<std::uint64_t>(1, buffer_limit_bytes / op);
    if (ops > ops_by_limit) {
        ops = ops_by_limit;
        plan.limited_by_buffer = ops * op < bytes_in_flight + op;
    }
    // No point in more buffers than the file has operations.
    const std::uint64_t ops_in_file = std::max<std::uint64_t>(1, (file_size_bytes + op - 1) / op);
    ops = std::min(ops, ops_in_file);
    plan.ops_outstanding = static_cast<std::size_t>(ops);
    plan.buffer_bytes = ops * op;
    return plan;
}

Spread spread_of(std::vector<double> values) {
    ZINF_ASSERT(!values.empty());
    std::sort(values.begin(), values.end());
    Spread s;
    const std::size_t n = values.size();
    s.median = n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
    s.min = values.front();
    s.max = values.back();
    return s;
}

ProcessUsage process_usage() {
    struct rusage ru {};
    if (::getrusage(RUSAGE_SELF, &ru) != 0) return {};  // cannot fail with RUSAGE_SELF
    const auto secs = [](const timeval& tv) {
        return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) * 1e-6;
    };
    return ProcessUsage{
        secs(ru.ru_utime) + secs(ru.ru_stime),
        static_cast<std::uint64_t>(ru.ru_nvcsw) + static_cast<std::uint64_t>(ru.ru_nivcsw)};
}

// ---------------------------------------------------------------------------------------------
// IoSession

Result<std::unique_ptr<IoSession>> IoSession::create(BenchFiles& files,
                                                     const SessionOptions& options) {
    const io::AioOptions& aio = options.aio;
    if (aio.block_size_bytes == 0 || aio.block_size_bytes % 512 != 0) {
        return Status::invalid_argument(
            str_cat("--block-size: expected a multiple of 512 bytes, got ", aio.block_size_bytes));
    }
    auto session = std::unique_ptr<IoSession>(new IoSession(files, options));
    session->plan_ =
        plan_pass(aio, options.op_size_bytes, options.buffer_limit_bytes, files.size_bytes());

    io::EngineOptions engine_options;
    engine_options.aio = aio;
    engine_options.faults = options.faults;
    ZINF_ASSIGN_OR_RETURN(session->engine_, io::Engine::create(engine_options));

    io::FileOptions file_options;
    // The files exist (BenchFiles made them); reserve their space on first use so that a full
    // disk shows up here rather than mid-pass.
    if (!files.written()) file_options.preallocate_bytes = files.size_bytes();
    ZINF_ASSIGN_OR_RETURN(session->file_, session->engine_->open(files.paths(), file_options));
    session->file_open_ = true;

    const std::size_t alignment = session->engine_->alignment_bytes(session->file_);
    if (aio.block_size_bytes % alignment != 0) {
        return Status::invalid_argument(str_cat("--block-size ", aio.block_size_bytes,
                                                " is not a multiple of the logical block size (",
                                                alignment, " bytes) of ", files.paths().front()));
    }
    if (files.size_bytes() % alignment != 0) {
        return Status::invalid_argument(str_cat("--size ", files.size_bytes(),
                                                " is not a multiple of the logical block size (",
                                                alignment, " bytes) of ", files.paths().front()));
    }

    // In transparent huge pages where the kernel has them, as the engine's own I/O buffers (the
    // pinned pools) are: see advise_huge_pages.
    ZINF_ASSIGN_OR_RETURN(session->region_,
                          AlignedBuffer::allocate_for_io(session->plan_.buffer_bytes));
    // The buffers are filled only before the first write pass (fill_for_writes): a read-only
    // session leaves them untouched until registration pins them, as fio does with its buffers.
    if (aio.register_buffers) ZINF_TRY(session->engine_->register_buffers(session->region_.span()));
    return session;
}

IoSession::~IoSession() {
    if (file_open_) {
        Status status = engine_->close(file_);
        if (!status.is_ok()) log::warning("closing the bench file: ", status.to_string());
    }
    // engine_ is destroyed before region_ (declaration order), as the registration requires.
}

void IoSession::fill_for_writes() {
    if (filled_) return;
    // A non-repeating pattern: a device or host layer that detects zero or repeated blocks would
    // otherwise make writes look faster than they are.
    std::mt19937_64 rng(0x7a696e66);
    auto* words = region_.as<std::uint64_t>();
    const std::size_t word_count = region_.size() / sizeof(std::uint64_t);
    for (std::size_t i = 0; i < word_count; ++i) words[i] = rng();
    filled_ = true;
}

Status IoSession::drop_page_cache() {
    if (is_direct()) return Status::ok();
    ZINF_TRY(engine_->sync(file_));
    for (const auto& path : files_.paths()) {
        FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        if (!fd.valid()) {
            return Status::from_errno(errno, str_cat("open ", path, " to drop its cached pages"));
        }
        const int rc = ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
        if (rc != 0) return Status::from_errno(rc, str_cat("posix_fadvise(DONTNEED) ", path));
    }
    return Status::ok();
}

Status IoSession::prepare_for_read() {
    if (files_.written()) return Status::ok();
    auto figures = run_pass(IoOp::kWrite, "preparing the test file");
    if (!figures.has_value()) {
        return figures.error().with_context("writing the test file before reading it");
    }
    return Status::ok();
}

namespace {

// The operations in flight of one pass: `slots` of them, each on its own op_bytes slice of the
// region, completed in submission order (the oldest first) and refilled in one batch. What
// the pass counts (bytes and operations done, the first error) lives here too.
class PassRing {
public:
    PassRing(io::Engine& engine, io::FileId file, std::span<std::byte> region, IoOp op,
             std::uint64_t total_bytes, const PassPlan& plan)
        : engine_(engine),
          file_(file),
          region_(region),
          op_(op),
          total_bytes_(total_bytes),
          op_bytes_(plan.op_size_bytes),
          slots_(plan.ops_outstanding),
          handles_(std::make_unique<io::IoHandle[]>(slots_)) {
        batch_.reserve(slots_);
    }

    // Runs the pass to its end: until every operation completed, or until what is in flight
    // drained after an error or an interruption.
    void run(cli::Progress* progress) {
        first_error_ = refill();
        if (!first_error_.is_ok()) stopping_ = true;
        while (outstanding_ > 0) {
            retire_oldest(wait_oldest());
            if (interrupted()) stopping_ = true;
            // Collect whatever else has completed in order, then queue the freed slots at once.
            while (outstanding_ > 0 && handles_[oldest_].done()) {
                retire_oldest(handles_[oldest_].wait());
            }
            if (!stopping_) {
                Status s = refill();
                if (!s.is_ok()) {
                    first_error_ = s;
                    stopping_ = true;
                }
            }
            if (progress != nullptr) progress->update(static_cast<double>(bytes_done_));
        }
    }

    Status& first_error() { return first_error_; }
    std::uint64_t bytes_done() const { return bytes_done_; }
    std::uint64_t bytes_submitted() const { return next_offset_; }
    std::uint64_t ops_done() const { return ops_done_; }

private:
    // Queues operations on the free slots (oldest + outstanding, ...) in one batch.
    Status refill() {
        batch_.clear();
        while (outstanding_ < slots_ && next_offset_ < total_bytes_ && !stopping_) {
            const std::size_t slot = (oldest_ + outstanding_) % slots_;
            const std::uint64_t length = std::min(op_bytes_, total_bytes_ - next_offset_);
            batch_.push_back(io::Engine::BatchItem{&handles_[slot], kind(), file_, next_offset_,
                                                   region_.subspan(slot * op_bytes_, length)});
            next_offset_ += length;
            ++outstanding_;
        }
        if (batch_.empty()) return Status::ok();
        Status status = engine_.submit(batch_);
        if (!status.is_ok()) {
            // Nothing of the batch started (the engine checks arguments before starting any).
            outstanding_ -= batch_.size();
            return status.with_context(
                str_cat(io_op_name(op_), " submit at offset ", batch_.front().offset_bytes));
        }
        return Status::ok();
    }

    // Waits for the oldest operation, in slices so that an interruption is noticed; the bound
    // is kOpWaitSlicesMax slices.
    Status wait_oldest() {
        io::IoHandle& handle = handles_[oldest_];
        Status status = Status::timeout("unreached");
        for (int i = 0; i < kOpWaitSlicesMax; ++i) {
            status = handle.wait_for(kOpWaitSlice);
            if (status.code() != StatusCode::kTimeout) break;
            if (interrupted()) stopping_ = true;
        }
        ZINF_ASSERT_MSG(handle.done(), str_cat("a ", io_op_name(op_),
                                               " operation did not complete in ten minutes"));
        return status;
    }

    // Counts the oldest operation, completed with `status`, and frees its slot. The first
    // error stops the pass.
    void retire_oldest(const Status& status) {
        const io::IoHandle& handle = handles_[oldest_];
        if (status.is_ok()) {
            bytes_done_ += handle.bytes();
        } else if (first_error_.is_ok()) {
            first_error_ = status;
            stopping_ = true;
        }
        --outstanding_;
        oldest_ = (oldest_ + 1) % slots_;
        ++ops_done_;
    }

    io::OpKind kind() const { return op_ == IoOp::kRead ? io::OpKind::kRead : io::OpKind::kWrite; }

    io::Engine& engine_;
    io::FileId file_;
    std::span<std::byte> region_;
    IoOp op_;
    std::uint64_t total_bytes_;
    std::uint64_t op_bytes_;
    std::size_t slots_;
    // The handles live as long as the pass, and run() returns only once they have drained.
    std::unique_ptr<io::IoHandle[]> handles_;
    std::vector<io::Engine::BatchItem> batch_;
    std::uint64_t next_offset_ = 0;
    std::size_t oldest_ = 0;  // ring index of the oldest outstanding operation
    std::size_t outstanding_ = 0;
    std::uint64_t bytes_done_ = 0;
    std::uint64_t ops_done_ = 0;
    Status first_error_;
    bool stopping_ = false;
};

// The figures of a completed pass from what it moved, how long it took, the engine's counters
// and the process's usage around it.
PassFigures pass_figures(IoOp op, const PassRing& ring, double seconds,
                         const io::EngineStats& stats, std::span<const std::byte> region,
                         const ProcessUsage& usage_start, const ProcessUsage& usage_end) {
    PassFigures f;
    f.op = op;
    if (auto huge = huge_page_bytes_backing(region); huge.has_value()) {
        f.buffer_huge_page_bytes = std::min<std::uint64_t>(*huge, region.size());
    }
    f.bytes = ring.bytes_done();
    f.seconds = seconds;
    f.gb_per_s = static_cast<double>(f.bytes) / kBytesPerGb / f.seconds;
    f.pieces = stats.pieces_completed;
    f.ops = ring.ops_done();
    f.iops = static_cast<double>(stats.pieces_completed) / f.seconds;
    f.latency_us_p50 = stats.latency_us_p50;
    f.latency_us_p99 = stats.latency_us_p99;
    const double gb = static_cast<double>(f.bytes) / kBytesPerGb;
    f.cpu_seconds = usage_end.cpu_seconds - usage_start.cpu_seconds;
    f.cpu_seconds_per_gb = f.cpu_seconds / gb;
    f.context_switches = usage_end.context_switches - usage_start.context_switches;
    f.context_switches_per_gb = static_cast<double>(f.context_switches) / gb;
    f.short_transfers = stats.short_transfers_resubmitted;
    f.retries = stats.retries;
    f.pieces_fixed_buffer = stats.pieces_fixed_buffer_read + stats.pieces_fixed_buffer_written;
    f.pieces_fixed_file = stats.pieces_fixed_file;
    f.pieces_plain = stats.pieces_plain;
    return f;
}

}  // namespace

Result<PassFigures> IoSession::run_pass(IoOp op, std::string_view progress_label) {
    if (op == IoOp::kRead) {
        ZINF_TRY(prepare_for_read());
        ZINF_TRY(drop_page_cache());
    } else {
        fill_for_writes();  // untimed
    }
    const std::uint64_t total_bytes = files_.size_bytes();
    ZINF_ASSERT_GT(plan_.ops_outstanding, 0u);
    ZINF_ASSERT_LE(static_cast<std::uint64_t>(plan_.ops_outstanding) * plan_.op_size_bytes,
                   region_.size());
    ZINF_ASSERT(is_aligned(region_.data(), kDefaultAlignmentBytes));

    PassRing ring(*engine_, file_, region_.span(), op, total_bytes, plan_);
    std::string label =
        progress_label.empty() ? std::string(io_op_name(op)) : std::string(progress_label);
    cli::Progress progress(label, static_cast<double>(total_bytes), "GB", kBytesPerGb);

    engine_->reset_stats();
    const ProcessUsage usage_start = process_usage();
    const auto start = std::chrono::steady_clock::now();
    ring.run(options_.show_progress ? &progress : nullptr);
    if (ring.first_error().is_ok() && !interrupted() && op == IoOp::kWrite && !is_direct()) {
        // A buffered write is not done until it is on the disk.
        ring.first_error() = engine_->sync(file_);
    }
    const auto end = std::chrono::steady_clock::now();
    const ProcessUsage usage_end = process_usage();
    progress.finish();

    if (!ring.first_error().is_ok()) return ring.first_error();
    if (interrupted()) return interrupted_status();
    ZINF_ASSERT_EQ(ring.bytes_done(), total_bytes);
    ZINF_ASSERT_EQ(ring.bytes_submitted(), total_bytes);
    if (op == IoOp::kWrite) files_.mark_written();
    const io::EngineStats stats = engine_->stats();
    return pass_figures(op, ring, std::chrono::duration<double>(end - start).count(), stats,
                        region_.span(), usage_start, usage_end);
}

}  // namespace zinf::bench
