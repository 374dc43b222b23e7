// The table of every config key zinfinity knows — DeepSpeed's and its own — with what zinfinity
// does with each: implemented with DeepSpeed's meaning, warned as not implemented (no effect on
// the results), accepted only at DeepSpeed's default (any other value would change the
// arithmetic and is refused), refused when enabled, a legacy name mapped with a deprecation
// warning, or another spelling. config::load reads keys through this table, and docs/CONFIG.md's
// key list is generated from it (key_table_markdown): one source of truth.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace zinf::config {

enum class KeyStatus : std::uint8_t {
    kImplemented,  // DeepSpeed's key, with DeepSpeed's meaning
    kZinfinity,    // zinfinity's own key
    kWarned,       // DeepSpeed's key, not implemented: one warning; it does not change results
    kDefaultOnly,  // only DeepSpeed's default (`accepted`) is allowed; another value is refused
    kRefusedIfEnabled,  // a block refused when its "enabled" is true (accepted, inert, when false)
    kDeprecated,        // DeepSpeed's legacy key, mapped to its replacement with a warning
    kAlias,             // another spelling of `accepted`'s key; both at once is an error
};
std::string_view key_status_name(KeyStatus status) noexcept;

struct KeyInfo {
    std::string_view path;  // "zero_optimization.offload_param.buffer_size"
    KeyStatus status;
    std::string_view accepted;  // kDefaultOnly: the default, as JSON; kAlias: the key it spells
    std::string_view note;      // what it does, or why it is not implemented
};

// Every key, in document order (a block before its keys).
std::span<const KeyInfo> key_table() noexcept;
// The entry for a dotted path; null when the table does not have it.
const KeyInfo* find_key(std::string_view path) noexcept;
// The names of the keys directly inside `block` ("" for the top level), for suggestions.
std::string sibling_keys(std::string_view block);

// The Markdown list of every key (docs/CONFIG.md's generated section).
std::string key_table_markdown();

}  // namespace zinf::config
