// CudaCompute: Compute on a CudaDevice through the kernels of kernels/cuda and cuBLAS.
#include "src/device/cuda_compute.h"

#include <utility>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/softmax_xent.h"
#include "src/base/log.h"

namespace zinf::device {

namespace kc = kernels::cuda;

Result<std::unique_ptr<CudaCompute>> CudaCompute::create(CudaDevice& device,
                                                         const CudaComputeOptions& options) {
    if (options.reduce_scratch_bytes < kc::kReduceScratchBytesMin) {
        return Status::invalid_argument(str_cat("CudaCompute: reduce_scratch_bytes ",
                                                options.reduce_scratch_bytes, " is below ",
                                                kc::kReduceScratchBytesMin));
    }
    ZINF_TRY(device.make_current());
    ZINF_ASSIGN_OR_RETURN(auto scratch, DeviceBuffer::allocate(device, options.reduce_scratch_bytes,
                                                               "cuda compute: reduction scratch"));
    ZINF_ASSIGN_OR_RETURN(auto cublas, kc::CublasHandle::create());
    return std::unique_ptr<CudaCompute>(
        new CudaCompute(device, std::move(cublas), std::move(scratch)));
}

CudaCompute::CudaCompute(CudaDevice& device, kc::CublasHandle cublas, DeviceBuffer scratch)
    : device_(device),
      cublas_(std::move(cublas)),
      scratch_memory_(std::move(scratch)),
      scratch_{scratch_memory_.data(), scratch_memory_.size_bytes()},
      name_(str_cat("cuda:", device.ordinal())) {}

CudaCompute::~CudaCompute() {
    // The scratch's DeviceBuffer frees it after this body: cudaFree waits for queued work that
    // may still use it, on the device made current here.
    if (!device_.make_current().is_ok())
        log::error("CudaCompute: cudaSetDevice failed at teardown");
}

Result<kc::Stream> CudaCompute::stream_of(StreamId stream) {
    ZINF_TRY(device_.make_current());
    return device_.cuda_stream(stream);
}

Status CudaCompute::gemm(Transpose trans_a, Transpose trans_b, std::size_t m, std::size_t n,
                         std::size_t k, float alpha, const float* a, std::size_t lda,
                         const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc,
                         StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::gemm(cublas_, s, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, DType::kFloat32,
                    beta, c, ldc, DType::kFloat32, kc::GemmPrecision::kExact);
}

Status CudaCompute::bias_add(float* y, const float* bias, std::size_t rows, std::size_t cols,
                             StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::bias_add(y, bias, rows, cols, s);
}

Status CudaCompute::bias_grad(const float* dy, std::size_t rows, std::size_t cols, float* grad_bias,
                              StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::bias_grad(dy, rows, cols, grad_bias, s);
}

Status CudaCompute::relu_forward(const float* x, float* y, std::size_t numel, StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::relu_forward(x, y, numel, s);
}

Status CudaCompute::relu_backward(const float* x, const float* dy, float* dx, std::size_t numel,
                                  StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::relu_backward(x, dy, dx, numel, s);
}

Status CudaCompute::gelu_forward(const float* x, float* y, std::size_t numel, StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::gelu_forward(x, y, numel, s);
}

Status CudaCompute::gelu_backward(const float* x, const float* dy, float* dx, std::size_t numel,
                                  StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::gelu_backward(x, dy, dx, numel, s);
}

Status CudaCompute::layer_norm_forward(const float* x, const float* gamma, const float* beta,
                                       float eps, std::size_t rows, std::size_t cols, float* y,
                                       float* mean, float* rstd, StreamId stream) {
    ZINF_ASSERT_GE(eps, 0.0f);
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::layernorm_forward(x, gamma, beta, y, mean, rstd, rows, cols, eps, s);
}

Status CudaCompute::layer_norm_backward(const float* x, const float* gamma, const float* mean,
                                        const float* rstd, const float* dy, std::size_t rows,
                                        std::size_t cols, float* dx, float* grad_gamma,
                                        float* grad_beta, StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::layernorm_backward(dy, x, gamma, mean, rstd, dx, grad_gamma, grad_beta, rows, cols,
                                  s);
}

Status CudaCompute::dropout_forward(const float* x, float* y, std::uint8_t* mask, std::size_t numel,
                                    float p, std::uint64_t seed, std::uint64_t step,
                                    StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::dropout_forward(x, y, mask, numel, p, seed, step, s);
}

Status CudaCompute::dropout_backward(const float* dy, const std::uint8_t* mask, float* dx,
                                     std::size_t numel, float p, StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::dropout_backward(dy, mask, dx, numel, p, s);
}

Status CudaCompute::softmax_cross_entropy_forward(const float* logits, const std::int32_t* labels,
                                                  std::size_t rows, std::size_t classes,
                                                  float* probs, float* loss, StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::softmax_xent_forward(logits, labels, rows, classes, probs, loss, scratch_, s);
}

Status CudaCompute::softmax_cross_entropy_backward(const float* probs, const std::int32_t* labels,
                                                   std::size_t rows, std::size_t classes,
                                                   float grad_scale, float* dlogits,
                                                   StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::softmax_xent_backward(probs, labels, rows, classes, grad_scale, dlogits, s);
}

Status CudaCompute::count_correct(const float* logits, const std::int32_t* labels, std::size_t rows,
                                  std::size_t classes, std::uint64_t* correct_count,
                                  bool accumulate, StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::count_correct(logits, labels, rows, classes, correct_count, accumulate, s);
}

Status CudaCompute::embedding_forward(const std::int32_t* tokens, const float* table,
                                      const float* positions, std::size_t rows, std::size_t period,
                                      std::size_t cols, std::size_t vocab, float* y,
                                      StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::embedding_forward(tokens, table, positions, rows, period, cols, vocab, y, s);
}

Status CudaCompute::embedding_backward(const std::int32_t* tokens, const float* dy,
                                       std::size_t rows, std::size_t period, std::size_t cols,
                                       std::size_t vocab, float* grad_table, float* grad_positions,
                                       StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::embedding_backward(tokens, dy, rows, period, cols, vocab, grad_table, grad_positions,
                                  s);
}

Status CudaCompute::causal_softmax_forward(float* scores, std::size_t n, std::size_t ld,
                                           StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::causal_softmax_forward(scores, n, ld, s);
}

Status CudaCompute::causal_softmax_backward(const float* p, float* dp, std::size_t n,
                                            std::size_t ld, StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::causal_softmax_backward(p, dp, n, ld, s);
}

Status CudaCompute::scale(float* x, std::size_t numel, float alpha, StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::scale(x, numel, alpha, s);
}

Status CudaCompute::axpy(float alpha, const float* x, float* y, std::size_t numel,
                         StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::axpy(alpha, x, y, numel, s);
}

Status CudaCompute::cast(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                         std::size_t numel, StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::cast(src, src_dtype, dst, dst_dtype, numel, s);
}

Status CudaCompute::sum_squares(const float* x, std::size_t numel, SumSquares* out, bool accumulate,
                                StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(kc::Stream s, stream_of(stream));
    return kc::sum_squares(x, numel, out, accumulate, scratch_, s);
}

}  // namespace zinf::device
