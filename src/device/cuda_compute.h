// CudaCompute: the Compute operations (src/base/compute.h) on a CudaDevice: each call maps its
// StreamId to the device's CUDA stream and launches a kernel of kernels/cuda (GEMM through
// cuBLAS). Everything runs asynchronously on the stream; results in device memory are read with
// Device::copy_to_host on the same stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "src/base/compute.h"
#include "src/base/device_buffer.h"
#include "src/device/cuda_device.h"

namespace zinf::device {

struct CudaComputeOptions {
    // Device memory for the reductions' partial results (loss, sum of squares), taken from the
    // device's budget at create. Larger batches than (bytes / 8 - 1) rows are reduced in chunks.
    std::size_t reduce_scratch_bytes = std::size_t{1} << 20;
};

// Determinism: every reduction sums in a fixed order (per-block partials combined in block
// order; integer counts by atomics, which commute exactly), so the same inputs give bitwise the
// same outputs run to run. GEMM is cuBLAS's with CUBLAS_GEMM_DEFAULT in exact fp32 (no TF32),
// deterministic for a given shape, handle and GPU. Against CpuCompute results agree to rounding
// (nvcc contracts a*b+c into FMAs except where compute.h forbids it, in axpy), and dropout masks
// are bitwise identical.
//
// Thread-compatible, as Compute requires: one thread issues the calls at a time (the cuBLAS
// handle and the reduction scratch are shared by all streams, so two streams must not run
// reductions concurrently: the scratch is ordered on the stream that used it last).
class CudaCompute final : public Compute {
public:
    // `device` is borrowed and must outlive the CudaCompute. Allocates the reduction scratch from
    // the device (kNoSpace when the budget is short) and creates the cuBLAS handle (kCuda).
    static Result<std::unique_ptr<CudaCompute>> create(CudaDevice& device,
                                                       const CudaComputeOptions& options = {});
    ~CudaCompute() override;
    CudaCompute(const CudaCompute&) = delete;
    CudaCompute& operator=(const CudaCompute&) = delete;

    std::string_view name() const noexcept override { return name_; }

    Status gemm(Transpose trans_a, Transpose trans_b, std::size_t m, std::size_t n, std::size_t k,
                float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb,
                float beta, float* c, std::size_t ldc, StreamId stream) override;
    Status bias_add(float* y, const float* bias, std::size_t rows, std::size_t cols,
                    StreamId stream) override;
    Status bias_grad(const float* dy, std::size_t rows, std::size_t cols, float* grad_bias,
                     StreamId stream) override;
    Status relu_forward(const float* x, float* y, std::size_t numel, StreamId stream) override;
    Status relu_backward(const float* x, const float* dy, float* dx, std::size_t numel,
                         StreamId stream) override;
    Status gelu_forward(const float* x, float* y, std::size_t numel, StreamId stream) override;
    Status gelu_backward(const float* x, const float* dy, float* dx, std::size_t numel,
                         StreamId stream) override;
    Status layer_norm_forward(const float* x, const float* gamma, const float* beta, float eps,
                              std::size_t rows, std::size_t cols, float* y, float* mean,
                              float* rstd, StreamId stream) override;
    Status layer_norm_backward(const float* x, const float* gamma, const float* mean,
                               const float* rstd, const float* dy, std::size_t rows,
                               std::size_t cols, float* dx, float* grad_gamma, float* grad_beta,
                               StreamId stream) override;
    Status dropout_forward(const float* x, float* y, std::uint8_t* mask, std::size_t numel, float p,
                           std::uint64_t seed, std::uint64_t step, StreamId stream) override;
    Status dropout_backward(const float* dy, const std::uint8_t* mask, float* dx, std::size_t numel,
                            float p, StreamId stream) override;
    Status softmax_cross_entropy_forward(const float* logits, const std::int32_t* labels,
                                         std::size_t rows, std::size_t classes, float* probs,
                                         float* loss, StreamId stream) override;
    Status softmax_cross_entropy_backward(const float* probs, const std::int32_t* labels,
                                          std::size_t rows, std::size_t classes, float grad_scale,
                                          float* dlogits, StreamId stream) override;
    Status count_correct(const float* logits, const std::int32_t* labels, std::size_t rows,
                         std::size_t classes, std::uint64_t* correct_count, bool accumulate,
                         StreamId stream) override;
    Status embedding_forward(const std::int32_t* tokens, const float* table, const float* positions,
                             std::size_t rows, std::size_t period, std::size_t cols,
                             std::size_t vocab, float* y, StreamId stream) override;
    Status embedding_backward(const std::int32_t* tokens, const float* dy, std::size_t rows,
                              std::size_t period, std::size_t cols, std::size_t vocab,
                              float* grad_table, float* grad_positions, StreamId stream) override;
    Status causal_softmax_forward(float* s, std::size_t n, std::size_t ld,
                                  StreamId stream) override;
    Status causal_softmax_backward(const float* p, float* dp, std::size_t n, std::size_t ld,
                                   StreamId stream) override;
    Status scale(float* x, std::size_t numel, float alpha, StreamId stream) override;
    Status axpy(float alpha, const float* x, float* y, std::size_t numel, StreamId stream) override;
    Status cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t numel,
                StreamId stream) override;
    Status sum_squares(const float* x, std::size_t numel, SumSquares* out, bool accumulate,
                       StreamId stream) override;

private:
    CudaCompute(CudaDevice& device, kernels::cuda::CublasHandle cublas, DeviceBuffer scratch);
    // The CUDA stream of `stream`, with the device made current on this thread.
    Result<kernels::cuda::Stream> stream_of(StreamId stream);

    CudaDevice& device_;
    kernels::cuda::CublasHandle cublas_;
    DeviceBuffer scratch_memory_;           // owns the reduction scratch
    kernels::cuda::ReduceScratch scratch_;  // the kernels' view of it
    std::string name_;
};

}  // namespace zinf::device
