#include "tools/plan/fit.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "src/base/config.h"
#include "src/base/log.h"
#include "src/base/units.h"
#include "tools/cli/args.h"
#include "tools/plan/rank_plan.h"

namespace zinf::plan {
namespace {

constexpr const char* kProgram = "zinfinity-plan --fit";

// One placement tried, with the settings that made it fit (or why none did).
struct Candidate {
    std::string name;
    std::vector<std::string> overrides;  // the candidate's, after the user's
    bool fits = false;
    std::string why_not;
    std::uint64_t device_peak_bytes = 0;  // the largest rank's
    std::uint64_t host_bytes = 0;         // pinned + pageable, all ranks
    std::uint64_t nvme_bytes = 0;         // all ranks
    bool timed = false;
    double step_s = 0;
};

std::string set(const std::string& key, const std::string& value) {
    return str_cat(key, "=", value);
}

std::string json_string(const std::string& text) {
    return nlohmann::json(text).dump();
}

// Admission's refusal without its itemized breakdown (zinfinity-plan without --fit prints it):
// "device.memory_budget: N bytes cannot hold the predicted device peak of M bytes; raise it...".
std::string short_reason(const std::string& text) {
    const auto open = text.find(" (");
    const auto close = text.rfind("); ");
    if (open == std::string::npos || close == std::string::npos || close < open) return text;
    return text.substr(0, open) + "; " + text.substr(close + 3);
}

// Plans every rank of `c` and checks the machine's limits; fills the candidate's figures.
void evaluate(const config::EngineConfig& c, const ModelSizes& m, const FitOptions& o,
              Candidate& cand) {
    cand.device_peak_bytes = cand.host_bytes = cand.nvme_bytes = 0;
    cand.timed = o.profile != nullptr;
    cand.step_s = 0;
    for (int r = 0; r < o.ranks; ++r) {
        const RankPlan rp = plan_rank(c, m, o.ranks, r, o.profile);
        if (!rp.planned || !rp.status.is_ok()) {
            cand.fits = false;
            cand.why_not = short_reason(rp.status.to_string());
            return;
        }
        const auto& p = rp.prediction;
        cand.device_peak_bytes = std::max(cand.device_peak_bytes, p.device.total_bytes());
        cand.host_bytes += p.pinned_host.total_bytes() + p.pageable_host.total_bytes();
        cand.nvme_bytes += p.nvme.total_bytes();
        if (rp.timed) {
            cand.step_s = std::max(cand.step_s, rp.step.step_s);
        } else {
            cand.timed = false;
        }
    }
    if (cand.host_bytes > o.host_bytes) {
        cand.fits = false;
        cand.why_not = str_cat("host memory ", format_bytes(cand.host_bytes), " > the limit ",
                               format_bytes(o.host_bytes), " (--host-memory)");
        return;
    }
    if (cand.nvme_bytes > o.nvme_free_bytes) {
        cand.fits = false;
        cand.why_not = str_cat("NVMe ", format_bytes(cand.nvme_bytes), " > the free ",
                               format_bytes(o.nvme_free_bytes), " (--nvme-free)");
        return;
    }
    cand.fits = true;
    cand.why_not.clear();
}

// Loads the config with the user's and the candidate's overrides.
Result<config::EngineConfig> load(const FitOptions& o, const std::vector<std::string>& extra) {
    config::LoadOptions lo;
    lo.overrides = o.overrides;
    lo.overrides.insert(lo.overrides.end(), extra.begin(), extra.end());
    lo.world_size = o.ranks;
    lo.log_warnings = false;
    return config::load(o.config_path, lo);
}

// Tries `base` with each of `variants` (one key's values) in order and keeps the first that
// fits, or with a profile the fastest that fits; the candidate keeps the first one's reason
// otherwise.
void try_variants(const FitOptions& o, const ModelSizes& m, Candidate& cand,
                  const std::vector<std::vector<std::string>>& variants) {
    const std::vector<std::string> base = cand.overrides;
    Candidate best;
    bool found = false;
    bool first = true;
    for (const auto& v : variants) {
        Candidate trial = cand;
        trial.overrides = base;
        trial.overrides.insert(trial.overrides.end(), v.begin(), v.end());
        auto c = load(o, trial.overrides);
        if (!c.has_value()) {
            trial.fits = false;
            trial.why_not = c.error().to_string();
        } else {
            evaluate(*c, m, o, trial);
        }
        if (trial.fits && (!found || (trial.timed && trial.step_s < best.step_s))) {
            best = trial;
            found = true;
            if (!trial.timed) break;
        }
        // Where none fits, the reason given is the first variant's (the config's own values).
        if (first) cand = trial;
        first = false;
    }
    if (found) cand = best;
}

// The profile's fastest I/O point for a step that reads and writes about as much.
std::vector<std::string> aio_from_profile(const engine::MachineProfile* profile) {
    if (profile == nullptr || profile->io.empty()) return {};
    const engine::MachineProfile::Io* best = nullptr;
    double best_rate = 0;
    for (const auto& p : profile->io) {
        const double rate = 2.0 / (1.0 / p.read_gb_per_s + 1.0 / p.write_gb_per_s);
        if (rate > best_rate) {
            best_rate = rate;
            best = &p;
        }
    }
    return {set("aio.block_size", std::to_string(best->block_size_bytes)),
            set("aio.queue_depth", std::to_string(best->queue_depth))};
}

std::vector<Candidate> candidates(const FitOptions& o, const config::EngineConfig& c,
                                  const ModelSizes& m) {
    const std::string zo = "zero_optimization.";
    std::vector<std::string> common = {
        set("device.memory_budget", std::to_string(o.device_bytes)),
        set("device.host_memory_budget",
            std::to_string(std::max<std::uint64_t>(1, o.host_bytes / std::uint64_t(o.ranks))))};
    for (auto& a : aio_from_profile(o.profile)) common.push_back(std::move(a));
    // NVMe candidates need a path: the config's, else --nvme-path.
    std::string param_path, opt_path;
    if (!c.zero.offload_param.nvme_path.empty()) param_path = c.zero.offload_param.nvme_path[0];
    if (!c.zero.offload_optimizer.nvme_path.empty()) {
        opt_path = c.zero.offload_optimizer.nvme_path[0];
    }
    if (param_path.empty()) param_path = !opt_path.empty() ? opt_path : o.nvme_path;
    if (opt_path.empty()) opt_path = param_path;
    std::size_t largest = 0;
    for (const std::size_t n :
         engine::plan_inputs_for(*m.model, *m.device, o.ranks, 0).parameter_numels) {
        largest = std::max(largest, n);
    }
    const std::uint64_t buffer_numel =
        std::max<std::uint64_t>(c.zero.offload_param.buffer_size_numel, largest);

    struct Shape {
        const char* name;
        int stage;
        const char* param;
        const char* optimizer;
    };
    const int low_stage = c.zero.stage;
    const int opt_stage = std::max(c.zero.stage, 2);
    const Shape shapes[] = {
        {"no offload", low_stage, "none", "none"},
        {"optimizer states on cpu", opt_stage, "none", "cpu"},
        {"optimizer states on nvme", opt_stage, "none", "nvme"},
        {"parameters and optimizer states on cpu", 3, "cpu", "cpu"},
        {"parameters on cpu, optimizer states on nvme", 3, "cpu", "nvme"},
        {"parameters and optimizer states on nvme", 3, "nvme", "nvme"},
    };
    const std::vector<std::vector<std::string>> sub_groups = {
        {set(zo + "sub_group_size", std::to_string(c.zero.sub_group_size_numel))},
        {set(zo + "sub_group_size", "100000000")},
        {set(zo + "sub_group_size", "10000000")},
        {set(zo + "sub_group_size", "1000000")}};
    const std::vector<std::vector<std::string>> host_tiers = {
        {set(zo + "offload_param.max_in_cpu",
             std::to_string(c.zero.offload_param.max_in_cpu_numel))},
        {set(zo + "offload_param.max_in_cpu", "100000000")},
        {set(zo + "offload_param.max_in_cpu", "10000000")},
        {set(zo + "offload_param.max_in_cpu", "1000000")}};

    std::vector<Candidate> out;
    for (const Shape& s : shapes) {
        Candidate cand;
        cand.name = s.name;
        cand.overrides = common;
        cand.overrides.push_back(set(zo + "stage", std::to_string(s.stage)));
        cand.overrides.push_back(set(zo + "offload_param.device", json_string(s.param)));
        cand.overrides.push_back(set(zo + "offload_optimizer.device", json_string(s.optimizer)));
        const bool param_nvme = std::string(s.param) == "nvme";
        const bool opt_nvme = std::string(s.optimizer) == "nvme";
        if ((param_nvme && param_path.empty()) || (opt_nvme && opt_path.empty())) {
            cand.why_not = "the config names no nvme_path (give --nvme-path DIR)";
            out.push_back(std::move(cand));
            continue;
        }
        if (param_nvme) {
            cand.overrides.push_back(set(zo + "offload_param.nvme_path", json_string(param_path)));
        }
        if (opt_nvme) {
            cand.overrides.push_back(
                set(zo + "offload_optimizer.nvme_path", json_string(opt_path)));
        }
        if (std::string(s.param) != "none") {
            cand.overrides.push_back(
                set(zo + "offload_param.buffer_size", std::to_string(buffer_numel)));
        }
        std::vector<std::vector<std::string>> variants = {{}};
        if (opt_nvme) variants = sub_groups;
        if (param_nvme) {
            std::vector<std::vector<std::string>> both;
            for (const auto& g : sub_groups) {
                for (const auto& t : host_tiers) {
                    auto v = g;
                    v.insert(v.end(), t.begin(), t.end());
                    both.push_back(std::move(v));
                }
            }
            variants = std::move(both);
        }
        try_variants(o, m, cand, variants);
        out.push_back(std::move(cand));
    }
    return out;
}

// The chosen candidate: with every figure timed, the fastest that fits; else the first that fits
// (the list runs from the least offload to the most).
const Candidate* choose(const std::vector<Candidate>& list) {
    const Candidate* chosen = nullptr;
    for (const Candidate& c : list) {
        if (!c.fits) continue;
        if (chosen == nullptr) {
            chosen = &c;
            if (!c.timed) break;
        } else if (c.timed && c.step_s < chosen->step_s) {
            chosen = &c;
        }
    }
    return chosen;
}

// Writes `text` to a new file `path` (refusing one that exists), whole or not at all.
Status write_new_file(const std::string& path, const std::string& text) {
    const std::string tmp = str_cat(path, ".tmp.", ::getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return Status::from_errno(errno, str_cat("cannot create ", tmp));
    std::size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            const int e = errno;
            ::close(fd);
            ::unlink(tmp.c_str());
            return Status::from_errno(e, str_cat("cannot write ", tmp));
        }
        done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0) {
        const int e = errno;
        ::unlink(tmp.c_str());
        return Status::from_errno(e, str_cat("cannot write ", tmp));
    }
    // link() fails where `path` exists: a file is never replaced.
    if (::link(tmp.c_str(), path.c_str()) != 0) {
        const int e = errno;
        ::unlink(tmp.c_str());
        return Status::from_errno(e, str_cat("cannot create ", path));
    }
    ::unlink(tmp.c_str());
    return Status::ok();
}

Result<std::string> read_text(const std::string& path) {
    std::ifstream in(path);
    if (!in) return Status::not_found(str_cat(path, ": cannot be opened"));
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

std::string step_text(const Candidate& c) {
    if (!c.timed) return "";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f ms", c.step_s * 1e3);
    return buf;
}

}  // namespace

int run_fit(const FitOptions& o) {
    auto base = load(o, {});
    if (!base.has_value()) return cli::report_error(kProgram, base.error(), 1);
    auto model = build_model(*base);
    if (!model.has_value()) return cli::report_error(kProgram, model.error(), 1);
    const std::vector<Candidate> list = candidates(o, *base, *model);
    const Candidate* chosen = choose(list);

    if (o.json) {
        nlohmann::json j;
        j["config"] = o.config_path;
        j["ranks"] = o.ranks;
        j["limits"] = {{"device_bytes", o.device_bytes},
                       {"host_bytes", o.host_bytes},
                       {"nvme_free_bytes", o.nvme_free_bytes}};
        j["candidates"] = nlohmann::json::array();
        for (const Candidate& c : list) {
            nlohmann::json e = {{"name", c.name}, {"fits", c.fits}, {"overrides", c.overrides}};
            if (!c.fits) e["why_not"] = c.why_not;
            if (c.fits) {
                e["device_peak_bytes"] = c.device_peak_bytes;
                e["host_bytes"] = c.host_bytes;
                e["nvme_bytes"] = c.nvme_bytes;
                if (c.timed) e["step_s"] = c.step_s;
            }
            j["candidates"].push_back(std::move(e));
        }
        j["chosen"] = chosen != nullptr ? nlohmann::json(chosen->name) : nlohmann::json();
        if (!o.out_path.empty() && chosen != nullptr) j["written"] = o.out_path;
        std::printf("%s\n", j.dump(2).c_str());
    } else {
        std::printf("%s: %s, %d rank(s); limits: device %s per rank, host %s, NVMe free %s%s\n",
                    kProgram, o.config_path.c_str(), o.ranks, format_bytes(o.device_bytes).c_str(),
                    format_bytes(o.host_bytes).c_str(), format_bytes(o.nvme_free_bytes).c_str(),
                    o.profile != nullptr ? "; ranked by predicted step time"
                                         : "; no --profile: the least offload that fits");
        for (const Candidate& c : list) {
            if (c.fits) {
                std::printf("  %-45s fits: device peak %s, host %s, NVMe %s%s%s\n", c.name.c_str(),
                            format_bytes(c.device_peak_bytes).c_str(),
                            format_bytes(c.host_bytes).c_str(), format_bytes(c.nvme_bytes).c_str(),
                            c.timed ? ", step " : "", step_text(c).c_str());
            } else {
                std::printf("  %-45s does not fit: %s\n", c.name.c_str(), c.why_not.c_str());
            }
        }
        if (chosen != nullptr) {
            std::printf("chosen: %s, with\n", chosen->name.c_str());
            for (const auto& s : chosen->overrides) std::printf("  --set %s\n", s.c_str());
        }
    }
    if (chosen == nullptr) {
        return cli::report_error(
            kProgram,
            Status::invalid_argument("no placement fits these limits (each candidate's reason "
                                     "is above)"),
            1);
    }
    if (o.out_path.empty()) return 0;
    auto text = read_text(o.config_path);
    if (!text.has_value()) return cli::report_error(kProgram, text.error(), 1);
    std::vector<std::string> all = o.overrides;
    all.insert(all.end(), chosen->overrides.begin(), chosen->overrides.end());
    auto written = config::apply_overrides(*text, all);
    if (!written.has_value()) {
        return cli::report_error(kProgram, written.error().with_context(o.config_path), 1);
    }
    // The written file must load as the candidate did.
    config::LoadOptions lo;
    lo.world_size = o.ranks;
    lo.log_warnings = false;
    auto check = config::load_from_string(*written, lo, o.out_path);
    if (!check.has_value()) return cli::report_error(kProgram, check.error(), 1);
    const Status s = write_new_file(o.out_path, *written + "\n");
    if (!s.is_ok()) return cli::report_error(kProgram, s, 1);
    if (!o.json) std::printf("wrote %s\n", o.out_path.c_str());
    return 0;
}

}  // namespace zinf::plan
