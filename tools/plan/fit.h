// zinfinity-plan --fit: the placement, budgets, sub_group_size, parameter buffers and aio
// settings under which a config fits given limits (device memory per rank, host memory and free
// NVMe of the machine), found by planning each candidate as the engine would (plan, memory
// prediction, admission) and, with a machine profile, ranked by predicted step time; the chosen
// one is written as a config.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/engine/step_prediction.h"

namespace zinf::plan {

struct FitOptions {
    std::string config_path;
    std::vector<std::string> overrides;  // the user's --set, applied before the candidate's
    int ranks = 1;
    std::uint64_t device_bytes = 0;     // per rank: device.memory_budget
    std::uint64_t host_bytes = 0;       // the machine's, all ranks together
    std::uint64_t nvme_free_bytes = 0;  // the machine's, all ranks together
    std::string nvme_path;              // for NVMe candidates where the config names none
    const engine::MachineProfile* profile = nullptr;  // null: ranked by least offload
    std::string out_path;                             // empty: print only
    bool json = false;
};

// Prints the candidates and the choice; returns the exit status: 0 a candidate fits (and was
// written to out_path when given), 1 none fits or the config cannot be loaded, 2 bad usage.
int run_fit(const FitOptions& options);

}  // namespace zinf::plan
