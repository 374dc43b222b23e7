// AllocationLedger: labels of live device allocations, summed for budget errors.
#include "src/base/allocation_ledger.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "src/base/assert.h"
#include "src/base/log.h"

namespace zinf {

void AllocationLedger::add(const void* ptr, std::size_t size_bytes, std::string_view what) {
    const auto key = reinterpret_cast<std::uintptr_t>(ptr);
    const bool inserted =
        entries_.emplace(key, Entry{size_bytes, what.empty() ? "unnamed" : std::string(what)})
            .second;
    ZINF_ASSERT_MSG(inserted, "allocation ledger: address recorded twice");
}

void AllocationLedger::remove(const void* ptr) noexcept {
    const auto erased = entries_.erase(reinterpret_cast<std::uintptr_t>(ptr));
    ZINF_ASSERT_EQ(erased, std::size_t{1});
}

std::string AllocationLedger::in_use() const {
    std::map<std::string_view, std::size_t> by_label;
    std::size_t total = 0;
    for (const auto& [key, e] : entries_) {
        by_label[e.what] += e.size_bytes;
        total += e.size_bytes;
    }
    std::vector<std::pair<std::string_view, std::size_t>> sorted(by_label.begin(), by_label.end());
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    std::string s = str_cat("in use: ", total, " bytes in ", entries_.size(), " allocations");
    constexpr std::size_t kShown = 8;
    std::size_t rest = total;
    for (std::size_t i = 0; i < sorted.size() && i < kShown; ++i) {
        s += str_cat(i == 0 ? ": " : ", ", sorted[i].second, " ", sorted[i].first);
        rest -= sorted[i].second;
    }
    if (sorted.size() > kShown) s += str_cat(", ", rest, " in the rest");
    return s;
}

Status AllocationLedger::over_budget(std::string_view device, std::string_view what,
                                     std::size_t size_bytes, std::size_t budget_bytes,
                                     std::size_t used_bytes) const {
    return Status::no_space(str_cat(device, ": allocating ", size_bytes, " bytes for ",
                                    what.empty() ? "unnamed" : what, " would exceed the budget of ",
                                    budget_bytes, " bytes (", used_bytes, " bytes ", in_use(),
                                    ")"));
}

}  // namespace zinf
