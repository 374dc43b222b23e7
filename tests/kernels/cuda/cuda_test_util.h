// Helpers of the CUDA tests: the skip when no GPU is present, device arrays with RAII, and
// host references for the 16-bit types.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cuda/cuda_status.h"

namespace zinf::test {

// Skips the test, saying why, when this machine has no usable CUDA device.
#define ZINF_SKIP_WITHOUT_CUDA()                                                  \
    do {                                                                          \
        const ::zinf::Status zinf_probe_ = ::zinf::kernels::cuda::probe_device(); \
        if (!zinf_probe_.is_ok()) GTEST_SKIP() << zinf_probe_.message();          \
    } while (0)

// A cudaMalloc'd array of n T, uploaded from and downloaded to host vectors (synchronously).
template <typename T>
class DeviceArray {
public:
    explicit DeviceArray(std::size_t n) : n_(n) {
        if (n_ > 0) {
            const cudaError_t error = cudaMalloc(&ptr_, n_ * sizeof(T));
            EXPECT_EQ(error, cudaSuccess) << cudaGetErrorString(error);
        }
    }
    explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
    ~DeviceArray() {
        if (ptr_ != nullptr) static_cast<void>(cudaFree(ptr_));
    }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;

    T* get() { return static_cast<T*>(ptr_); }
    std::size_t size() const { return n_; }
    void upload(const std::vector<T>& host) {
        ASSERT_EQ(host.size(), n_);
        if (n_ == 0) return;
        ASSERT_EQ(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice),
                  cudaSuccess);
    }
    // Waits for all work of the device, then copies back.
    std::vector<T> download() const {
        std::vector<T> host(n_);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        if (n_ > 0) {
            EXPECT_EQ(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost),
                      cudaSuccess);
        }
        return host;
    }

private:
    void* ptr_ = nullptr;
    std::size_t n_ = 0;
};

// Host references: fp32 -> bf16 rounding to nearest even (NaN kept quiet), bf16 -> fp32 exact.
inline std::uint16_t ref_float_to_bf16(float value) {
    std::uint32_t bits;
    std::memcpy(&bits, &value, 4);
    if (std::isnan(value)) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
    const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<std::uint16_t>((bits + rounding) >> 16);
}
inline float ref_bf16_to_float(std::uint16_t value) {
    const std::uint32_t bits = static_cast<std::uint32_t>(value) << 16;
    float out;
    std::memcpy(&out, &bits, 4);
    return out;
}
// fp16 through GCC's _Float16 (IEEE binary16, round to nearest even).
inline std::uint16_t ref_float_to_fp16(float value) {
    const auto half = static_cast<_Float16>(value);
    std::uint16_t bits;
    std::memcpy(&bits, &half, 2);
    return bits;
}
inline float ref_fp16_to_float(std::uint16_t value) {
    _Float16 half;
    std::memcpy(&half, &value, 2);
    return static_cast<float>(half);
}

// The awkward sizes every kernel is checked on (STYLE.md §10); the last is more than one pass of
// the largest grid (8192 blocks of 256 threads), so grid-stride loops go round.
inline const std::vector<std::size_t>& awkward_sizes() {
    static const std::vector<std::size_t> sizes = {0, 1, 15, (std::size_t{1} << 20) + 3,
                                                   (std::size_t{3} << 21) + 5};
    return sizes;
}

}  // namespace zinf::test
