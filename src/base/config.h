// The engine configuration: plain section structs filled from a JSON file that uses DeepSpeed's
// key names and units (see docs/CONFIG.md). This is the only place in the project that reads JSON.
// Every default lives in the struct definitions below; every check happens in config::load*,
// before anything is opened or allocated.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/optimizer_descriptor.h"
#include "src/base/state_dtype.h"
#include "src/base/status.h"

namespace zinf::config {

enum class Tristate : std::uint8_t { kAuto, kOn, kOff };

// The `aio` block. DeepSpeed's keys and defaults, plus zinfinity's `backend`, `use_direct`,
// `register_buffers` and `sqpoll`.
struct AioConfig {
    std::uint64_t block_size_bytes = 1u << 20;  // `block_size`, bytes (as in DeepSpeed)
    int queue_depth = 32;                       // per worker thread
    int intra_op_parallelism = 1;               // worker threads per request (`thread_count`)
    bool single_submit = false;                 // submit one request per syscall
    bool overlap_events = true;                 // keep submitting while completions are reaped
    std::string backend = "auto";               // auto | io_uring | libaio | posix
    Tristate use_direct = Tristate::kAuto;      // auto: O_DIRECT where accepted, else buffered
    bool register_buffers = true;               // io_uring fixed buffers and files
    bool sqpoll = false;                        // io_uring kernel submission thread
};

enum class OffloadDevice : std::uint8_t { kNone, kCpu, kNvme };
std::string_view offload_device_name(OffloadDevice device) noexcept;

// `zero_optimization.offload_param`. Sizes in elements, as in DeepSpeed.
struct OffloadParamConfig {
    OffloadDevice device = OffloadDevice::kNone;
    std::vector<std::string> nvme_path;
    int buffer_count = 5;
    std::uint64_t buffer_size_numel = 100'000'000;
    std::uint64_t max_in_cpu_numel = 1'000'000'000;
    bool pin_memory = true;  // DeepSpeed's default
};

// `zero_optimization.offload_optimizer`.
struct OffloadOptimizerConfig {
    OffloadDevice device = OffloadDevice::kNone;
    std::vector<std::string> nvme_path;
    bool pin_memory = true;  // DeepSpeed's default
    bool pipeline_read = false;
    bool pipeline_write = false;
    // zinfinity: stages 2-3 on the CPU device with device "nvme": the gradient partition goes to
    // the swap files as backward produces it instead of staying in host memory. auto: only when
    // it does not fit in device.host_memory_budget beside the pinned buffers.
    Tristate stream_gradients = Tristate::kAuto;
    // zinfinity: how the optimizer's moments are stored, here and on NVMe (the fp32 master stays
    // fp32): fp32 (exact, the default), bf16 (stochastic rounding) or int8 (blockwise log code).
    StateDType state_dtype = StateDType::kFp32;
};

// `zero_optimization`. Sizes in elements, as in DeepSpeed. Keys zinfinity does not implement
// (overlap_comm, bucket sizes, ...) are in the key table (config_keys.h) and warn.
struct ZeroConfig {
    int stage = 0;
    // 0: sub-groups of the largest parameter partition (DeepSpeed: one parameter per sub-group).
    std::uint64_t sub_group_size_numel = 1'000'000'000;
    std::uint64_t stage3_prefetch_bucket_size_numel = 50'000'000;  // 0: no prefetch
    std::uint64_t stage3_max_live_parameters_numel = 1'000'000'000;
    std::uint64_t stage3_param_persistence_threshold_numel = 100'000;
    OffloadParamConfig offload_param;
    OffloadOptimizerConfig offload_optimizer;
};

struct Bf16Config {
    bool enabled = false;
};

struct Fp16Config {
    bool enabled = false;
    double loss_scale = 0;  // 0: dynamic
    int initial_scale_power = 16;
    int loss_scale_window = 1000;
    int hysteresis = 2;
    double min_loss_scale = 1;
};

struct OptimizerConfig {
    // Any registered optimizer (src/base/optimizer_descriptor.h), by its name in any case.
    OptimizerKind type = OptimizerKind::kAdamW;
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.0;
    // DeepSpeed's `Adam` applies decoupled weight decay unless `adam_w_mode` is false.
    bool adam_w_mode = true;
    bool bias_correction = true;  // Adam, AdamW
    bool amsgrad = false;         // Adam, AdamW
    // zinfinity: torch.optim's operation order (bitwise torch's results), where the optimizer's
    // descriptor has it (Adam, AdamW).
    bool torch_rounding = false;
};

enum class SchedulerType : std::uint8_t {
    kNone,
    kWarmupLR,
    kWarmupDecayLR,
    kWarmupCosineLR,
    kOneCycle,
    kLRRangeTest,
};

// `scheduler`: DeepSpeed's schedules with DeepSpeed's parameter names and defaults
// (deepspeed/runtime/lr_schedules.py). Each type reads the parameters it has.
struct SchedulerConfig {
    SchedulerType type = SchedulerType::kNone;
    // WarmupLR, WarmupDecayLR (and WarmupCosineLR's warmup_num_steps / warmup_type).
    double warmup_min_lr = 0.0;
    double warmup_max_lr = 0.001;
    std::uint64_t warmup_num_steps = 1000;
    bool warmup_linear = false;         // `warmup_type`: "log" (DeepSpeed's default) or "linear"
    std::uint64_t total_num_steps = 0;  // WarmupDecayLR, WarmupCosineLR; required there
    // WarmupCosineLR: ratios of the optimizer's lr.
    double warmup_min_ratio = 0.0;
    double cos_min_ratio = 0.0001;
    // OneCycle.
    double cycle_min_lr = 0.0;  // required
    double cycle_max_lr = 0.0;  // required
    double decay_lr_rate = 0.0;
    std::uint64_t cycle_first_step_size = 2000;
    std::uint64_t cycle_second_step_size = 0;  // 0: as cycle_first_step_size (DeepSpeed: None)
    bool cycle_second_step_size_given = false;
    std::uint64_t cycle_first_stair_count = 0;
    std::uint64_t cycle_second_stair_count = 0;  // DeepSpeed: None = as first
    bool cycle_second_stair_count_given = false;
    std::uint64_t decay_step_size = 0;
    bool cycle_momentum = true;  // cycles beta1 (Adam's momentum) inversely to the lr
    double cycle_min_mom = 0.8;
    double cycle_max_mom = 0.9;
    double decay_mom_rate = 0.0;
    // LRRangeTest.
    double lr_range_test_min_lr = 1e-3;
    std::uint64_t lr_range_test_step_size = 2000;
    double lr_range_test_step_rate = 1.0;
    bool lr_range_test_staircase = false;
};

// DeepSpeed's `csv_monitor` block (deepspeed/monitor/config.py, CSVConfig): rank 0 writes one
// CSV file per event into <output_path>/<job_name>/ (src/engine/csv_monitor.h).
struct CsvMonitorConfig {
    bool enabled = false;
    std::string output_path;  // "": relative to the working directory, as in DeepSpeed
    std::string job_name = "DeepSpeedJobName";
};

// zinfinity's `swap` block.
struct SwapConfig {
    bool verify_checksums = true;
    // Optimizer states on NVMe are copy-on-write (twice their disk space), and a checkpoint
    // copies them in the background from a pinned snapshot while training goes on.
    bool background_checkpoint = false;
    // The optimizer step of each accumulation window runs beside the window's last backward,
    // speculatively on copy-on-write states (committed, redone or skipped once the norm is
    // known; bitwise the sequential step).
    bool overlap_step = false;
    // Sub-groups of NVMe optimizer states read ahead of the one being updated (with
    // offload_optimizer.pipeline_read), one pinned buffer each.
    std::size_t optimizer_read_ahead = 1;
};

// zinfinity's `comm` block: the collectives between data-parallel ranks.
struct CommConfig {
    // Reductions summed in rank order (bitwise reproducible; a little slower than MPI's own).
    bool deterministic = false;
    // A collective that has not completed after this long stops the job with an error naming it
    // (a rank failed or hung); 0: wait forever.
    int timeout_s = 600;
};

// zinfinity's `cpu_optimizer` block: which SIMD variant the CPU optimizer uses.
struct CpuOptimizerConfig {
    std::string isa = "auto";  // auto | avx512 | avx2 | scalar; ZINF_CPU_ISA overrides
    int threads = 0;           // 0: all cores
};

// zinfinity's `model` block: the model zinfinity-train builds (the module library, src/model).
enum class ModelType : std::uint8_t { kMlp, kGpt };
struct ModelConfig {
    ModelType type = ModelType::kMlp;
    // mlp
    std::vector<std::uint64_t> layers = {784, 1024, 1024, 10};  // input, hidden..., classes
    std::string activation = "relu";                            // relu | gelu
    bool layernorm = false;
    // both: after each hidden activation (mlp); on embeddings and residual branches (gpt)
    double dropout = 0.0;  // in [0, 1)
    // gpt: a byte-level decoder-only transformer
    std::uint64_t n_layer = 4;
    std::uint64_t n_head = 4;
    std::uint64_t d_model = 128;
    std::uint64_t seq_len = 128;
    // gpt: keep block inputs only and recompute the blocks in backward (configured by the
    // activation_checkpointing block).
    bool checkpoint_activations = false;
};

// DeepSpeed's `activation_checkpointing` block, for models that checkpoint (model.type gpt with
// model.checkpoint_activations).
struct ActivationCheckpointingConfig {
    bool partition_activations = false;           // model parallelism only: warned
    bool cpu_checkpointing = false;               // kept block inputs in pinned host memory
    bool contiguous_memory_optimization = false;  // the kept inputs in one allocation
    std::uint64_t number_checkpoints = 0;         // 0: absent; zinfinity keeps one per block
    bool synchronize_checkpoint_boundary = false;
    bool profile = false;  // per-step times of the checkpointed blocks
    // zinfinity: the kept block inputs on NVMe (a swap store of their own under nvme_path).
    bool nvme_checkpointing = false;
    std::vector<std::string> nvme_path;
};

// zinfinity's `data` block: what zinfinity-train trains on.
inline constexpr const char* kFortunesPath = "/usr/share/games/fortunes";
struct DataConfig {
    // fashion-mnist | synthetic | text (a UTF-8 file or directory; path defaults to
    // kFortunesPath, the Debian package fortunes)
    std::string dataset = "fashion-mnist";
    std::string path = "/usr/share/datasets/fashion-mnist";
    std::uint64_t epochs = 1;
    std::uint64_t max_steps = 0;  // optimizer steps; 0: no limit (epochs decide)
    std::uint64_t synthetic_samples = 10000;
    // Evaluate on the first eval_samples samples of the evaluation set (rounded up to whole
    // batches over the ranks); 0: all of it.
    std::uint64_t eval_samples = 0;
    bool shuffle = true;
};

// zinfinity's `device` block: where compute runs and how much device memory it may hold.
struct DeviceConfig {
    std::string type = "cpu";                        // cpu | cuda
    std::uint64_t memory_budget_bytes = 4ULL << 30;  // `memory_budget`, bytes
    int local_rank = 0;
    // `host_memory_budget`, bytes: pinned/host budget for offloaded states (0: unlimited).
    std::uint64_t host_memory_budget_bytes = 0;
};

// Batch arithmetic, resolved: all three set and consistent after load.
struct BatchConfig {
    std::uint64_t train_batch_size = 0;
    std::uint64_t train_micro_batch_size_per_gpu = 0;
    std::uint64_t gradient_accumulation_steps = 0;
};

struct EngineConfig {
    AioConfig aio;
    ZeroConfig zero;
    Bf16Config bf16;
    Fp16Config fp16;
    OptimizerConfig optimizer;
    SchedulerConfig scheduler;
    SwapConfig swap;
    CsvMonitorConfig csv_monitor;
    CommConfig comm;
    CpuOptimizerConfig cpu_optimizer;
    BatchConfig batch;
    ModelConfig model;
    ActivationCheckpointingConfig activation_checkpointing;
    DataConfig data;
    DeviceConfig device;
    double gradient_clipping = 0.0;  // 0: off
    std::uint64_t steps_per_print = 10;
    std::uint64_t seed = 1234;
    // The configuration as loaded (after --set overrides), compact JSON with sorted keys: what a
    // checkpoint's config digest is computed over.
    std::string canonical_json;
    // Warnings met while loading (DeepSpeed keys that zinfinity does not implement, deprecated
    // keys mapped), already logged.
    std::vector<std::string> warnings;
    // Each "auto" resolved, with its value and where it came from; logged at info level.
    std::vector<std::string> resolved;
};

struct LoadOptions {
    int world_size = 1;
    // `key.path=value` overrides applied before validation (`--set` on the command line).
    std::vector<std::string> overrides;
    // Log each warning as it is found (tests turn this off and read EngineConfig::warnings).
    bool log_warnings = true;
};

// Loads and validates a config file. Errors name the file and the key path.
Result<EngineConfig> load(const std::string& path, const LoadOptions& options = {});
// Same, from JSON text (`source_name` names it in messages).
Result<EngineConfig> load_from_string(std::string_view json_text, const LoadOptions& options = {},
                                      std::string_view source_name = "<config>");
// Parses only an `aio` object (as written by `zinfinity-bench tune`), with the same checks.
Result<AioConfig> load_aio_from_string(std::string_view json_text, std::string_view source_name);
// The JSON text of an `aio` block, as zinfinity configs accept it.
std::string aio_to_json(const AioConfig& aio, int indent = 2);

// The JSON text of `json_text` with each `key.path=value` override applied as --set applies it
// (value parsed as JSON, else a string; objects made on the way), dumped with `indent`. No
// validation: load the result to check it.
Result<std::string> apply_overrides(std::string_view json_text,
                                    const std::vector<std::string>& overrides, int indent = 2);

// Levenshtein distance, for "did you mean" suggestions.
std::size_t edit_distance(std::string_view a, std::string_view b);

}  // namespace zinf::config
