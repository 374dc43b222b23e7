// Softmax cross-entropy kernels: one block per row (max, exponentials, their sum), one block for
// the loss's fixed-order sum over rows, and a thread per row for the accuracy count.
#include <cmath>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/detail/launch.cuh"
#include "kernels/cuda/softmax_xent.h"

namespace zinf::kernels::cuda {
namespace {

constexpr std::size_t kRowBlocksMax = 65535;

// Rows [base, base + count): probs, and each row's loss into row_loss[row - base].
__global__ void softmax_xent_forward_kernel(const float* logits, const std::int32_t* labels,
                                            float* probs, double* row_loss, std::size_t base,
                                            std::size_t count, std::size_t classes) {
    __shared__ float scratch_max[32];
    __shared__ double scratch_sum[32];
    for (std::size_t local = blockIdx.x; local < count; local += gridDim.x) {
        const std::size_t row = base + local;
        const float* lr = logits + row * classes;
        float* pr = probs + row * classes;
        float local_max = -INFINITY;
        for (std::size_t c = threadIdx.x; c < classes; c += blockDim.x)
            local_max = fmaxf(local_max, lr[c]);
        const float row_max = detail::block_max(local_max, scratch_max);
        double sum = 0.0;
        for (std::size_t c = threadIdx.x; c < classes; c += blockDim.x) {
            const float e = expf(lr[c] - row_max);
            pr[c] = e;
            sum += e;
        }
        sum = detail::block_sum(sum, scratch_sum);
        const double inv_sum = 1.0 / sum;
        for (std::size_t c = threadIdx.x; c < classes; c += blockDim.x) {
            pr[c] = static_cast<float>(pr[c] * inv_sum);
        }
        if (threadIdx.x == 0) {
            const std::int32_t label = labels[row];
            const bool valid = label >= 0 && static_cast<std::size_t>(label) < classes;
            row_loss[local] = valid ? log(sum) - static_cast<double>(lr[label] - row_max) : NAN;
        }
    }
}

// Sums row_loss[0, count) in a fixed order into *total (started at 0 when first); on the last
// chunk writes *loss = *total / rows.
__global__ void loss_sum_kernel(const double* row_loss, std::size_t count, double* total,
                                bool first, bool last, std::size_t rows, float* loss) {
    __shared__ double scratch[32];
    double sum = 0.0;
    for (std::size_t i = threadIdx.x; i < count; i += blockDim.x) sum += row_loss[i];
    sum = detail::block_sum(sum, scratch);
    if (threadIdx.x == 0) {
        const double running = (first ? 0.0 : *total) + sum;
        *total = running;
        if (last) *loss = static_cast<float>(running / static_cast<double>(rows));
    }
}

__global__ void softmax_xent_backward_kernel(const float* probs, const std::int32_t* labels,
                                             float* dlogits, std::size_t rows, std::size_t classes,
                                             float row_scale) {
    const std::size_t numel = rows * classes;
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < numel;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const std::size_t row = i / classes;
        const std::size_t c = i % classes;
        const std::int32_t label = labels[row];
        const float target = (label >= 0 && static_cast<std::size_t>(label) == c) ? 1.0f : 0.0f;
        dlogits[i] = (probs[i] - target) * row_scale;
    }
}

__global__ void count_correct_kernel(const float* logits, const std::int32_t* labels,
                                     std::size_t rows, std::size_t classes,
                                     unsigned long long* correct_count) {
    __shared__ unsigned long long scratch[32];
    unsigned long long correct = 0;
    for (std::size_t r = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; r < rows;
         r += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const float* lr = logits + r * classes;
        std::size_t best = 0;
        for (std::size_t c = 1; c < classes; ++c) {
            if (lr[c] > lr[best]) best = c;
        }
        if (labels[r] >= 0 && best == static_cast<std::size_t>(labels[r])) ++correct;
    }
    correct = detail::block_sum(correct, scratch);
    // Integer additions commute exactly: the count is the same in any order.
    if (threadIdx.x == 0 && correct != 0) atomicAdd(correct_count, correct);
}

}  // namespace

Status softmax_xent_forward(const float* logits, const std::int32_t* labels, std::size_t rows,
                            std::size_t classes, float* probs, float* loss, ReduceScratch scratch,
                            Stream stream) {
    ZINF_ASSERT_GE(rows, std::size_t{1});
    ZINF_ASSERT_GE(classes, std::size_t{1});
    ZINF_ASSERT(logits != nullptr);
    ZINF_ASSERT(labels != nullptr);
    ZINF_ASSERT(probs != nullptr);
    ZINF_ASSERT(loss != nullptr);
    ZINF_ASSERT(scratch.data != nullptr);
    ZINF_ASSERT_GE(scratch.size_bytes, kReduceScratchBytesMin);
    // The last double of the scratch is the running total; the rest holds one chunk's row losses.
    auto* values = static_cast<double*>(scratch.data);
    const std::size_t chunk_rows = scratch.size_bytes / sizeof(double) - 1;
    double* total = values + chunk_rows;
    // Classifier heads are narrow: a 64-thread block wastes less of a 10-class row than 256.
    const int threads = classes <= 64 ? 64 : detail::kBlockThreads;
    for (std::size_t base = 0; base < rows; base += chunk_rows) {
        const std::size_t count = rows - base < chunk_rows ? rows - base : chunk_rows;
        const auto blocks =
            static_cast<unsigned int>(count < kRowBlocksMax ? count : kRowBlocksMax);
        softmax_xent_forward_kernel<<<blocks, threads, 0, stream>>>(logits, labels, probs, values,
                                                                    base, count, classes);
        ZINF_CUDA_TRY_LAUNCH("softmax_xent_forward_kernel");
        loss_sum_kernel<<<1, 1024, 0, stream>>>(values, count, total, base == 0,
                                                base + count == rows, rows, loss);
        ZINF_CUDA_TRY_LAUNCH("loss_sum_kernel");
    }
    return Status::ok();
}

Status softmax_xent_backward(const float* probs, const std::int32_t* labels, std::size_t rows,
                             std::size_t classes, float grad_scale, float* dlogits, Stream stream) {
    ZINF_ASSERT_GE(rows, std::size_t{1});
    ZINF_ASSERT_GE(classes, std::size_t{1});
    ZINF_ASSERT(probs != nullptr);
    ZINF_ASSERT(labels != nullptr);
    ZINF_ASSERT(dlogits != nullptr);
    const float row_scale = grad_scale / static_cast<float>(rows);
    softmax_xent_backward_kernel<<<detail::grid_for(rows * classes), detail::kBlockThreads, 0,
                                   stream>>>(probs, labels, dlogits, rows, classes, row_scale);
    ZINF_CUDA_TRY_LAUNCH("softmax_xent_backward_kernel");
    return Status::ok();
}

Status count_correct(const float* logits, const std::int32_t* labels, std::size_t rows,
                     std::size_t classes, std::uint64_t* correct_count, bool accumulate,
                     Stream stream) {
    ZINF_ASSERT_GE(classes, std::size_t{1});
    ZINF_ASSERT(correct_count != nullptr);
    static_assert(sizeof(unsigned long long) == sizeof(std::uint64_t));
    if (!accumulate)
        ZINF_CUDA_TRY(cudaMemsetAsync(correct_count, 0, sizeof(std::uint64_t), stream));
    if (rows == 0) return Status::ok();
    ZINF_ASSERT(logits != nullptr);
    ZINF_ASSERT(labels != nullptr);
    count_correct_kernel<<<detail::grid_for(rows), detail::kBlockThreads, 0, stream>>>(
        logits, labels, rows, classes, reinterpret_cast<unsigned long long*>(correct_count));
    ZINF_CUDA_TRY_LAUNCH("count_correct_kernel");
    return Status::ok();
}

}  // namespace zinf::kernels::cuda
