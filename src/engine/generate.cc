// Sampling: one inference forward per byte over the last seq_len bytes.
#include "src/engine/generate.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "src/base/log.h"

namespace zinf {

Result<std::string> generate(Engine& engine, std::string_view prompt,
                             const GenerateOptions& options) {
    const model::BatchShape shape = engine.model().batch_shape();
    if (shape.input_kind != model::InputKind::kInt32 || shape.classes != 256 ||
        shape.label_numel != shape.input_numel) {
        return Status::invalid_argument(
            str_cat("--generate: needs a byte-level language model (model.type \"gpt\"), not \"",
                    engine.model().name(), "\""));
    }
    if (prompt.empty()) return Status::invalid_argument("--generate: the prompt is empty");
    if (!(options.temperature >= 0.0)) {
        return Status::invalid_argument(
            str_cat("--temperature: expected >= 0 (0: greedy), got ", options.temperature));
    }
    const std::size_t t = shape.input_numel;
    const std::size_t vocab = shape.classes;
    std::string text(prompt);
    std::string drawn;
    std::vector<std::int32_t> tokens(t, 0), labels(t, 0);
    std::vector<double> weights(vocab);
    std::mt19937_64 rng(options.seed);
    for (std::size_t i = 0; i < options.bytes; ++i) {
        // The last t bytes (or all), left-aligned: a causal model's position p sees positions
        // up to p only, so the padding after them changes nothing.
        const std::size_t context = std::min(t, text.size());
        const std::string_view window = std::string_view(text).substr(text.size() - context);
        for (std::size_t p = 0; p < t; ++p) {
            tokens[p] = p < context ? static_cast<unsigned char>(window[p]) : 0;
        }
        ZINF_ASSIGN_OR_RETURN(const std::vector<float> logits,
                              engine.logits(Batch::of_tokens(tokens, labels, 1)));
        const float* row = logits.data() + (context - 1) * vocab;
        std::size_t next = 0;
        if (options.temperature == 0.0) {
            next = static_cast<std::size_t>(std::max_element(row, row + vocab) - row);
        } else {
            const float top = *std::max_element(row, row + vocab);
            for (std::size_t v = 0; v < vocab; ++v) {
                weights[v] = std::exp((static_cast<double>(row[v]) - top) / options.temperature);
            }
            std::discrete_distribution<std::size_t> pick(weights.begin(), weights.end());
            next = pick(rng);
        }
        const char byte = static_cast<char>(static_cast<unsigned char>(next));
        text.push_back(byte);
        drawn.push_back(byte);
        if (options.on_byte) options.on_byte(byte);
    }
    return drawn;
}

}  // namespace zinf
