// The Gpt model on a GPU (CudaDevice + CudaCompute: cuBLAS and kernels/cuda/attention.cu)
// against the same model on the CPU device: one training step's loss and every gradient agree to
// rounding (cuBLAS sums in another order), and on the GPU checkpointing (on the device and in
// pinned host memory) is bitwise the run without it. Label gpu: skips itself without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "src/device/cpu_compute.h"
#include "src/device/cpu_device.h"
#include "src/device/cuda_compute.h"
#include "src/device/cuda_device.h"
#include "src/model/gpt.h"
#include "src/model/parameter_store.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace zinf {
namespace {

struct StepOutput {
    float loss = 0;
    std::vector<std::vector<float>> grads;
};

model::GptConfig gpt_config() {
    model::GptConfig c;
    c.n_layer = 2;
    c.n_head = 4;
    c.d_model = 64;
    c.seq_len = 32;
    c.batch_rows_max = 3;
    c.dropout = 0.1f;
    return c;
}

StepOutput one_step(Device& device, Compute& compute, const model::GptConfig& config) {
    auto gpt = model::Gpt::create(config, device);
    ZINF_ASSERT_MSG(gpt.has_value(), gpt.status().to_string());
    auto store =
        std::move(model::DeviceParameterStore::create((*gpt)->parameters(), device, compute))
            .value();
    ZINF_ASSERT(store->initialize(5, 0));
    const std::size_t n = config.batch_rows_max * config.seq_len;
    std::vector<std::int32_t> tokens(n), labels(n);
    std::mt19937 rng(9);
    for (std::size_t i = 0; i < n; ++i) {
        tokens[i] = static_cast<std::int32_t>(rng() % 256);
        labels[i] = static_cast<std::int32_t>(rng() % 256);
    }
    auto t = std::move(DeviceBuffer::allocate(device, n * 4, "tokens")).value();
    auto l = std::move(DeviceBuffer::allocate(device, n * 4, "labels")).value();
    ZINF_ASSERT(device.copy_to_device(t.data(), tokens.data(), n * 4, 0));
    ZINF_ASSERT(device.copy_to_device(l.data(), labels.data(), n * 4, 0));
    model::Context ctx{compute, *store, *store};
    ctx.step = 3;
    ZINF_ASSERT((*gpt)->forward(ctx, t.data(), l.as<std::int32_t>(), config.batch_rows_max));
    StepOutput out;
    out.loss = (*gpt)->read_loss(0).value();
    ZINF_ASSERT((*gpt)->backward(ctx, 1.0f));
    for (const model::ParameterInfo& info : (*gpt)->parameters().all()) {
        std::vector<float> g(info.numel);
        ZINF_ASSERT(device.copy_to_host(g.data(), store->gradient(info.id), info.numel * 4, 0));
        ZINF_ASSERT(device.synchronize(0));
        out.grads.push_back(std::move(g));
    }
    return out;
}

TEST(CudaGpt, AgreesWithTheCpuAndCheckpointsBitwise) {
    ZINF_SKIP_WITHOUT_CUDA();
    device::CudaDeviceOptions o;
    o.budget_bytes = std::size_t{1} << 30;
    auto gpu = std::move(device::CudaDevice::create(o)).value();
    auto gpu_compute = std::move(device::CudaCompute::create(*gpu)).value();
    auto cpu = std::move(device::CpuDevice::create({})).value();
    auto cpu_compute = std::move(device::CpuCompute::create(cpu.get(), {2})).value();

    model::GptConfig config = gpt_config();
    const StepOutput on_cpu = one_step(*cpu, *cpu_compute, config);
    const StepOutput on_gpu = one_step(*gpu, *gpu_compute, config);
    EXPECT_NEAR(on_gpu.loss, on_cpu.loss, 1e-5 * std::fabs(on_cpu.loss));
    for (std::size_t p = 0; p < on_cpu.grads.size(); ++p) {
        double err2 = 0, norm2 = 0;
        for (std::size_t i = 0; i < on_cpu.grads[p].size(); ++i) {
            const double d = on_gpu.grads[p][i] - on_cpu.grads[p][i];
            err2 += d * d;
            norm2 += static_cast<double>(on_cpu.grads[p][i]) * on_cpu.grads[p][i];
        }
        EXPECT_LE(std::sqrt(err2 / std::max(norm2, 1e-30)), 1e-4) << "parameter " << p;
    }
    for (const model::CheckpointPlace place :
         {model::CheckpointPlace::kDevice, model::CheckpointPlace::kHost}) {
        config.checkpoint_activations = true;
        config.checkpoint_place = place;
        const StepOutput ckpt = one_step(*gpu, *gpu_compute, config);
        EXPECT_EQ(std::memcmp(&ckpt.loss, &on_gpu.loss, sizeof(float)), 0);
        for (std::size_t p = 0; p < on_gpu.grads.size(); ++p) {
            ASSERT_EQ(std::memcmp(ckpt.grads[p].data(), on_gpu.grads[p].data(),
                                  on_gpu.grads[p].size() * 4),
                      0)
                << "parameter " << p;
        }
    }
}

}  // namespace
}  // namespace zinf
