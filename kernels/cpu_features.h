// CPU feature detection (CPUID and XGETBV) and the choice of the instruction-set variant the
// CPU kernels run: detected once, overridable by ZINF_CPU_ISA or `cpu_optimizer.isa`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "src/base/status.h"

namespace zinf::kernels {

// The instruction-set variants of the CPU kernels, in increasing order of preference.
// kAvx2 needs AVX2, FMA and F16C; kAvx512 needs AVX-512 F, BW, VL and DQ as well, and an
// operating system that saves the ZMM registers.
enum class Isa : std::uint8_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
inline constexpr int kIsaCount = 3;

// "scalar", "avx2", "avx512": the spellings ZINF_CPU_ISA and `cpu_optimizer.isa` accept.
std::string_view isa_name(Isa isa) noexcept;

struct CpuFeatures {
    bool avx = false;  // CPUID and the OS (XCR0 saves XMM and YMM state)
    bool avx2 = false;
    bool fma = false;
    bool f16c = false;
    bool avx512f = false;  // CPUID and the OS (XCR0 saves opmask and ZMM state)
    bool avx512bw = false;
    bool avx512vl = false;
    bool avx512dq = false;
    bool avx512_bf16 = false;  // reported only; no kernel needs it
    bool avx512_fp16 = false;  // reported only; no kernel needs it

    // "avx avx2 fma f16c ..." for messages and logs.
    std::string to_string() const;
};

// The features of the CPU this process runs on, detected on first call. Thread-safe.
const CpuFeatures& cpu_features() noexcept;

// Whether `features` (by default this CPU's) can run the `isa` variant.
bool isa_supported(Isa isa, const CpuFeatures& features) noexcept;
bool isa_supported(Isa isa) noexcept;

// The fastest variant this CPU supports.
Isa best_isa() noexcept;

// The name of the environment variable that overrides `cpu_optimizer.isa`.
inline constexpr const char* kIsaEnvVariable = "ZINF_CPU_ISA";

// Resolves the variant to run. `env_value` (the value of ZINF_CPU_ISA, or null when unset)
// wins over `configured` (`cpu_optimizer.isa`) unless it is empty or "auto"; "auto" means
// best_isa(). Asking for a variant this CPU lacks is an error, never a silent fallback.
// Returns kInvalidArgument for an unknown name and kNotSupported for a missing variant; the
// message names the source (ZINF_CPU_ISA or cpu_optimizer.isa) and the detected features.
Result<Isa> resolve_isa(std::string_view configured, const char* env_value);
// Same, reading ZINF_CPU_ISA from the environment. Does not cache: call it once at init.
Result<Isa> resolve_isa(std::string_view configured);

}  // namespace zinf::kernels
