// `zinfinity-bench h2d`: host<->device copy GB/s from the pinned pool (swap::PinnedPool buffers
// registered with the CUDA device, copied buffer by buffer with CudaDevice::copy_to_device on a
// stream) against the baseline measured in the same run: one cudaMemcpy of the whole size from
// cudaHostAlloc memory. Built only where CUDA is enabled.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_status.h"
#include "src/base/device_buffer.h"
#include "src/base/log.h"
#include "src/device/cuda_device.h"
#include "swap/pinned_pool.h"
#include "tools/bench/commands.h"
#include "tools/cli/args.h"

namespace zinf::bench {
namespace {

struct H2dOptions {
    std::uint64_t size_bytes = 256ull << 20;
    std::uint64_t buffer_size_bytes = 64ull << 20;
    int reps = 10;
    int device_index = 0;
};

// Owns a cudaHostAlloc region (the baseline's pinned memory).
class HostAllocMemory {
public:
    HostAllocMemory() = default;
    ~HostAllocMemory() {
        if (ptr_ != nullptr) static_cast<void>(cudaFreeHost(ptr_));
    }
    HostAllocMemory(HostAllocMemory&& other) noexcept : ptr_(std::exchange(other.ptr_, nullptr)) {}
    HostAllocMemory& operator=(HostAllocMemory&&) = delete;
    HostAllocMemory(const HostAllocMemory&) = delete;
    HostAllocMemory& operator=(const HostAllocMemory&) = delete;
    Status allocate(std::size_t size_bytes) {
        ZINF_CUDA_TRY(cudaHostAlloc(&ptr_, size_bytes, cudaHostAllocPortable));
        return Status::ok();
    }
    std::byte* data() const { return static_cast<std::byte*>(ptr_); }

private:
    void* ptr_ = nullptr;
};

struct Figures {
    std::vector<double> gbps;
    double median() const {
        std::vector<double> v = gbps;
        std::sort(v.begin(), v.end());
        const std::size_t n = v.size();
        return n == 0 ? 0.0 : (n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
    }
    double min() const { return gbps.empty() ? 0.0 : *std::min_element(gbps.begin(), gbps.end()); }
    double max() const { return gbps.empty() ? 0.0 : *std::max_element(gbps.begin(), gbps.end()); }
};

using Clock = std::chrono::steady_clock;

double gbps(std::size_t bytes, Clock::duration elapsed) {
    return static_cast<double>(bytes) / std::chrono::duration<double>(elapsed).count() / 1e9;
}

// What the copies run between: the device and its memory, a stream, the pinned pool's buffers
// (registered with the device, filled) and the baseline's cudaHostAlloc memory. Members are
// destroyed in reverse order: the pool unregisters from the device before the device goes.
struct H2dRig {
    std::unique_ptr<device::CudaDevice> device;
    DeviceBuffer device_memory;
    StreamId stream = 0;
    std::unique_ptr<swap::PinnedPool> pool;
    std::vector<swap::PinnedBuffer> buffers;  // every buffer of the pool, in order
    HostAllocMemory host;

    std::byte* device_bytes() const { return device_memory.as<std::byte>(); }
};

// Set up: the device, then the pool path (the buffers the swap pipeline copies from), then the
// baseline's memory.
Result<H2dRig> set_up(const H2dOptions& o) {
    ZINF_TRY(device::CudaDevice::probe());
    H2dRig r;
    device::CudaDeviceOptions device_options;
    device_options.local_rank = o.device_index;
    device_options.budget_bytes = o.size_bytes + (64ull << 20);
    ZINF_ASSIGN_OR_RETURN(r.device, device::CudaDevice::create(device_options));
    ZINF_ASSIGN_OR_RETURN(r.device_memory,
                          DeviceBuffer::allocate(*r.device, o.size_bytes, "h2d bench"));
    ZINF_ASSIGN_OR_RETURN(r.stream, r.device->create_stream());

    swap::PinnedPoolOptions pool_options;
    pool_options.name = "h2d-bench";
    pool_options.buffer_size_bytes = o.buffer_size_bytes;
    pool_options.buffer_count = o.size_bytes / o.buffer_size_bytes;
    pool_options.near_device = r.device.get();
    pool_options.allow_unlocked = true;  // cudaHostRegister page-locks it anyway
    ZINF_ASSIGN_OR_RETURN(r.pool, swap::PinnedPool::create(pool_options));
    ZINF_TRY(r.pool->register_with_device(*r.device));
    for (std::size_t i = 0; i < r.pool->buffer_count(); ++i) {
        ZINF_ASSIGN_OR_RETURN(auto buffer, r.pool->try_acquire());
        for (std::size_t b = 0; b < buffer.size(); b += 4096) {
            buffer.data()[b] = static_cast<std::byte>((i * 131 + b / 4096) & 0xff);
        }
        r.buffers.push_back(std::move(buffer));
    }

    // The baseline: cudaMemcpy of the whole size from cudaHostAlloc memory.
    ZINF_TRY(r.host.allocate(o.size_bytes));
    std::memset(r.host.data(), 0x5a, o.size_bytes);
    return r;
}

// The four copies of the whole size: pool -> device, device -> pool (one asynchronous copy
// per buffer, then a wait), and the baseline's two cudaMemcpy calls.
Status pool_h2d(const H2dOptions& o, H2dRig& r) {
    for (std::size_t i = 0; i < r.buffers.size(); ++i) {
        ZINF_TRY(r.device->copy_to_device(r.device_bytes() + i * o.buffer_size_bytes,
                                          r.buffers[i].data(), o.buffer_size_bytes, r.stream));
    }
    return r.device->synchronize(r.stream);
}
Status pool_d2h(const H2dOptions& o, H2dRig& r) {
    for (std::size_t i = 0; i < r.buffers.size(); ++i) {
        ZINF_TRY(r.device->copy_to_host(r.buffers[i].data(),
                                        r.device_bytes() + i * o.buffer_size_bytes,
                                        o.buffer_size_bytes, r.stream));
    }
    return r.device->synchronize(r.stream);
}
Status base_h2d(const H2dOptions& o, H2dRig& r) {
    ZINF_CUDA_TRY(
        cudaMemcpy(r.device_memory.data(), r.host.data(), o.size_bytes, cudaMemcpyHostToDevice));
    return Status::ok();
}
Status base_d2h(const H2dOptions& o, H2dRig& r) {
    ZINF_CUDA_TRY(
        cudaMemcpy(r.host.data(), r.device_memory.data(), o.size_bytes, cudaMemcpyDeviceToHost));
    return Status::ok();
}

// Warm-up, and a check that the pool path moves the right bytes: pool -> device -> baseline
// host memory, compared with the pool.
Status warm_up(const H2dOptions& o, H2dRig& r) {
    ZINF_TRY(pool_h2d(o, r));
    ZINF_TRY(base_d2h(o, r));
    for (std::size_t i = 0; i < r.buffers.size(); ++i) {
        if (std::memcmp(r.host.data() + i * o.buffer_size_bytes, r.buffers[i].data(),
                        o.buffer_size_bytes) != 0) {
            return Status::corruption(str_cat("h2d: buffer ", i, " differs after a round trip"));
        }
    }
    ZINF_TRY(base_h2d(o, r));
    return pool_d2h(o, r);
}

// GB/s of each path and direction, one figure per repetition.
struct H2dFigures {
    Figures pool_h2d, base_h2d, pool_d2h, base_d2h;
};

// Measure: --reps repetitions of the four copies, interleaved, the order flipping every
// repetition, so that drift hits both paths alike.
Result<H2dFigures> measure(const H2dOptions& o, H2dRig& r) {
    H2dFigures f;
    const auto time = [&](Status (*copy)(const H2dOptions&, H2dRig&), Figures& figures) {
        const auto t0 = Clock::now();
        ZINF_TRY(copy(o, r));
        figures.gbps.push_back(gbps(o.size_bytes, Clock::now() - t0));
        return Status::ok();
    };
    for (int rep = 0; rep < o.reps; ++rep) {
        if (rep % 2 == 0) {
            ZINF_TRY(time(pool_h2d, f.pool_h2d));
            ZINF_TRY(time(base_h2d, f.base_h2d));
            ZINF_TRY(time(pool_d2h, f.pool_d2h));
            ZINF_TRY(time(base_d2h, f.base_d2h));
        } else {
            ZINF_TRY(time(base_h2d, f.base_h2d));
            ZINF_TRY(time(pool_h2d, f.pool_h2d));
            ZINF_TRY(time(base_d2h, f.base_d2h));
            ZINF_TRY(time(pool_d2h, f.pool_d2h));
        }
    }
    return f;
}

void report(const H2dOptions& o, const H2dRig& r, const H2dFigures& f) {
    std::printf(
        "zinfinity-bench h2d: %s, %llu MiB per copy, pool buffers %llu MiB x %zu, %d reps\n",
        r.device->name().c_str(), static_cast<unsigned long long>(o.size_bytes >> 20),
        static_cast<unsigned long long>(o.buffer_size_bytes >> 20), r.buffers.size(), o.reps);
    std::printf("  %-4s %-34s %10s %10s %10s\n", "dir", "path", "median", "min", "max");
    const auto row = [](const char* dir, const char* path, const Figures& figures) {
        std::printf("  %-4s %-34s %7.2f GB/s %6.2f %10.2f\n", dir, path, figures.median(),
                    figures.min(), figures.max());
    };
    row("h2d", "pinned pool (CudaDevice, stream)", f.pool_h2d);
    row("h2d", "cudaHostAlloc + cudaMemcpy", f.base_h2d);
    row("d2h", "pinned pool (CudaDevice, stream)", f.pool_d2h);
    row("d2h", "cudaHostAlloc + cudaMemcpy", f.base_d2h);
    std::printf("  pool / baseline: h2d %.2f, d2h %.2f\n",
                f.pool_h2d.median() / f.base_h2d.median(),
                f.pool_d2h.median() / f.base_d2h.median());
    // One line for scripts (tools/gpu-check.sh).
    std::printf(
        "h2d-summary h2d_pool_gbps=%.2f h2d_baseline_gbps=%.2f d2h_pool_gbps=%.2f "
        "d2h_baseline_gbps=%.2f\n",
        f.pool_h2d.median(), f.base_h2d.median(), f.pool_d2h.median(), f.base_d2h.median());
}

Status run(const H2dOptions& o) {
    ZINF_ASSIGN_OR_RETURN(H2dRig rig, set_up(o));
    ZINF_TRY(warm_up(o, rig));
    ZINF_ASSIGN_OR_RETURN(const H2dFigures figures, measure(o, rig));
    report(o, rig, figures);
    return Status::ok();
}

void declare_flags(cli::Args& args) {
    args.add("size", "256MiB", "bytes per copy (a multiple of --buffer-size)");
    args.add("buffer-size", "64MiB", "pinned pool buffer size: one asynchronous copy per buffer");
    args.add("reps", "10", "timed repetitions of each of the four copies");
    args.add("device", "0", "CUDA device ordinal");
}

Result<H2dOptions> parse_options(const cli::Args& args) {
    H2dOptions o;
    ZINF_ASSIGN_OR_RETURN(o.size_bytes, args.get_size_bytes("size"));
    ZINF_ASSIGN_OR_RETURN(o.buffer_size_bytes, args.get_size_bytes("buffer-size"));
    ZINF_ASSIGN_OR_RETURN(const std::int64_t reps, args.get_int("reps", 1, 1000));
    ZINF_ASSIGN_OR_RETURN(const std::int64_t device_index, args.get_int("device", 0, 1023));
    o.reps = static_cast<int>(reps);
    o.device_index = static_cast<int>(device_index);
    if (o.buffer_size_bytes == 0 || o.size_bytes == 0 || o.size_bytes % o.buffer_size_bytes != 0) {
        return Status::invalid_argument("--size must be a non-zero multiple of --buffer-size");
    }
    return o;
}

}  // namespace

int run_h2d(int argc, char** argv) {
    cli::Args args("zinfinity-bench h2d [flags]",
                   "Measures host->device and device->host copy GB/s from the pinned pool (swap::\n"
                   "PinnedPool buffers registered with the CUDA device, one cudaMemcpyAsync per\n"
                   "buffer on a stream) against cudaMemcpy of the whole size from cudaHostAlloc\n"
                   "memory, interleaved in the same run. Prints medians, minima and maxima.\n\n"
                   "Figures: GB/s (decimal, 1e9 bytes/s), host-timed, copy issue to completion.");
    declare_flags(args);
    constexpr std::string_view kProgram = "zinfinity-bench h2d";
    if (auto exit_code = args.parse_or_exit(argc, argv, kProgram)) return *exit_code;
    auto options = parse_options(args);
    if (!options.has_value()) return cli::report_error(kProgram, options.error());
    const Status status = run(*options);
    return status.is_ok() ? 0 : cli::report_error(kProgram, status, 1);
}

}  // namespace zinf::bench
