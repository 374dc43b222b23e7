// Flags, printing and JSON shared by the `io`, `sweep` and `tune` subcommands of zinfinity-bench.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/fault.h"
#include "src/base/config.h"
#include "src/base/status.h"
#include "tools/bench/io_runner.h"
#include "tools/cli/args.h"

namespace zinf::bench {

// kSingle: one configuration (--backend, --block-size, --queue-depth, --threads, --fault);
// kGrid: the command declares its own list flags for those.
enum class CommonFlagSet : std::uint8_t { kSingle, kGrid };

struct CommonIoOptions {
    std::vector<std::string> dirs;
    std::uint64_t size_bytes = 0;
    io::AioOptions aio;               // backend, block size, queue depth, threads only with kSingle
    std::uint64_t op_size_bytes = 0;  // 0: auto
    std::uint64_t buffer_limit_bytes = 1ULL << 30;
    std::optional<io::FaultPlan> faults;
    std::string json_path;
    bool show_progress = true;
};

// --path and --size.
void declare_target_flags(cli::Args& args);
// --backend ... --progress (the engine settings, output and fault flags).
void declare_engine_flags(cli::Args& args, CommonFlagSet set);
// Parses and checks the common flags; errors name the flag and the bad value.
Result<CommonIoOptions> parse_common_io_flags(const cli::Args& args, CommonFlagSet set);

SessionOptions session_options(const CommonIoOptions& common, const io::AioOptions& aio);
// The session's aio block with the backend "auto" resolved to the one the engine chose.
io::AioOptions effective_aio(const IoSession& session);
// "backend io_uring, block 1 MiB, queue depth 32, 1 thread, O_DIRECT on, ..."
std::string describe_session(const IoSession& session, const BenchFiles& files);
void print_session_banner(const IoSession& session, const BenchFiles& files,
                          const CommonIoOptions& common);

// The per-figure median of several passes of one op (bytes from the first).
PassFigures median_figures(const std::vector<PassFigures>& passes);

nlohmann::json pass_to_json(const PassFigures& f);
nlohmann::json spread_to_json(const Spread& s);
// Writes `report` (indented) to `path`; the error names the path.
Status write_json_report(const std::string& path, const nlohmann::json& report);

}  // namespace zinf::bench
