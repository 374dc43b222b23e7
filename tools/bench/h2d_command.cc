// `zinfinity-bench h2d`: host<->device copy GB/s from the pinned pool (swap::PinnedPool buffers
// registered with the CUDA device, copied buffer by buffer with CudaDevice::copy_to_device on a
// stream) against the baseline measured in the same run: one cudaMemcpy of the whole size from
// cudaHostAlloc memory. Built only where CUDA is enabled.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
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

Status run(const H2dOptions& o) {
    ZINF_TRY(device::CudaDevice::probe());
    device::CudaDeviceOptions device_options;
    device_options.local_rank = o.device_index;
    device_options.budget_bytes = o.size_bytes + (64ull << 20);
    ZINF_ASSIGN_OR_RETURN(auto device, device::CudaDevice::create(device_options));
    ZINF_ASSIGN_OR_RETURN(DeviceBuffer device_memory,
                          DeviceBuffer::allocate(*device, o.size_bytes, "h2d bench"));
    void* device_buffer = device_memory.data();
    ZINF_ASSIGN_OR_RETURN(StreamId stream, device->create_stream());

    // The pool path: the buffers the swap pipeline copies from, registered with the device.
    swap::PinnedPoolOptions pool_options;
    pool_options.name = "h2d-bench";
    pool_options.buffer_size_bytes = o.buffer_size_bytes;
    pool_options.buffer_count = o.size_bytes / o.buffer_size_bytes;
    pool_options.near_device = device.get();
    pool_options.allow_unlocked = true;  // cudaHostRegister page-locks it anyway
    ZINF_ASSIGN_OR_RETURN(auto pool, swap::PinnedPool::create(pool_options));
    ZINF_TRY(pool->register_with_device(*device));
    std::vector<swap::PinnedBuffer> buffers;
    for (std::size_t i = 0; i < pool->buffer_count(); ++i) {
        ZINF_ASSIGN_OR_RETURN(auto buffer, pool->try_acquire());
        for (std::size_t b = 0; b < buffer.size(); b += 4096) {
            buffer.data()[b] = static_cast<std::byte>((i * 131 + b / 4096) & 0xff);
        }
        buffers.push_back(std::move(buffer));
    }

    // The baseline: cudaMemcpy of the whole size from cudaHostAlloc memory.
    HostAllocMemory host;
    ZINF_TRY(host.allocate(o.size_bytes));
    std::memset(host.data(), 0x5a, o.size_bytes);

    auto* device_bytes = static_cast<std::byte*>(device_buffer);
    auto pool_h2d = [&]() -> Status {
        for (std::size_t i = 0; i < buffers.size(); ++i) {
            ZINF_TRY(device->copy_to_device(device_bytes + i * o.buffer_size_bytes,
                                            buffers[i].data(), o.buffer_size_bytes, stream));
        }
        return device->synchronize(stream);
    };
    auto pool_d2h = [&]() -> Status {
        for (std::size_t i = 0; i < buffers.size(); ++i) {
            ZINF_TRY(device->copy_to_host(buffers[i].data(), device_bytes + i * o.buffer_size_bytes,
                                          o.buffer_size_bytes, stream));
        }
        return device->synchronize(stream);
    };
    auto base_h2d = [&]() -> Status {
        ZINF_CUDA_TRY(cudaMemcpy(device_buffer, host.data(), o.size_bytes, cudaMemcpyHostToDevice));
        return Status::ok();
    };
    auto base_d2h = [&]() -> Status {
        ZINF_CUDA_TRY(cudaMemcpy(host.data(), device_buffer, o.size_bytes, cudaMemcpyDeviceToHost));
        return Status::ok();
    };

    // Warm-up, and a check that the pool path moves the right bytes: pool -> device -> baseline
    // host memory, compared with the pool.
    ZINF_TRY(pool_h2d());
    ZINF_TRY(base_d2h());
    for (std::size_t i = 0; i < buffers.size(); ++i) {
        if (std::memcmp(host.data() + i * o.buffer_size_bytes, buffers[i].data(),
                        o.buffer_size_bytes) != 0) {
            return Status::corruption(str_cat("h2d: buffer ", i, " differs after a round trip"));
        }
    }
    ZINF_TRY(base_h2d());
    ZINF_TRY(pool_d2h());

    Figures f_pool_h2d, f_base_h2d, f_pool_d2h, f_base_d2h;
    auto time = [&](auto& body, Figures& figures) -> Status {
        const auto t0 = Clock::now();
        ZINF_TRY(body());
        figures.gbps.push_back(gbps(o.size_bytes, Clock::now() - t0));
        return Status::ok();
    };
    // Interleaved, the order flipping every repetition, so that drift hits both paths alike.
    for (int r = 0; r < o.reps; ++r) {
        if (r % 2 == 0) {
            ZINF_TRY(time(pool_h2d, f_pool_h2d));
            ZINF_TRY(time(base_h2d, f_base_h2d));
            ZINF_TRY(time(pool_d2h, f_pool_d2h));
            ZINF_TRY(time(base_d2h, f_base_d2h));
        } else {
            ZINF_TRY(time(base_h2d, f_base_h2d));
            ZINF_TRY(time(pool_h2d, f_pool_h2d));
            ZINF_TRY(time(base_d2h, f_base_d2h));
            ZINF_TRY(time(pool_d2h, f_pool_d2h));
        }
    }

    std::printf(
        "zinfinity-bench h2d: %s, %llu MiB per copy, pool buffers %llu MiB x %zu, %d reps\n",
        device->name().c_str(), static_cast<unsigned long long>(o.size_bytes >> 20),
        static_cast<unsigned long long>(o.buffer_size_bytes >> 20), buffers.size(), o.reps);
    std::printf("  %-4s %-34s %10s %10s %10s\n", "dir", "path", "median", "min", "max");
    auto row = [](const char* dir, const char* path, const Figures& f) {
        std::printf("  %-4s %-34s %7.2f GB/s %6.2f %10.2f\n", dir, path, f.median(), f.min(),
                    f.max());
    };
    row("h2d", "pinned pool (CudaDevice, stream)", f_pool_h2d);
    row("h2d", "cudaHostAlloc + cudaMemcpy", f_base_h2d);
    row("d2h", "pinned pool (CudaDevice, stream)", f_pool_d2h);
    row("d2h", "cudaHostAlloc + cudaMemcpy", f_base_d2h);
    std::printf("  pool / baseline: h2d %.2f, d2h %.2f\n",
                f_pool_h2d.median() / f_base_h2d.median(),
                f_pool_d2h.median() / f_base_d2h.median());
    // One line for scripts (tools/gpu-check.sh).
    std::printf(
        "h2d-summary h2d_pool_gbps=%.2f h2d_baseline_gbps=%.2f d2h_pool_gbps=%.2f "
        "d2h_baseline_gbps=%.2f\n",
        f_pool_h2d.median(), f_base_h2d.median(), f_pool_d2h.median(), f_base_d2h.median());

    buffers.clear();
    pool.reset();  // unregisters from the device before the device goes
    return Status::ok();
}

}  // namespace

int run_h2d(int argc, char** argv) {
    cli::Args args("zinfinity-bench h2d [flags]",
                   "Measures host->device and device->host copy GB/s from the pinned pool (swap::\n"
                   "PinnedPool buffers registered with the CUDA device, one cudaMemcpyAsync per\n"
                   "buffer on a stream) against cudaMemcpy of the whole size from cudaHostAlloc\n"
                   "memory, interleaved in the same run. Prints medians, minima and maxima.\n\n"
                   "Figures: GB/s (decimal, 1e9 bytes/s), host-timed, copy issue to completion.");
    args.add("size", "256MiB", "bytes per copy (a multiple of --buffer-size)");
    args.add("buffer-size", "64MiB", "pinned pool buffer size: one asynchronous copy per buffer");
    args.add("reps", "10", "timed repetitions of each of the four copies");
    args.add("device", "0", "CUDA device ordinal");
    constexpr std::string_view kProgram = "zinfinity-bench h2d";
    if (auto exit_code = args.parse_or_exit(argc, argv, kProgram)) return *exit_code;
    H2dOptions o;
    auto size = args.get_size_bytes("size");
    auto buffer = args.get_size_bytes("buffer-size");
    auto reps = args.get_int("reps", 1, 1000);
    auto device_index = args.get_int("device", 0, 1023);
    for (const Status& s : {size.status(), buffer.status(), reps.status(), device_index.status()}) {
        if (!s.is_ok()) return cli::report_error(kProgram, s);
    }
    o.size_bytes = *size;
    o.buffer_size_bytes = *buffer;
    o.reps = static_cast<int>(*reps);
    o.device_index = static_cast<int>(*device_index);
    if (o.buffer_size_bytes == 0 || o.size_bytes == 0 || o.size_bytes % o.buffer_size_bytes != 0) {
        const Status bad =
            Status::invalid_argument("--size must be a non-zero multiple of --buffer-size");
        return cli::report_error(kProgram, bad);
    }
    const Status status = run(o);
    return status.is_ok() ? 0 : cli::report_error(kProgram, status, 1);
}

}  // namespace zinf::bench
