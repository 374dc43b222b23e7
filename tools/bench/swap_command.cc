// `zinfinity-bench swap`: streams a partitioned model NVMe → pinned host → device budget in trace
// order through tier::ResidencyManager (EngineMover over io::Engine, CPU device), with a
// simulated compute per partition that busy-loops on the computing thread. Prints the streaming
// GB/s beside the engine's raw read GB/s measured in the same run, the I/O-alone and
// compute-alone times and the overlap efficiency, and the memory peaks (RSS, pinned pool, device).
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "io/engine.h"
#include "src/base/aio_backends.h"
#include "src/base/aligned.h"
#include "src/base/log.h"
#include "src/base/units.h"
#include "src/device/cpu_device.h"
#ifdef ZINF_BENCH_HAVE_CUDA
#include "src/device/cuda_device.h"
#endif
#include "src/tier/engine_mover.h"
#include "src/tier/residency_manager.h"
#include "tools/bench/commands.h"
#include "tools/bench/io_runner.h"
#include "tools/bench/stats.h"
#include "tools/cli/args.h"
#include "tools/cli/progress.h"

namespace zinf::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct SwapOptions {
    std::string dir;
    std::uint64_t model_bytes = 0;
    std::uint64_t partition_bytes = 0;
    bool compute_auto = false;
    double compute_ms = 0;
    std::uint64_t device_budget_bytes = 0;
    std::uint64_t pinned_bytes = 0;
    std::uint64_t prefetch_numel = 0;  // 0: auto
    std::uint64_t max_live_numel = 0;
    DType dtype = DType::kFloat16;
    bool cuda = false;  // --device cuda: the device tier in GPU memory
    int iterations = 1;
    std::int64_t poll_us = 0;
    bool progress = true;
    io::AioOptions aio;
};

void declare_flags(cli::Args& args) {
    args.add("path", "", "directory for the swap file (created exclusively, removed at exit)");
    args.add("model-size", "8GiB", "bytes of the partitioned model streamed per iteration");
    args.add("partition-size", "64MiB", "bytes per partition (the last one may be smaller)");
    args.add("compute-ms", "auto",
             "simulated compute per partition, a busy loop on the computing thread\n"
             "(ms, fractions allowed); auto: the measured I/O time per partition");
    args.add("device", "cpu",
             "where the device tier lives: cpu (the CPU device's memory) or cuda (GPU 0's\n"
             "memory; host -> device copies from the pinned pool; needs a CUDA build)");
    args.add("device-budget", "1GiB", "device tier budget (bytes of the device's memory)");
    args.add("pinned", "512MiB", "pinned host pool: the host tier budget");
    args.add("prefetch-bucket", "auto",
             "stage3_prefetch_bucket_size in elements of --dtype; auto: the pinned\n"
             "pool's bytes (every pinned buffer can stage a read ahead)");
    args.add("max-live", "1e9", "stage3_max_live_parameters in elements of --dtype");
    args.add("dtype", "fp16", "element type of the partitions: fp16, bf16 or fp32");
    args.add("poll-us", "0",
             "inside the simulated compute, let the residency manager notice\n"
             "completed moves and start the next ones every this many microseconds\n"
             "(as a compute thread that launches asynchronous kernels would); 0: never,\n"
             "moves then advance only at acquire and release");
    args.add("iterations", "1",
             "measured iterations of each timed phase (after one recording iteration)");
    args.add("backend", "auto", "I/O backend: " + aio_backend_list(/*with_auto=*/true));
    args.add("block-size", "1MiB", "aio.block_size: bytes per I/O piece");
    args.add("queue-depth", "32", "aio.queue_depth per worker thread");
    args.add("threads", "1", "aio.thread_count: I/O worker threads");
    args.add("progress", "on", "progress line on stderr for long phases");
}

Result<SwapOptions> parse_options(const cli::Args& args) {
    SwapOptions o;
    o.dir = args.get("path");
    if (o.dir.empty())
        return Status::invalid_argument("--path: a directory for the swap file is required");
    ZINF_ASSIGN_OR_RETURN(o.model_bytes, args.get_size_bytes("model-size"));
    ZINF_ASSIGN_OR_RETURN(o.partition_bytes, args.get_size_bytes("partition-size"));
    if (o.model_bytes == 0 || o.partition_bytes == 0) {
        return Status::invalid_argument(
            "--model-size and --partition-size must be greater than zero");
    }
    if (args.get("compute-ms") == "auto") {
        o.compute_auto = true;
    } else {
        ZINF_ASSIGN_OR_RETURN(o.compute_ms, args.get_double("compute-ms", 0, 60'000));
    }
    ZINF_ASSIGN_OR_RETURN(const std::string device, args.get_choice("device", {"cpu", "cuda"}));
    o.cuda = device == "cuda";
#ifndef ZINF_BENCH_HAVE_CUDA
    if (o.cuda) {
        return Status::not_supported(
            "--device cuda: this zinfinity-bench was built without CUDA (nvcc not found)");
    }
#endif
    ZINF_ASSIGN_OR_RETURN(o.device_budget_bytes, args.get_size_bytes("device-budget"));
    ZINF_ASSIGN_OR_RETURN(o.pinned_bytes, args.get_size_bytes("pinned"));
    ZINF_ASSIGN_OR_RETURN(const std::string dtype,
                          args.get_choice("dtype", {"fp16", "bf16", "fp32"}));
    o.dtype =
        dtype == "fp32" ? DType::kFloat32 : (dtype == "bf16" ? DType::kBFloat16 : DType::kFloat16);
    const std::uint64_t element_bytes = dtype_size_bytes(o.dtype);
    if (o.partition_bytes % element_bytes != 0) {
        return Status::invalid_argument(str_cat("--partition-size: ", o.partition_bytes,
                                                " is not a whole number of ", dtype, " elements"));
    }
    if (args.get("prefetch-bucket") == "auto") {
        o.prefetch_numel = o.pinned_bytes / element_bytes;
    } else {
        ZINF_ASSIGN_OR_RETURN(o.prefetch_numel, args.get_count("prefetch-bucket"));
    }
    ZINF_ASSIGN_OR_RETURN(o.max_live_numel, args.get_count("max-live"));
    // Each partition passes through one pinned buffer and one device extent; a few must fit.
    if (o.pinned_bytes < 2 * o.partition_bytes || o.device_budget_bytes < 2 * o.partition_bytes) {
        return Status::invalid_argument(
            str_cat("--pinned and --device-budget must each hold at least two partitions of ",
                    format_bytes(o.partition_bytes)));
    }
    ZINF_ASSIGN_OR_RETURN(o.poll_us, args.get_int("poll-us", 0, 1'000'000));
    ZINF_ASSIGN_OR_RETURN(const std::int64_t iterations, args.get_int("iterations", 1, 1000));
    o.iterations = static_cast<int>(iterations);
    ZINF_ASSIGN_OR_RETURN(o.progress, args.get_bool("progress"));
    ZINF_ASSIGN_OR_RETURN(o.aio.backend,
                          args.get_choice("backend", aio_backend_names(/*with_auto=*/true)));
    ZINF_ASSIGN_OR_RETURN(o.aio.block_size_bytes, args.get_size_bytes("block-size"));
    ZINF_ASSIGN_OR_RETURN(const std::int64_t depth, args.get_int("queue-depth", 1, 4096));
    o.aio.queue_depth = static_cast<int>(depth);
    ZINF_ASSIGN_OR_RETURN(const std::int64_t threads, args.get_int("threads", 1, 64));
    o.aio.intra_op_parallelism = static_cast<int>(threads);
    return o;
}

// The bytes of word `w` of partition `id`: distinct per partition and position, so that a
// partition read from the wrong place or a stale buffer is caught.
inline std::uint64_t pattern_word(std::uint32_t id, std::uint64_t w) {
    return (static_cast<std::uint64_t>(id) << 40) ^ (w * 0x9E3779B97F4A7C15ULL);
}

void fill_pattern(std::uint32_t id, std::byte* data, std::size_t size_bytes) {
    auto* words = reinterpret_cast<std::uint64_t*>(data);
    const std::size_t count = size_bytes / 8;
    for (std::size_t w = 0; w < count; ++w) words[w] = pattern_word(id, w);
}

// Checks one word per 64 KiB (and the last word): cheap enough to sit inside the simulated
// compute, enough to catch a wrong, stale or torn partition.
std::uint64_t check_pattern_sampled(std::uint32_t id, const std::byte* data,
                                    std::size_t size_bytes) {
    const auto* words = reinterpret_cast<const std::uint64_t*>(data);
    const std::size_t count = size_bytes / 8;
    std::uint64_t bad = 0;
    for (std::size_t w = 0; w < count; w += 8192) bad += words[w] != pattern_word(id, w) ? 1 : 0;
    if (count > 0) bad += words[count - 1] != pattern_word(id, count - 1) ? 1 : 0;
    return bad;
}

// The simulated compute: a busy loop on the calling thread until `deadline` (a sleep would free
// the core for the I/O and copy threads, which on 2 cores changes the result).
void busy_until(Clock::time_point deadline, tier::ResidencyManager* rm = nullptr,
                std::chrono::microseconds poll_interval = {}) {
    volatile std::uint64_t sink = 0;
    auto next_poll = Clock::now() + poll_interval;
    for (auto now = Clock::now(); now < deadline; now = Clock::now()) {
        for (int i = 0; i < 64; ++i) sink = sink * 6364136223846793005ULL + 1442695040888963407ULL;
        if (rm != nullptr && now >= next_poll) {
            (void)rm->poll();  // never blocks; failures surface at the next acquire
            next_poll = now + poll_interval;
        }
    }
}

// Peak and current resident set of this process (VmHWM, VmRSS), bytes.
std::pair<std::uint64_t, std::uint64_t> rss_bytes() {
    std::ifstream in("/proc/self/status");
    std::string line;
    std::uint64_t hwm = 0, rss = 0;
    while (std::getline(in, line)) {
        unsigned long long kib = 0;
        if (std::sscanf(line.c_str(), "VmHWM: %llu kB", &kib) == 1) hwm = kib * 1024;
        if (std::sscanf(line.c_str(), "VmRSS: %llu kB", &kib) == 1) rss = kib * 1024;
    }
    return {hwm, rss};
}

struct Partitioning {
    std::vector<std::uint64_t> sizes;
    std::uint64_t total_bytes = 0;
};

Partitioning partition(const SwapOptions& o) {
    Partitioning p;
    for (std::uint64_t offset = 0; offset < o.model_bytes; offset += o.partition_bytes) {
        // Whole 8-byte words, so that the pattern covers every byte.
        const std::uint64_t size = align_up(std::min(o.partition_bytes, o.model_bytes - offset), 8);
        p.sizes.push_back(size);
        p.total_bytes += size;
    }
    return p;
}

// Sequential whole-file pass straight on the engine, `slots` operations of up to slot_bytes in
// flight, through the same pinned region: the raw rate the streaming is compared with. For a
// write pass, `fill` fills each operation's buffer first (untimed work is the caller's concern).
Result<double> raw_pass(io::Engine& engine, const tier::EngineMover& mover, io::FileId file,
                        std::span<std::byte> region, const Partitioning& parts, std::size_t align,
                        bool write, bool show_progress, const char* label) {
    const std::uint64_t slot_bytes =
        align_up(*std::max_element(parts.sizes.begin(), parts.sizes.end()), align);
    const std::size_t slots = std::max<std::size_t>(1, region.size() / slot_bytes);
    std::vector<io::IoHandle> handles(slots);
    std::vector<bool> busy(slots, false);
    cli::Progress progress(label, static_cast<double>(parts.total_bytes), "GB", kBytesPerGb);
    const auto start = Clock::now();
    std::uint64_t done_bytes = 0;
    std::size_t next = 0;
    for (std::size_t completed = 0; completed < parts.sizes.size();) {
        for (std::size_t s = 0; s < slots && next < parts.sizes.size(); ++s) {
            if (busy[s]) continue;
            const auto id = static_cast<std::uint32_t>(next);
            std::span<std::byte> buffer =
                region.subspan(s * slot_bytes, align_up(parts.sizes[next], align));
            const std::uint64_t offset = mover.offset_of(id);
            if (write) {
                fill_pattern(id, buffer.data(), parts.sizes[next]);
                ZINF_TRY(engine.submit_write(handles[s], file, offset, buffer));
            } else {
                ZINF_TRY(engine.submit_read(handles[s], file, offset, buffer));
            }
            busy[s] = true;
            ++next;
        }
        // Complete the oldest in submission order: slots are reused round robin.
        const std::size_t s = completed % slots;
        ZINF_ASSERT(busy[s]);
        ZINF_TRY(handles[s].wait());
        busy[s] = false;
        done_bytes += parts.sizes[completed];
        ++completed;
        if (show_progress) progress.update(static_cast<double>(done_bytes));
        if (interrupted()) {
            for (std::size_t k = 0; k < slots; ++k) {
                if (busy[k]) (void)handles[k].wait();
            }
            return interrupted_status();
        }
    }
    progress.finish();
    if (write) ZINF_TRY(engine.sync(file));
    return seconds_since(start);
}

struct IterationFigures {
    double seconds = 0;
    std::uint64_t nvme_bytes = 0;  // swapped in during the iteration
    std::uint64_t bad_words = 0;
};

// One iteration over every partition in order: acquire on the device, compute, release.
Result<IterationFigures> run_iteration(tier::ResidencyManager& rm, const Partitioning& parts,
                                       double compute_ms, std::int64_t poll_us, bool check,
                                       bool show_progress, const char* label) {
    cli::Progress progress(label, static_cast<double>(parts.total_bytes), "GB", kBytesPerGb);
    IterationFigures f;
    const std::uint64_t swapped_before = rm.stats().bytes_swapped_in;
    const auto compute = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::milli>(compute_ms));
    const auto start = Clock::now();
    std::uint64_t done_bytes = 0;
    rm.begin_iteration();
    for (std::size_t i = 0; i < parts.sizes.size(); ++i) {
        const auto id = static_cast<tier::PartitionId>(i);
        ZINF_ASSIGN_OR_RETURN(void* data, rm.acquire(id, tier::Tier::kDevice));
        if (compute_ms > 0) {
            const auto deadline = Clock::now() + compute;
            if (check)
                f.bad_words +=
                    check_pattern_sampled(id, static_cast<const std::byte*>(data), parts.sizes[i]);
            busy_until(deadline, poll_us > 0 ? &rm : nullptr, std::chrono::microseconds(poll_us));
        }
        rm.release(id, /*dirty=*/false);
        done_bytes += parts.sizes[i];
        if (show_progress) progress.update(static_cast<double>(done_bytes));
        if (interrupted()) {
            rm.end_iteration();
            return interrupted_status();
        }
    }
    rm.end_iteration();
    f.seconds = seconds_since(start);
    progress.finish();
    f.nvme_bytes = rm.stats().bytes_swapped_in - swapped_before;
    return f;
}

double gbps(std::uint64_t bytes, double seconds) {
    return seconds > 0 ? static_cast<double>(bytes) / seconds / kBytesPerGb : 0;
}

// What a run streams through: the bench file, the device, the pinned pool, the engine, the
// mover and the residency manager with every partition registered on NVMe. Members are
// destroyed in reverse order: the manager, the mover, the engine (which holds the region
// registered), then the region, the device and the file.
struct SwapRig {
    Partitioning parts;
    std::uint64_t file_bytes = 0;
    std::unique_ptr<BenchFiles> files;
    std::unique_ptr<Device> device;
    AlignedBuffer region;
    std::unique_ptr<io::Engine> engine;
    std::unique_ptr<tier::EngineMover> mover;
    io::FileId file = 0;
    std::size_t align = 0;  // of the mover's host buffers
    tier::ResidencyOptions rm_options;
    std::unique_ptr<tier::ResidencyManager> rm;
};

// The device tier --device asks for, holding --device-budget.
Result<std::unique_ptr<Device>> make_device(const SwapOptions& o) {
#ifdef ZINF_BENCH_HAVE_CUDA
    if (o.cuda) {
        device::CudaDeviceOptions cuda_options;
        cuda_options.budget_bytes = o.device_budget_bytes;
        ZINF_ASSIGN_OR_RETURN(auto made, device::CudaDevice::create(cuda_options));
        return std::unique_ptr<Device>(std::move(made));
    }
#endif
    ZINF_ASSIGN_OR_RETURN(
        auto made,
        device::CpuDevice::create({.budget_bytes = o.device_budget_bytes, .worker_thread = true}));
    return std::unique_ptr<Device>(std::move(made));
}

// The residency manager over the rig's mover and device, every partition registered on NVMe.
Status make_residency_manager(const SwapOptions& o, SwapRig& r) {
    const std::size_t count = r.parts.sizes.size();
    r.rm_options.device_budget_bytes = o.device_budget_bytes;
    r.rm_options.host_budget_bytes = r.region.size();
    r.rm_options.prefetch_bucket_numel = o.prefetch_numel;
    r.rm_options.max_live_numel = o.max_live_numel;
    r.rm_options.dtype = o.dtype;
    r.rm_options.partition_capacity = count;
    r.rm_options.trace_capacity = count;
    ZINF_ASSIGN_OR_RETURN(r.rm,
                          tier::ResidencyManager::create(r.rm_options, *r.mover, r.device.get()));
    for (std::size_t i = 0; i < count; ++i) {
        ZINF_TRY(r.rm->register_partition(static_cast<tier::PartitionId>(i), r.parts.sizes[i],
                                          o.dtype, tier::Tier::kNvme));
    }
    return Status::ok();
}

// Set up: the rig, in order. Prints the device tier once it exists.
Result<SwapRig> set_up(const SwapOptions& o) {
    SwapRig r;
    r.parts = partition(o);
    for (std::uint64_t s : r.parts.sizes) r.file_bytes += align_up(s, 4096);
    // Checks the directory and its free space, creates the file exclusively, removes it at exit.
    ZINF_ASSIGN_OR_RETURN(r.files, BenchFiles::create({o.dir}, r.file_bytes));
    ZINF_ASSIGN_OR_RETURN(r.device, make_device(o));
    std::printf("device tier: %s\n", r.device->name().c_str());
    auto region = AlignedBuffer::allocate_for_io(o.pinned_bytes);
    if (!region.has_value()) return region.error().with_context("allocating the pinned pool");
    r.region = std::move(region).value();
    io::EngineOptions engine_options;
    engine_options.aio = o.aio;
    ZINF_ASSIGN_OR_RETURN(r.engine, io::Engine::create(engine_options));
    tier::EngineMoverOptions mover_options;
    mover_options.path = r.files->paths()[0];
    mover_options.create_file = false;  // BenchFiles created it exclusively
    mover_options.capacity_bytes = r.file_bytes;
    ZINF_ASSIGN_OR_RETURN(r.mover, tier::EngineMover::create(*r.engine, r.device.get(),
                                                             r.region.span(), mover_options));
    r.file = r.mover->file();
    r.align = r.mover->host_alignment_bytes();
    ZINF_TRY(make_residency_manager(o, r));
    return r;
}

void print_setup(const SwapOptions& o, const SwapRig& r) {
    std::printf("zinfinity-bench swap: model %s in %zu partitions of %s (%s), file %s\n",
                format_bytes(r.parts.total_bytes).c_str(), r.parts.sizes.size(),
                format_bytes(o.partition_bytes).c_str(), std::string(dtype_name(o.dtype)).c_str(),
                r.files->paths()[0].c_str());
    std::printf(
        "  backend %s, block %s, queue depth %d, %d thread(s), O_DIRECT %s; pinned pool %s, device "
        "budget %s, prefetch %" PRIu64 " elements (%s), max live %" PRIu64 " elements\n",
        std::string(r.engine->backend_name()).c_str(), format_bytes(o.aio.block_size_bytes).c_str(),
        o.aio.queue_depth, o.aio.intra_op_parallelism, r.engine->is_direct(r.file) ? "on" : "off",
        format_bytes(o.pinned_bytes).c_str(), format_bytes(o.device_budget_bytes).c_str(),
        o.prefetch_numel, format_bytes(r.rm_options.prefetch_depth_bytes()).c_str(),
        o.max_live_numel);
    std::fflush(stdout);
}

// One streaming phase: its compute per partition, its polling and whether it checks the data.
struct StreamingPhase {
    double compute_ms = 0;
    std::int64_t poll_us = 0;
    bool check = false;
    const char* label = "";
};

// The measured iterations of a streaming phase, averaged.
struct StreamingFigures {
    double seconds = 0;            // per iteration
    std::uint64_t nvme_bytes = 0;  // per iteration
    std::uint64_t bad_words = 0;   // over every iteration, the warm-up's included
    tier::ResidencyStats before;   // around the measured iterations
    tier::ResidencyStats after;
};

// Each timed phase starts after an untimed iteration of the same kind, so that what the
// previous phase left in flight (the next iteration's first reads) neither helps nor hinders
// it: a steady state, as in training.
Result<StreamingFigures> measure_streaming(const SwapOptions& o, SwapRig& r,
                                           const StreamingPhase& phase) {
    StreamingFigures f;
    const std::string warm_label = str_cat(phase.label, " (warm-up)");
    ZINF_ASSIGN_OR_RETURN(const IterationFigures warm,
                          run_iteration(*r.rm, r.parts, phase.compute_ms, phase.poll_us,
                                        phase.check, o.progress, warm_label.c_str()));
    f.bad_words += warm.bad_words;
    f.before = r.rm->stats();
    for (int i = 0; i < o.iterations; ++i) {
        ZINF_ASSIGN_OR_RETURN(const IterationFigures it,
                              run_iteration(*r.rm, r.parts, phase.compute_ms, phase.poll_us,
                                            phase.check, o.progress, phase.label));
        f.seconds += it.seconds;
        f.nvme_bytes += it.nvme_bytes;
        f.bad_words += it.bad_words;
    }
    f.seconds /= o.iterations;
    f.nvme_bytes /= static_cast<std::uint64_t>(o.iterations);
    f.after = r.rm->stats();
    return f;
}

// Every figure of a run.
struct SwapFigures {
    double raw1_seconds = 0;  // the engine's raw read, before and after the streaming
    double raw2_seconds = 0;
    IterationFigures recording;
    StreamingFigures io_alone;
    double compute_ms = 0;  // per partition
    double compute_seconds = 0;
    StreamingFigures with_compute;
};

// Measure: write the model, then the phases in order, between two raw reads (the disk drifts).
Result<SwapFigures> measure(const SwapOptions& o, SwapRig& r) {
    SwapFigures f;
    const auto raw = [&](bool write, const char* label) {
        return raw_pass(*r.engine, *r.mover, r.file, r.region.span(), r.parts, r.align, write,
                        o.progress, label);
    };
    // 1. Write the model (untimed for the figures; through the pinned pool, O_DIRECT).
    ZINF_ASSIGN_OR_RETURN(const double written, raw(/*write=*/true, "writing the model"));
    r.files->mark_written();
    std::printf("  wrote the model in %.2f s (%.2f GB/s)\n", written,
                gbps(r.parts.total_bytes, written));
    // 2. The engine's raw read rate, now and again at the end.
    ZINF_ASSIGN_OR_RETURN(f.raw1_seconds, raw(false, "raw read"));
    // 3. The recording iteration (no trace yet: no prefetch, LRU).
    ZINF_ASSIGN_OR_RETURN(
        f.recording, run_iteration(*r.rm, r.parts, 0, 0, false, o.progress, "recording the trace"));
    // 4. I/O alone: streaming along the trace with no compute.
    ZINF_ASSIGN_OR_RETURN(f.io_alone,
                          measure_streaming(o, r, {0, 0, false, "streaming, I/O alone"}));
    const double count = static_cast<double>(r.parts.sizes.size());
    f.compute_ms = o.compute_auto ? f.io_alone.seconds * 1000.0 / count : o.compute_ms;
    // 5. Compute alone: the same busy loop per partition, no data.
    const auto compute_start = Clock::now();
    const auto compute = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::milli>(f.compute_ms));
    for (std::size_t i = 0; i < r.parts.sizes.size(); ++i) busy_until(Clock::now() + compute);
    f.compute_seconds = seconds_since(compute_start);
    // 6. Overlapped: streaming with compute, data checked (sampled) inside the compute.
    ZINF_ASSIGN_OR_RETURN(
        f.with_compute,
        measure_streaming(o, r, {f.compute_ms, o.poll_us, !o.cuda, "streaming with compute"}));
    ZINF_ASSIGN_OR_RETURN(f.raw2_seconds, raw(false, "raw read"));
    return f;
}

// Report: the figures beside the raw read rate; 1 when data came back wrong or a budget was
// exceeded, else 0.
int report(const SwapOptions& o, const SwapRig& r, const SwapFigures& f) {
    const std::uint64_t total_bytes = r.parts.total_bytes;
    const double raw1_gbps = gbps(total_bytes, f.raw1_seconds);
    const double raw2_gbps = gbps(total_bytes, f.raw2_seconds);
    const double raw_gbps = (raw1_gbps + raw2_gbps) / 2;
    const StreamingFigures& io = f.io_alone;
    const StreamingFigures& wall = f.with_compute;
    const double io_gbps = gbps(io.nvme_bytes, io.seconds);
    const double efficiency = wall.seconds / std::max(io.seconds, f.compute_seconds);
    const auto [rss_peak, rss_now] = rss_bytes();
    const tier::ResidencyStats s = r.rm->stats();

    std::printf("\n");
    std::printf(
        "  raw read (engine, same file, same pinned pool): %.2f GB/s (%.2f before, %.2f after)\n",
        raw_gbps, raw1_gbps, raw2_gbps);
    std::printf("  recording iteration (no trace, no prefetch):    %.2f s, %.2f GB/s from NVMe\n",
                f.recording.seconds, gbps(f.recording.nvme_bytes, f.recording.seconds));
    std::printf(
        "  streaming, I/O alone:    %.3f s, %.2f GB/s from NVMe (%s per iteration), %.2f GB/s "
        "delivered; %.2f x raw (target >= 0.90)\n",
        io.seconds, io_gbps, format_bytes(io.nvme_bytes).c_str(), gbps(total_bytes, io.seconds),
        raw_gbps > 0 ? io_gbps / raw_gbps : 0.0);
    std::printf("  compute alone:           %.3f s (%.3f ms per partition%s)\n", f.compute_seconds,
                f.compute_ms, o.compute_auto ? ", auto: the I/O time per partition" : "");
    std::printf(
        "  streaming with compute:  %.3f s, %.2f GB/s from NVMe (%s per iteration); stall %.3f s; "
        "hits %" PRIu64 ", late %" PRIu64 ", misses %" PRIu64 "\n",
        wall.seconds, gbps(wall.nvme_bytes, wall.seconds), format_bytes(wall.nvme_bytes).c_str(),
        std::chrono::duration<double>(wall.after.stall_time - wall.before.stall_time).count() /
            o.iterations,
        wall.after.hits - wall.before.hits, wall.after.late - wall.before.late,
        wall.after.misses - wall.before.misses);
    std::printf(
        "  overlap efficiency:      %.3f = wall / max(I/O alone, compute alone) (target <= "
        "1.10)%s\n",
        efficiency,
        o.poll_us > 0 ? str_cat("; polled every ", o.poll_us, " us in compute").c_str() : "");
    std::printf(
        "  memory: RSS peak %s (now %s); pinned pool peak %s of %s; device peak %s of %s\n",
        format_bytes(rss_peak).c_str(), format_bytes(rss_now).c_str(),
        format_bytes(s.tiers[1].peak_bytes).c_str(), format_bytes(s.tiers[1].budget_bytes).c_str(),
        format_bytes(s.tiers[0].peak_bytes).c_str(), format_bytes(s.tiers[0].budget_bytes).c_str());
    std::printf("  residency: %s\n", r.rm->stats_summary().c_str());
    if (o.cuda) {
        std::printf(
            "  data: not checked (the device tier is GPU memory; the store's checksums "
            "verified every read from NVMe)\n");
    }
    if (wall.bad_words != 0) {
        std::fprintf(stderr, "zinfinity-bench swap: %" PRIu64 " sampled words read back wrong\n",
                     wall.bad_words);
        return 1;
    }
    if (s.tiers[1].peak_bytes > r.region.size() || s.tiers[0].peak_bytes > o.device_budget_bytes) {
        std::fprintf(stderr, "zinfinity-bench swap: a budget was exceeded\n");
        return 1;
    }
    return 0;
}

int run(const SwapOptions& o) {
    install_interrupt_handler();
    const auto fail = [](const Status& status) {
        std::fprintf(stderr, "zinfinity-bench swap: %s\n", status.to_string().c_str());
        return 1;
    };
    auto rig = set_up(o);
    if (!rig.has_value()) return fail(rig.error());
    print_setup(o, *rig);
    auto figures = measure(o, *rig);
    if (!figures.has_value()) return fail(figures.error());
    return report(o, *rig, *figures);
}

}  // namespace

int run_swap(int argc, char** argv) {
    cli::Args args("zinfinity-bench swap [flags]",
                   "Streams a partitioned model NVMe -> pinned host -> device budget in trace "
                   "order through the\n"
                   "residency manager, with a busy-loop compute per partition; prints streaming "
                   "GB/s against the\n"
                   "engine's raw read GB/s measured in the same run, the I/O-alone and "
                   "compute-alone times, the\n"
                   "overlap efficiency (wall / max of the two) and the memory peaks.");
    declare_flags(args);
    constexpr std::string_view kProgram = "zinfinity-bench swap";
    if (auto exit_code = args.parse_or_exit(argc, argv, kProgram)) return *exit_code;
    auto options = parse_options(args);
    if (!options.has_value()) return cli::report_error(kProgram, options.error());
    return run(*options);
}

}  // namespace zinf::bench
