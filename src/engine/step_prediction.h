// The step time a config will take on a machine, predicted before it runs: from the offload plan
// (what moves where, how many bytes), the model's shapes (the GEMMs and elementwise passes of a
// micro-step) and a machine profile of measured primitives that `zinfinity-bench profile` writes
// (I/O GB/s per block size and queue depth, GEMM FLOP/s per shape, optimizer parameters per
// second, memory copy GB/s; collectives per size and rank count, which
// `mpirun -np N zinfinity-bench comm --profile FILE` adds). zinfinity-plan --profile prints it
// beside the memory prediction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/config.h"
#include "src/base/status.h"
#include "src/engine/offload_plan.h"

namespace zinf::engine {

// What `zinfinity-bench profile` measured on one machine (JSON, format "zinfinity-profile 1").
struct MachineProfile {
    std::string machine;  // CPU model and core count, for the reader
    int threads = 0;      // compute and optimizer threads the figures were measured with
    double memory_copy_gb_per_s = 0;  // bytes read + written per second by a threaded copy
    struct Gemm {
        std::uint64_t m = 0, n = 0, k = 0;
        double gflop_per_s = 0;
    };
    std::vector<Gemm> gemm;  // the CPU device's GEMM (CpuCompute) at a grid of shapes
    struct Optimizer {
        std::string type;         // optimizer_kind_name, lower case ("adamw")
        std::string state_dtype;  // fp32 | bf16 | int8
        double params_per_s = 0;  // in-memory step of the CPU kernel, `threads` threads
    };
    std::vector<Optimizer> optimizer;
    std::string io_path;  // the directory measured (its file system and device)
    std::string io_backend;
    struct Io {
        std::uint64_t block_size_bytes = 0;
        int queue_depth = 0;
        int threads = 1;
        double read_gb_per_s = 0;
        double write_gb_per_s = 0;
    };
    std::vector<Io> io;
    // Collectives over zinfinity's MPI communicator, fp32, one call at a time as the engine
    // issues them (`mpirun -np N zinfinity-bench comm --profile FILE` adds them; optional).
    struct Collective {
        std::string op;  // all_reduce | reduce_scatter | all_gather
        int ranks = 0;
        std::uint64_t bytes = 0;  // the collective's whole buffer (nccl-tests' convention)
        double seconds = 0;       // per call, the slowest rank's
    };
    std::vector<Collective> collectives;

    // The measured point nearest to the shape (log distance over the sorted dimensions).
    const Gemm* nearest_gemm(std::uint64_t m, std::uint64_t n, std::uint64_t k) const noexcept;
    // The point of this block size and queue depth, else the nearest in log distance.
    const Io* nearest_io(std::uint64_t block_size_bytes, int queue_depth) const noexcept;
    const Optimizer* find_optimizer(std::string_view type, std::string_view state_dtype) const;
    // Seconds of one `op` call over `ranks` ranks on `bytes`: linear between the measured sizes
    // around it, the smallest size's time below them (latency), proportional beyond the
    // largest. Negative when the profile has no figure for `op` at `ranks` ranks.
    double collective_seconds(std::string_view op, int ranks, double bytes) const;
};

inline constexpr const char* kProfileFormat = "zinfinity-profile 1";

std::string profile_to_json(const MachineProfile& profile);
// Errors name `source_name` and the key that is missing or out of range.
Result<MachineProfile> profile_from_json(std::string_view json_text, std::string_view source_name);
Result<MachineProfile> load_profile(const std::string& path);
// Writes the profile whole to `path`.tmp and renames it over `path`: a reader never sees half a
// profile; the temporary is removed on failure. Errors: kIo naming the file.
Status save_profile(const MachineProfile& profile, const std::string& path);

// One GEMM of a micro-step: C (m x n) += A (m x k) B (k x n), `count` times.
struct GemmWork {
    std::uint64_t m = 0, n = 0, k = 0;
    std::uint64_t count = 1;
    double flops() const noexcept {
        return 2.0 * double(m) * double(n) * double(k) * double(count);
    }
};

// The compute of one micro-step of the model the config builds.
struct ModelWork {
    std::vector<GemmWork> forward;
    std::vector<GemmWork> backward;        // the gradients of inputs and weights
    double forward_elementwise_bytes = 0;  // activations read and written outside the GEMMs
    double backward_elementwise_bytes = 0;
    bool recompute_forward = false;  // checkpointed blocks run their forward again in backward
    // The kept block inputs per micro-step (activation checkpointing), bytes.
    std::uint64_t checkpoint_bytes = 0;
};

// The work of `config.model` (mlp, gpt) for one micro-batch of this rank.
ModelWork model_work(const config::EngineConfig& config);

// Predicted time of one optimizer step (all its micro-steps) on one rank, seconds, and the bytes
// it moves to and from NVMe.
struct StepPrediction {
    double forward_s = 0;    // compute of every micro-step's forward
    double backward_s = 0;   // and backward (with the recomputed forward where checkpointed)
    double optimizer_s = 0;  // the CPU kernel over the optimizer domain, and its gradient passes
    // Bytes per step, and their time at the profile's rates for the config's aio settings.
    double read_bytes = 0;
    double write_bytes = 0;
    double io_s = 0;
    // Of io_s, what is not hidden under compute: forward/backward transfers beyond their compute
    // plus the optimizer pipeline's I/O beyond its kernel (and the pipeline's fill and drain).
    double exposed_io_s = 0;
    // Collectives between ranks (world_size > 1, with the profile's figures for that many
    // ranks): the calls of a step and their time, on the training thread, not overlapped.
    std::uint64_t collective_calls = 0;
    double collective_bytes = 0;
    double collective_s = 0;
    double step_s = 0;
    // Per byte kind, for the table: what is read and written each step and why.
    struct Flow {
        std::string what;
        double read_bytes = 0;
        double write_bytes = 0;
    };
    std::vector<Flow> flows;
    // The rates used (so that a reader can check the arithmetic) and what was approximated.
    double read_gb_per_s = 0;
    double write_gb_per_s = 0;
    double optimizer_params_per_s = 0;
    std::vector<std::string> notes;

    std::string describe() const;
};

// Predicts the step of `plan` (made from `config` for one rank of `world_size`) with the
// figures of `profile`. `parameter_numels` (the model's parameters, in order) sizes the
// collectives of several ranks, one call per parameter; without them the collectives are not
// counted (a note says so). Errors: kNotSupported for a device the profile has no figures for
// (cuda) or a model without shapes (an external model); kInvalidArgument when the profile lacks the
// optimizer's figures, naming what to measure.
Result<StepPrediction> predict_step(const config::EngineConfig& config, const OffloadPlan& plan,
                                    int world_size, const MachineProfile& profile,
                                    std::span<const std::size_t> parameter_numels = {});

}  // namespace zinf::engine
