// Trains three steps of a tiny MLP on synthetic data through the installed zinf::Engine.
#include <cstdio>
#include <vector>

#include "src/base/config.h"
#include "src/data/dataset.h"
#include "src/engine/stack.h"

int main() {
    zinf::config::LoadOptions options;
    options.log_warnings = false;
    auto config = zinf::config::load_from_string(
        R"({"train_micro_batch_size_per_gpu": 8, "model": {"layers": [6, 8, 3]},
            "device": {"memory_budget": 16777216}, "cpu_optimizer": {"threads": 1}})",
        options, "consumer");
    if (!config) return std::fprintf(stderr, "%s\n", config.error().to_string().c_str()), 1;
    auto stack = zinf::TrainingStack::create(*config);
    if (!stack) return std::fprintf(stderr, "%s\n", stack.error().to_string().c_str()), 1;
    zinf::data::SyntheticOptions so;
    so.count = 8;
    so.features = 6;
    so.classes = 3;
    auto data = zinf::data::SyntheticDataset::create(so);
    if (!data) return 1;
    std::vector<float> x(8 * 6);
    std::vector<std::int32_t> y(8);
    std::vector<std::uint32_t> idx = {0, 1, 2, 3, 4, 5, 6, 7};
    (*data)->gather(idx, x, y);
    for (int step = 0; step < 3; ++step) {
        auto loss = stack->engine->forward({x, y, 8});
        if (!loss || !stack->engine->backward() || !stack->engine->step()) return 1;
        std::printf("step %d loss %.4f\n", step, *loss);
    }
    std::printf("consumer ok\n");
    return 0;
}
