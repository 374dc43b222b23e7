// Matrix products on the GPU through cuBLAS, in the row-major layout the model uses: the
// forward and backward products of a Linear layer (y = x W^T, dx = dy W, dW = dy^T x).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.h"
#include "src/base/compute.h"
#include "src/base/dtype.h"
#include "src/base/status.h"

struct cublasContext;  // cuBLAS's handle type is `cublasContext*` (cublasHandle_t).

namespace zinf::kernels::cuda {

// An owned cuBLAS handle. Thread-compatible: use one handle per thread (cuBLAS handles are not
// safe to share between threads that set different streams).
class CublasHandle {
public:
    CublasHandle() noexcept = default;
    // Creates the handle on the calling thread's current CUDA device. Returns kCuda on failure.
    static Result<CublasHandle> create();
    ~CublasHandle();
    CublasHandle(CublasHandle&& other) noexcept;
    CublasHandle& operator=(CublasHandle&& other) noexcept;
    CublasHandle(const CublasHandle&) = delete;
    CublasHandle& operator=(const CublasHandle&) = delete;

    cublasContext* get() const noexcept { return handle_; }

private:
    explicit CublasHandle(cublasContext* handle) noexcept : handle_(handle) {}
    cublasContext* handle_ = nullptr;
};

// The math mode of fp32 products. kExact keeps full fp32 (the tests' default); kTf32 lets cuBLAS
// use TF32 tensor cores (10-bit mantissa products, much faster) where the model accepts it.
enum class GemmPrecision : std::uint8_t { kExact, kTf32 };

// Row-major C = alpha * op(A) op(B) + beta * C with the conventions of Compute::gemm
// (src/base/compute.h): op(A) is m x k, op(B) is k x n; A is stored m x k (trans_a kNo, row stride
// lda >= k) or k x m (kYes, lda >= m); likewise B (ldb >= n, or >= k); C is m x n with ldc >= n;
// all device memory. A and B share `ab_dtype`; C is `c_dtype` (fp32, or the same 16-bit type as A
// and B). Products accumulate in fp32. beta == 0 means C is not read; k == 0 gives C = beta * C.
// Asynchronous on `stream` (the handle is bound to it for the call). Returns kInvalidArgument for
// an unsupported dtype pair or dimensions beyond 32 bits, kCuda for a cuBLAS failure. Does not
// block; cuBLAS may allocate its workspace at the first call on a handle.
Status gemm(CublasHandle& handle, Stream stream, Transpose trans_a, Transpose trans_b,
            std::size_t m, std::size_t n, std::size_t k, float alpha, const void* a,
            std::size_t lda, const void* b, std::size_t ldb, DType ab_dtype, float beta, void* c,
            std::size_t ldc, DType c_dtype, GemmPrecision precision = GemmPrecision::kExact);

}  // namespace zinf::kernels::cuda
