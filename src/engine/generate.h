// Sampling from a trained byte-level language model (zinfinity-train --generate): the model
// reads the last seq_len bytes of the text so far and the next byte is drawn from its
// distribution at the last position, greedily or at a temperature.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "src/base/status.h"
#include "src/engine/engine.h"

namespace zinf {

struct GenerateOptions {
    std::size_t bytes = 200;  // bytes to append to the prompt
    // 0: the most likely byte (greedy); otherwise softmax(logits / temperature).
    double temperature = 0.8;
    std::uint64_t seed = 1234;
    // Called with each byte as it is drawn (for printing as it goes); may be empty.
    std::function<void(char)> on_byte;
};

// The bytes drawn after `prompt`. The engine's model takes int32 tokens in [0, 256) and exposes
// its logits (model.type gpt). Errors: kInvalidArgument for an empty prompt, a negative or NaN
// temperature, or a model that is not a byte-level language model; those of the forward.
Result<std::string> generate(Engine& engine, std::string_view prompt,
                             const GenerateOptions& options);

}  // namespace zinf
