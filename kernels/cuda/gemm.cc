// cuBLAS GEMM wrapper: maps row-major products onto cuBLAS's column-major ones.
#include "kernels/cuda/gemm.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <climits>
#include <utility>

#include "kernels/cuda/elementwise.h"
#include "src/base/log.h"

namespace zinf::kernels::cuda {
namespace {

Status cublas_status(cublasStatus_t status, const char* what) {
    return Status::cuda(
        str_cat(what, ": ", cublasGetStatusName(status), ": ", cublasGetStatusString(status)));
}

#define ZINF_CUBLAS_TRY(expr)                                 \
    do {                                                      \
        const cublasStatus_t zinf_cublas_status_ = (expr);    \
        if (zinf_cublas_status_ != CUBLAS_STATUS_SUCCESS)     \
            return cublas_status(zinf_cublas_status_, #expr); \
    } while (0)

cudaDataType_t cuda_data_type(DType dtype) {
    switch (dtype) {
        case DType::kFloat32:
            return CUDA_R_32F;
        case DType::kBFloat16:
            return CUDA_R_16BF;
        case DType::kFloat16:
            return CUDA_R_16F;
    }
    return CUDA_R_32F;
}

}  // namespace

Result<CublasHandle> CublasHandle::create() {
    cublasHandle_t handle = nullptr;
    ZINF_CUBLAS_TRY(cublasCreate(&handle));
    return CublasHandle(handle);
}

CublasHandle::~CublasHandle() {
    if (handle_ != nullptr) {
        const cublasStatus_t status = cublasDestroy(handle_);
        if (status != CUBLAS_STATUS_SUCCESS) {
            log::warning("cublasDestroy: ", cublasGetStatusString(status));
        }
    }
}

CublasHandle::CublasHandle(CublasHandle&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)) {}

CublasHandle& CublasHandle::operator=(CublasHandle&& other) noexcept {
    if (this != &other) {
        CublasHandle old(std::move(*this));
        handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
}

Status gemm(CublasHandle& handle, Stream stream, Transpose trans_a, Transpose trans_b,
            std::size_t m, std::size_t n, std::size_t k, float alpha, const void* a,
            std::size_t lda, const void* b, std::size_t ldb, DType ab_dtype, float beta, void* c,
            std::size_t ldc, DType c_dtype, GemmPrecision precision) {
    ZINF_ASSERT(handle.get() != nullptr);
    if (m == 0 || n == 0) return Status::ok();
    ZINF_ASSERT(c != nullptr);
    ZINF_ASSERT_GE(ldc, n);
    ZINF_ASSERT_GE(lda, trans_a == Transpose::kNo ? k : m);
    ZINF_ASSERT_GE(ldb, trans_b == Transpose::kNo ? n : k);
    if (k > 0) {
        ZINF_ASSERT(a != nullptr);
        ZINF_ASSERT(b != nullptr);
    }
    if (c_dtype != DType::kFloat32 && c_dtype != ab_dtype) {
        return Status::invalid_argument(str_cat("gemm: output ", dtype_name(c_dtype),
                                                " with inputs ", dtype_name(ab_dtype),
                                                " (expected fp32 or the input type)"));
    }
    // The 32-bit cuBLAS API takes int dimensions; larger ones would need the _64 variants.
    constexpr std::size_t kIntMax = INT_MAX;
    if (m > kIntMax || n > kIntMax || k > kIntMax || lda > kIntMax || ldb > kIntMax ||
        ldc > kIntMax) {
        return Status::invalid_argument(str_cat("gemm: dimensions ", m, "x", n, "x", k,
                                                " or strides exceed the 32-bit cuBLAS API"));
    }
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so B goes first. A
    // row-major matrix with row stride ld is a column-major one with leading dimension ld, and
    // the transposes carry over unchanged.
    const cublasOperation_t op_a = trans_a == Transpose::kNo ? CUBLAS_OP_N : CUBLAS_OP_T;
    const cublasOperation_t op_b = trans_b == Transpose::kNo ? CUBLAS_OP_N : CUBLAS_OP_T;
    const cublasComputeType_t compute =
        (ab_dtype == DType::kFloat32 && precision == GemmPrecision::kTf32)
            ? CUBLAS_COMPUTE_32F_FAST_TF32
            : CUBLAS_COMPUTE_32F;
    // k == 0: C = beta * C. Done here rather than trusted to cuBLAS, whose handling of an empty
    // inner dimension is not documented (PyTorch special-cases it too).
    if (k == 0) {
        if (c_dtype != DType::kFloat32) {
            return Status::invalid_argument("gemm: k == 0 with a 16-bit output is not supported");
        }
        return scale_matrix(static_cast<float*>(c), m, n, ldc, beta, stream);
    }
    const int lda_i = static_cast<int>(lda);
    const int ldb_i = static_cast<int>(ldb);
    ZINF_CUBLAS_TRY(cublasSetStream(handle.get(), stream));
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B goes first, with ldb.
    // NOLINTNEXTLINE(readability-suspicious-call-argument)
    ZINF_CUBLAS_TRY(cublasGemmEx(handle.get(), op_b, op_a, static_cast<int>(n), static_cast<int>(m),
                                 static_cast<int>(k), &alpha, b, cuda_data_type(ab_dtype), ldb_i, a,
                                 cuda_data_type(ab_dtype), lda_i, &beta, c, cuda_data_type(c_dtype),
                                 static_cast<int>(ldc), compute, CUBLAS_GEMM_DEFAULT));
    return Status::ok();
}

}  // namespace zinf::kernels::cuda
