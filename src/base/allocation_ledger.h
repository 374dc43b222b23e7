// AllocationLedger: what each live device allocation is for, so that a budget overrun names
// the allocation that did not fit and what holds the memory already. Shared by every Device
// implementation (the CPU device and the CUDA device keep their own maps for their own needs;
// this is only the accounting that their errors print).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "src/base/status.h"

namespace zinf {

// Thread-compatible: the owning device calls it under its own lock. Allocates a map node per
// allocation (init time, as the devices' own maps do).
class AllocationLedger {
public:
    void add(const void* ptr, std::size_t size_bytes, std::string_view what);
    // Forgets `ptr` (asserts it is known).
    void remove(const void* ptr) noexcept;
    std::size_t allocation_count() const noexcept { return entries_.size(); }

    // "; in use: 809545728 bytes in 9 allocations: 268435456 zero: parameters, ..." with the
    // labels summed and the largest first (at most eight, then the rest as one figure).
    std::string in_use() const;
    // The kNoSpace of an allocation that would exceed `budget_bytes`: names the device, the
    // allocation, its size, the budget and what is in use.
    Status over_budget(std::string_view device, std::string_view what, std::size_t size_bytes,
                       std::size_t budget_bytes, std::size_t used_bytes) const;

private:
    struct Entry {
        std::size_t size_bytes = 0;
        std::string what;
    };
    std::map<std::uintptr_t, Entry> entries_;
};

}  // namespace zinf
