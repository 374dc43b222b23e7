// CPUID/XGETBV probing and the ISA override. Only leaves 1 and 7 of CPUID and XCR0 are read.
#include "kernels/cpu_features.h"

#include <cpuid.h>

#include <cstdlib>

#include "src/base/log.h"

namespace zinf::kernels {
namespace {

// XCR0 bits: the OS must save a register file before its instructions may be used, even
// when CPUID reports them (a hypervisor or kernel can disable AVX-512 this way).
constexpr std::uint64_t kXcr0SseAvx = (1u << 1) | (1u << 2);
constexpr std::uint64_t kXcr0Avx512 = (1u << 5) | (1u << 6) | (1u << 7);

std::uint64_t read_xcr0() noexcept {
    // Inline assembly instead of _xgetbv(): the intrinsic needs -mxsave on this file, which
    // must stay compilable for any x86-64.
    std::uint32_t eax = 0;
    std::uint32_t edx = 0;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return (static_cast<std::uint64_t>(edx) << 32) | eax;
}

bool bit(std::uint32_t reg, int index) noexcept {
    return ((reg >> index) & 1u) != 0;
}

CpuFeatures detect() noexcept {
    CpuFeatures f;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return f;
    const bool osxsave = bit(ecx, 27);
    const bool cpu_avx = bit(ecx, 28);
    const bool cpu_fma = bit(ecx, 12);
    const bool cpu_f16c = bit(ecx, 29);
    if (!osxsave || !cpu_avx) return f;
    const std::uint64_t xcr0 = read_xcr0();
    if ((xcr0 & kXcr0SseAvx) != kXcr0SseAvx) return f;
    f.avx = true;
    f.fma = cpu_fma;
    f.f16c = cpu_f16c;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return f;
    f.avx2 = bit(ebx, 5);
    if ((xcr0 & kXcr0Avx512) != kXcr0Avx512) return f;
    f.avx512f = bit(ebx, 16);
    f.avx512dq = bit(ebx, 17);
    f.avx512bw = bit(ebx, 30);
    f.avx512vl = bit(ebx, 31);
    f.avx512_fp16 = bit(edx, 23);
    unsigned eax1 = 0, ebx1 = 0, ecx1 = 0, edx1 = 0;
    if (__get_cpuid_count(7, 1, &eax1, &ebx1, &ecx1, &edx1) != 0) f.avx512_bf16 = bit(eax1, 5);
    return f;
}

}  // namespace

std::string_view isa_name(Isa isa) noexcept {
    switch (isa) {
        case Isa::kScalar:
            return "scalar";
        case Isa::kAvx2:
            return "avx2";
        case Isa::kAvx512:
            return "avx512";
    }
    return "unknown";
}

std::string CpuFeatures::to_string() const {
    std::string s;
    const auto add = [&s](bool present, const char* name) {
        if (!present) return;
        if (!s.empty()) s += ' ';
        s += name;
    };
    add(avx, "avx");
    add(avx2, "avx2");
    add(fma, "fma");
    add(f16c, "f16c");
    add(avx512f, "avx512f");
    add(avx512bw, "avx512bw");
    add(avx512vl, "avx512vl");
    add(avx512dq, "avx512dq");
    add(avx512_bf16, "avx512_bf16");
    add(avx512_fp16, "avx512_fp16");
    return s.empty() ? std::string("none beyond x86-64") : s;
}

const CpuFeatures& cpu_features() noexcept {
    static const CpuFeatures features = detect();
    return features;
}

bool isa_supported(Isa isa, const CpuFeatures& f) noexcept {
    const bool avx2 = f.avx && f.avx2 && f.fma && f.f16c;
    switch (isa) {
        case Isa::kScalar:
            return true;
        case Isa::kAvx2:
            return avx2;
        case Isa::kAvx512:
            return avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
    }
    return false;
}

bool isa_supported(Isa isa) noexcept {
    return isa_supported(isa, cpu_features());
}

Isa best_isa() noexcept {
    if (isa_supported(Isa::kAvx512)) return Isa::kAvx512;
    if (isa_supported(Isa::kAvx2)) return Isa::kAvx2;
    return Isa::kScalar;
}

namespace {

Result<Isa> resolve_named(std::string_view name, std::string_view source) {
    if (name == "auto") return best_isa();
    for (const Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
        if (name != isa_name(isa)) continue;
        if (!isa_supported(isa)) {
            return Status::not_supported(str_cat(source, "=", name, ": this CPU lacks the ", name,
                                                 " variant (detected: ", cpu_features().to_string(),
                                                 "); choose auto or a supported variant"));
        }
        return isa;
    }
    return Status::invalid_argument(
        str_cat(source, ": expected auto, avx512, avx2 or scalar, got '", name, "'"));
}

}  // namespace

Result<Isa> resolve_isa(std::string_view configured, const char* env_value) {
    if (env_value != nullptr && *env_value != '\0' && std::string_view(env_value) != "auto") {
        return resolve_named(env_value, kIsaEnvVariable);
    }
    return resolve_named(configured, "cpu_optimizer.isa");
}

Result<Isa> resolve_isa(std::string_view configured) {
    // getenv is not thread-safe against setenv; callers resolve once at init, not per step.
    return resolve_isa(configured, std::getenv(kIsaEnvVariable));
}

}  // namespace zinf::kernels
