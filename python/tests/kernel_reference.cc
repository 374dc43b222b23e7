// The C++ side of the Python tests' bitwise check: runs `steps` optimizer steps of
// kernels::OptimizerKernel over the fp32 parameters and per-step fp32 gradients in IN and writes
// the parameters and both moments to OUT, so that test_optim.py can compare zinfinity.optim's
// results with the kernel called from C++ without Python in between.
//   kernel_reference KIND STEPS LR BETA1 BETA2 EPS WEIGHT_DECAY IN OUT
//   IN:  numel params, then STEPS × numel gradients (raw little-endian fp32)
//   OUT: numel params, numel exp_avg, numel exp_avg_sq
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/optimizer.h"

namespace {

int fail(const std::string& message) {
    std::fprintf(stderr, "kernel_reference: %s\n", message.c_str());
    return 1;
}

}  // namespace

int main(int argc, char** argv) {
    using namespace zinf::kernels;
    if (argc != 10) return fail("usage: KIND STEPS LR BETA1 BETA2 EPS WEIGHT_DECAY IN OUT");
    OptimizerParams p;
    const std::string_view kind = argv[1];
    if (kind == "adamw")
        p.kind = OptimizerKind::kAdamW;
    else if (kind == "adam")
        p.kind = OptimizerKind::kAdam;
    else
        return fail("KIND: adam or adamw");
    const long steps = std::strtol(argv[2], nullptr, 10);
    p.lr = std::strtod(argv[3], nullptr);
    p.beta1 = std::strtod(argv[4], nullptr);
    p.beta2 = std::strtod(argv[5], nullptr);
    p.eps = std::strtod(argv[6], nullptr);
    p.weight_decay = std::strtod(argv[7], nullptr);

    std::FILE* in = std::fopen(argv[8], "rb");
    if (in == nullptr) return fail(std::string("cannot open ") + argv[8]);
    std::vector<float> all;
    float buf[4096];
    std::size_t n = 0;
    while ((n = std::fread(buf, sizeof(float), 4096, in)) > 0) all.insert(all.end(), buf, buf + n);
    std::fclose(in);
    if (steps <= 0 || all.size() % static_cast<std::size_t>(steps + 1) != 0) {
        return fail("IN does not hold numel × (STEPS + 1) floats");
    }
    const std::size_t numel = all.size() / static_cast<std::size_t>(steps + 1);
    std::vector<float> params(all.begin(), all.begin() + static_cast<long>(numel));
    std::vector<float> m(numel, 0.0f), v(numel, 0.0f);

    auto kernel = OptimizerKernel::create(std::string_view("auto"), 1);
    if (!kernel.has_value()) return fail(kernel.error().to_string());
    for (long s = 0; s < steps; ++s) {
        p.step = static_cast<std::uint64_t>(s + 1);
        const float* g = all.data() + numel * static_cast<std::size_t>(s + 1);
        const auto status = kernel.value().step(p, {params, m, v}, GradView::fp32({g, numel}));
        if (!status.is_ok()) return fail(status.to_string());
    }
    std::FILE* out = std::fopen(argv[9], "wb");
    if (out == nullptr) return fail(std::string("cannot create ") + argv[9]);
    for (const auto* a : {&params, &m, &v}) std::fwrite(a->data(), sizeof(float), numel, out);
    return std::fclose(out) == 0 ? 0 : fail("write failed");
}
