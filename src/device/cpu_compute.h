// CpuCompute: the Compute operations on the host. GEMM goes through OpenBLAS; elementwise, row
// and column operations run on a oneTBB arena over fixed tiles, so that results are bitwise the
// same for every thread count.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "src/base/compute.h"
#include "src/base/device.h"
#include "src/base/status.h"

namespace zinf::device {

struct CpuComputeOptions {
    // Worker threads of the arena the operations run on; 0 means every hardware thread.
    int threads = 0;
};

// Determinism. Elementwise operations are independent per element. Reductions (bias_grad,
// layer_norm_backward's parameter gradients, sum_squares, the loss) use fixed tiles whose
// partial results are combined in tile order. GEMM is cut into fixed tiles of C
// (kGemmTileRows x kGemmTileCols), each computed by one single-threaded OpenBLAS call; the
// tiling depends only on the shape, never on the thread count. OpenBLAS's own threading is
// switched off process-wide (openblas_set_num_threads(1), overriding OPENBLAS_NUM_THREADS),
// because its partitioning follows its thread count and its threads would compete with the
// arena's.
//
// Ordering. Operations run on the calling thread and the arena before the call returns. When a
// Device is given, each operation first waits for the work already enqueued on `stream`
// (Device::synchronize), so it is ordered after earlier copies on that stream, and work enqueued
// later is ordered after it. Without a Device, streams are ignored: pointers are plain host
// memory (tests).
class CpuCompute final : public Compute {
public:
    static constexpr std::size_t kGemmTileRows = 64;
    static constexpr std::size_t kGemmTileCols = 256;
    static constexpr std::size_t kElementwiseTileNumel = 16384;
    static constexpr std::size_t kColumnTileCols = 256;

    // `device`, when not null, is borrowed and must outlive the CpuCompute; it must be a CPU
    // device (kInvalidArgument otherwise). Fails with kInvalidArgument for threads < 0, and
    // with kernels::resolve_isa's errors when ZINF_CPU_ISA names a variant the CPU lacks.
    static Result<std::unique_ptr<CpuCompute>> create(Device* device,
                                                      const CpuComputeOptions& options = {});
    ~CpuCompute() override;
    CpuCompute(const CpuCompute&) = delete;
    CpuCompute& operator=(const CpuCompute&) = delete;

    int threads() const noexcept { return threads_; }
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
    struct Impl;  // the tbb::task_arena and the cast kernels' variant, kept out of this header
    CpuCompute(Device* device, int threads, std::unique_ptr<Impl> impl, std::string name);

    // Waits for the work enqueued on `stream` before this operation (see the class comment).
    Status wait_stream(StreamId stream);
    // Runs body(begin, end) over [0, count) cut into tiles of tile_count, in parallel.
    template <typename Body>
    void parallel_tiles(std::size_t count, std::size_t tile_count, const Body& body);

    Device* device_;
    int threads_;
    std::unique_ptr<Impl> impl_;
    std::string name_;
};

}  // namespace zinf::device
