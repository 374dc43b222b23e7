// zinf::Engine on a GPU (create_cuda_training_stack): every placement a GPU supports gives
// bitwise the same losses and parameters as the others that hand cuBLAS the same buffers, and
// stays close to the CPU device's run of the same config (cuBLAS sums in another order, so not
// bitwise); a checkpoint saved on the GPU loads on the CPU device with bitwise the same master
// parameters, and the reverse. Label gpu: skips itself without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "src/engine/cuda_stack.h"
#include "src/engine/engine.h"
#include "tests/engine/engine_test_support.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/support/test_seed.h"

namespace zinf {
namespace {

using test_support::bits;
using test_support::kNvmeZero;
using test_support::load_config;
using test_support::small_config;
using test_support::Trainer;
using test_support::with_nvme;

// A GPU needs the optimizer on the CPU (offload_optimizer cpu or nvme) and keeps stage-3
// partitions on the device or on NVMe (offload_param cpu is CPU-device only).
struct GpuPlacement {
    const char* name;
    const char* zero;
};

const GpuPlacement kGpuPlacements[] = {
    {"stage1-cpu", R"("zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}},)"},
    {"stage2-cpu", R"("zero_optimization": {"stage": 2, "sub_group_size": 100,)"
                   R"( "offload_optimizer": {"device": "cpu"}},)"},
    {"stage3-cpu", R"("zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 20,)"
                   R"( "offload_optimizer": {"device": "cpu"}},)"},
    {"stage2-optimizer-nvme",
     R"("zero_optimization": {"stage": 2, "sub_group_size": 200,)"
     R"( "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@"}},)"},
    {"stage3-nvme", kNvmeZero},
};

config::EngineConfig gpu_config(const std::string& extra, const std::string& nvme) {
    return load_config(with_nvme(small_config(extra), nvme), {"device.type=cuda"});
}

config::EngineConfig cpu_config(const std::string& extra, const std::string& nvme) {
    return load_config(with_nvme(small_config(extra), nvme));
}

// Largest |a - b| / max(|b|, floor) over two equally long vectors.
double max_relative_difference(const std::vector<float>& a, const std::vector<float>& b,
                               double floor) {
    EXPECT_EQ(a.size(), b.size());
    double worst = 0;
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
        const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
        worst = std::max(worst, d / std::max(std::fabs(static_cast<double>(b[i])), floor));
    }
    return worst;
}

void expect_placements_agree(const std::string& dtype_block, double loss_tolerance) {
    test::TempDir nvme_gpu("nvme"), nvme_cpu("nvme");
    // References per kind of buffer cuBLAS reads: stages 1-2 hand it views into the flat
    // parameters (64-byte aligned), stage 3 its gathered copies (256-byte aligned), and cuBLAS
    // may pick its algorithm, and so its summation order, by alignment.
    std::map<bool, std::pair<std::vector<std::uint32_t>, std::vector<std::uint32_t>>> refs;
    for (const auto& p : kGpuPlacements) {
        SCOPED_TRACE(p.name);
        const std::string extra =
            std::string(p.zero) + dtype_block + R"("gradient_clipping": 0.5,)";
        const auto gc = gpu_config(extra, nvme_gpu.path());
        Trainer gpu(gc, create_cuda_training_stack(gc));
        const auto gpu_losses = gpu.run(12);
        auto gpu_params = gpu.engine().master_parameters();
        ASSERT_TRUE(gpu_params.has_value()) << gpu_params.error().to_string();
        if (std::string(p.name) == "stage3-nvme") {
            const IoFigures io = gpu.engine().io_figures();
            EXPECT_GT(io.bytes_read, 12u * 1396u * 2u) << gpu.engine().residency_summary();
        }

        // Placements that hand cuBLAS the same buffers run the same kernels on the same data:
        // bitwise equal.
        const bool stage3 = std::string(p.name).starts_with("stage3");
        auto [ref, first] = refs.try_emplace(stage3, bits(gpu_losses), bits(*gpu_params));
        if (!first) {
            EXPECT_EQ(bits(gpu_losses), ref->second.first);
            EXPECT_EQ(bits(*gpu_params), ref->second.second);
        }

        // The CPU device's run of the same placement: close, not bitwise.
        Trainer cpu(cpu_config(extra, nvme_cpu.path()));
        const auto cpu_losses = cpu.run(12);
        auto cpu_params = cpu.engine().master_parameters();
        ASSERT_TRUE(cpu_params.has_value()) << cpu_params.error().to_string();
        EXPECT_LT(max_relative_difference({gpu_losses.front()}, {cpu_losses.front()}, 1e-3),
                  loss_tolerance / 10)
            << "step 1 loss: gpu " << gpu_losses.front() << ", cpu " << cpu_losses.front();
        EXPECT_LT(max_relative_difference(gpu_losses, cpu_losses, 1e-3), loss_tolerance);
        // Adam's update is lr * m / sqrt(v): a gradient near zero may flip sign between the two
        // devices and move its parameter by up to 2 lr (0.02) a step. A few such parameters are
        // rounding; many are a bug (an element dropped, misplaced or never updated).
        std::size_t far = 0;
        for (std::size_t i = 0; i < gpu_params->size(); ++i) {
            const double d = std::fabs(static_cast<double>((*gpu_params)[i]) - (*cpu_params)[i]);
            if (d > 0.02 + 1e-3 * std::fabs((*cpu_params)[i])) ++far;
        }
        EXPECT_LE(far, gpu_params->size() / 100)
            << far << " of " << gpu_params->size() << " parameters differ by more than 0.02";
    }
}

TEST(CudaEngineTest, Fp32PlacementsAgreeWithEachOtherAndWithTheCpu) {
    ZINF_SKIP_WITHOUT_CUDA();
    expect_placements_agree("", 2e-3);
}

TEST(CudaEngineTest, Bf16PlacementsAgreeWithEachOtherAndWithTheCpu) {
    ZINF_SKIP_WITHOUT_CUDA();
    // bf16 activations round to 8 bits of mantissa: differences of order 2^-8 are rounding.
    expect_placements_agree(R"("bf16": {"enabled": true},)", 2e-2);
}

// A checkpoint is the same file on every device: saved on the GPU, loaded on the CPU device
// (and the reverse), the master parameters are bitwise those saved.
TEST(CudaEngineTest, CheckpointsMoveBetweenGpuAndCpu) {
    ZINF_SKIP_WITHOUT_CUDA();
    test::TempDir nvme_gpu("nvme"), nvme_cpu("nvme"), dir("ckpt");
    const std::string extra = std::string(kNvmeZero) + R"("bf16": {"enabled": true},)";
    const auto gc = gpu_config(extra, nvme_gpu.path());
    const auto cc = cpu_config(extra, nvme_cpu.path());
    std::vector<std::uint32_t> saved_on_gpu, saved_on_cpu;
    {
        Trainer gpu(gc, create_cuda_training_stack(gc));
        gpu.run(5);
        saved_on_gpu = bits(gpu.engine().master_parameters().value());
        const Status s = gpu.engine().save_checkpoint(dir.path(), "gpu");
        ASSERT_TRUE(s.is_ok()) << s.to_string();
    }
    {
        Trainer cpu(cc);
        const Status s = cpu.engine().load_checkpoint(dir.path(), "gpu");
        ASSERT_TRUE(s.is_ok()) << s.to_string();
        EXPECT_EQ(cpu.engine().global_steps(), 5u);
        EXPECT_EQ(bits(cpu.engine().master_parameters().value()), saved_on_gpu);
        cpu.run(3);
        saved_on_cpu = bits(cpu.engine().master_parameters().value());
        const Status w = cpu.engine().save_checkpoint(dir.path(), "cpu");
        ASSERT_TRUE(w.is_ok()) << w.to_string();
    }
    Trainer gpu(gc, create_cuda_training_stack(gc));
    const Status s = gpu.engine().load_checkpoint(dir.path(), "cpu");
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(gpu.engine().global_steps(), 8u);
    EXPECT_EQ(bits(gpu.engine().master_parameters().value()), saved_on_cpu);
    // And it trains on from there.
    const auto losses = gpu.run(2);
    ASSERT_EQ(losses.size(), 2u);
    EXPECT_TRUE(std::isfinite(losses[0]) && std::isfinite(losses[1]));
}

}  // namespace
}  // namespace zinf
