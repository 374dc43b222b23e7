// Vocabulary of the tiered memory manager: tiers, partition ids and accesses.
#pragma once

#include <cstdint>
#include <limits>
#include <string_view>

namespace zinf::tier {

// Where a copy of a partition lives. Ordered from fastest to slowest: data moves down one tier at
// a time on write-back (device → host → NVMe) and up one tier at a time on fetch.
enum class Tier : std::uint8_t { kDevice = 0, kHost = 1, kNvme = 2 };
constexpr int kTierCount = 3;

constexpr std::string_view tier_name(Tier tier) noexcept {
    switch (tier) {
        case Tier::kDevice:
            return "device";
        case Tier::kHost:
            return "host";
        case Tier::kNvme:
            return "nvme";
    }
    return "?";
}

// A partition is a rank's slice of a parameter or an optimizer state group; `zero/` assigns the
// ids densely from 0, and src/tier knows nothing else about them (no ranks, no tensors).
using PartitionId = std::uint32_t;
constexpr PartitionId kNoPartition = std::numeric_limits<PartitionId>::max();

// One acquire, as recorded in the access trace.
struct Access {
    PartitionId id = kNoPartition;
    Tier tier = Tier::kDevice;
    friend bool operator==(const Access&, const Access&) = default;
};

}  // namespace zinf::tier
