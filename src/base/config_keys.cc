// The key table and its Markdown rendering.
#include "src/base/config_keys.h"

#include <map>

namespace zinf::config {
namespace {

using S = KeyStatus;

// clang-format off
constexpr KeyInfo kKeys[] = {
    // ---- top level -------------------------------------------------------------------------
    {"train_batch_size", S::kImplemented, "", "micro x accumulation x world size; any two give the third; \"auto\" resolved from the others"},
    {"train_micro_batch_size_per_gpu", S::kImplemented, "", "rows per forward on each rank; \"auto\" resolved from the others"},
    {"gradient_accumulation_steps", S::kImplemented, "", "micro-steps per optimizer step; \"auto\" resolved from the others"},
    {"gradient_clipping", S::kImplemented, "", "global-norm clipping; 0 (default) = off"},
    {"steps_per_print", S::kImplemented, "", "figures every N steps (10)"},
    {"seed", S::kZinfinity, "", "seeds initialisation, shuffling and dropout (1234)"},
    {"aio", S::kImplemented, "", "asynchronous I/O of the swap files"},
    {"zero_optimization", S::kImplemented, "", "ZeRO stage and offload"},
    {"bf16", S::kImplemented, "", "bf16 parameters and gradients"},
    {"fp16", S::kImplemented, "", "fp16 with loss scaling"},
    {"optimizer", S::kImplemented, "", "the optimizer and its hyperparameters"},
    {"scheduler", S::kImplemented, "", "the learning-rate schedule"},
    {"swap", S::kZinfinity, "", "swap-file options"},
    {"comm", S::kZinfinity, "", "collectives between ranks"},
    {"cpu_optimizer", S::kZinfinity, "", "the CPU optimizer's SIMD variant and threads"},
    {"model", S::kZinfinity, "", "the model zinfinity-train builds"},
    {"data", S::kZinfinity, "", "what zinfinity-train trains on"},
    {"device", S::kZinfinity, "", "where compute runs and its memory budgets"},
    {"prescale_gradients", S::kDefaultOnly, "false", "scaling before the reduction changes its rounding"},
    {"gradient_predivide_factor", S::kDefaultOnly, "1.0", "predividing before the reduction changes its rounding"},
    {"gradient_allreduce_op", S::kDefaultOnly, "\"mean\"", "a sum instead of a mean changes the step"},
    {"sparse_gradients", S::kWarned, "", "sparse all-reduce of embedding gradients; zinfinity reduces dense gradients (same values)"},
    {"communication_data_type", S::kWarned, "", "reductions run in the gradients' dtype"},
    {"seq_parallel_communication_data_type", S::kWarned, "", "no sequence parallelism"},
    {"disable_allgather", S::kWarned, "", "communication scheme only"},
    {"wall_clock_breakdown", S::kWarned, "", "zinfinity-train prints its own timings; --trace writes a Chrome trace"},
    {"memory_breakdown", S::kWarned, "", "the summary prints device, pinned and RSS peaks"},
    {"dump_state", S::kWarned, "", "debug output only"},
    {"flops_profiler", S::kWarned, "", "profiling only"},
    {"tensorboard", S::kWarned, "", "monitoring only"},
    {"wandb", S::kWarned, "", "monitoring only"},
    {"csv_monitor", S::kImplemented, "", "DeepSpeed's CSV monitor: on rank 0, one CSV file per event (train_loss, lr, loss_scale with fp16, eval_loss) in output_path/job_name/, DeepSpeed's names, header and x values (global samples); see its section in docs/CONFIG.md"},
    {"comet", S::kWarned, "", "monitoring only"},
    {"comms_logger", S::kWarned, "", "monitoring only"},
    {"timers", S::kWarned, "", "monitoring only"},
    {"autotuning", S::kWarned, "", "DeepSpeed's autotuner; zinfinity-bench tune tunes the aio block"},
    {"checkpoint", S::kWarned, "", "checkpoint options (tag validation, universal checkpoints); zinfinity's checkpoints are always validated by checksum"},
    {"nebula", S::kWarned, "", "Azure checkpoint service"},
    {"graph_harvesting", S::kWarned, "", "CUDA graphs only"},
    {"compile", S::kWarned, "", "torch.compile only"},
    {"zero_allow_untested_optimizer", S::kWarned, "", "every zinfinity optimizer runs under every stage"},
    {"zero_force_ds_cpu_optimizer", S::kWarned, "", "the CPU optimizer is always zinfinity's"},
    {"dataloader_drop_last", S::kWarned, "", "zinfinity-train always drops the last partial training batch"},
    {"pipeline", S::kWarned, "", "no pipeline parallelism"},
    {"use_data_before_expert_parallelism", S::kWarned, "", "no expert parallelism"},
    {"managed_gradient_accumulation", S::kWarned, "", "the engine always manages accumulation"},
    {"log_level", S::kWarned, "", "ZINF_LOG_LEVEL sets zinfinity's log level"},
    {"aio_config", S::kWarned, "", "an older name of aio's per-handle settings; use aio"},
    {"fp32_reduce_scatter", S::kWarned, "", "reductions run in the gradients' dtype"},
    {"activation_checkpointing", S::kImplemented, "", "activation checkpointing of the gpt model, on when model.checkpoint_activations is true (otherwise a warning)"},
    {"activation_checkpointing.partition_activations", S::kImplemented, "", "model parallelism only: warned when true (no model parallelism here)"},
    {"activation_checkpointing.cpu_checkpointing", S::kImplemented, "", "kept block inputs in pinned host memory, copied back before each block's backward"},
    {"activation_checkpointing.contiguous_memory_optimization", S::kImplemented, "", "the kept block inputs in one contiguous allocation (else one per block)"},
    {"activation_checkpointing.number_checkpoints", S::kImplemented, "", "one checkpoint per block is kept; another value is warned and ignored"},
    {"activation_checkpointing.synchronize_checkpoint_boundary", S::kImplemented, "", "synchronizes the device stream at each block boundary"},
    {"activation_checkpointing.profile", S::kImplemented, "", "prints the forward, recompute and backward time of the checkpointed blocks with each steps_per_print line"},
    {"activation_checkpointing.nvme_checkpointing", S::kZinfinity, "", "kept block inputs on NVMe, written behind the forward and read back one block ahead in backward (false)"},
    {"activation_checkpointing.nvme_path", S::kZinfinity, "", "a directory (or a list, striped) of the NVMe checkpoints, not an offload nvme_path"},
    {"gradient_accumulation_dtype", S::kDefaultOnly, "null", "gradients accumulate in the parameters' dtype"},
    {"data_types", S::kImplemented, "", "DeepSpeed's data types block"},
    {"data_types.grad_accum_dtype", S::kDefaultOnly, "null", "gradients accumulate in the parameters' dtype"},
    {"amp", S::kRefusedIfEnabled, "", "NVIDIA Apex AMP changes the arithmetic; use bf16 or fp16"},
    {"torch_autocast", S::kRefusedIfEnabled, "", "autocast changes the arithmetic"},
    {"hybrid_engine", S::kRefusedIfEnabled, "", "RLHF inference engine"},
    {"quantize_training", S::kRefusedIfEnabled, "", "quantized training changes the arithmetic"},
    {"data_efficiency", S::kRefusedIfEnabled, "", "changes the data a step sees"},
    {"curriculum_learning", S::kRefusedIfEnabled, "", "changes the data a step sees"},
    {"progressive_layer_drop", S::kRefusedIfEnabled, "", "changes the model a step trains"},
    {"eigenvalue", S::kRefusedIfEnabled, "", "feeds progressive layer drop and quantization"},
    {"elasticity", S::kRefusedIfEnabled, "", "changes the batch size"},
    {"sparse_attention", S::kDefaultOnly, "null", "changes the model; no sparse attention"},
    {"compression_training", S::kDefaultOnly, "null", "compression changes the model"},
    {"weight_quantization", S::kDefaultOnly, "null", "quantized weights change the arithmetic"},

    // ---- aio --------------------------------------------------------------------------------
    {"aio.block_size", S::kImplemented, "", "bytes per I/O piece (1048576)"},
    {"aio.queue_depth", S::kImplemented, "", "pieces in flight per worker thread (32; DeepSpeed's default is 8)"},
    {"aio.intra_op_parallelism", S::kImplemented, "", "I/O worker threads (1)"},
    {"aio.thread_count", S::kAlias, "aio.intra_op_parallelism", "the older name"},
    {"aio.single_submit", S::kImplemented, "", "one piece per submission syscall (false)"},
    {"aio.overlap_events", S::kImplemented, "", "keep submitting while completions are reaped (true)"},
    {"aio.use_gds", S::kDefaultOnly, "false", "GPUDirect Storage is not implemented"},
    {"aio.backend", S::kZinfinity, "", "auto, io_uring, libaio or posix"},
    {"aio.use_direct", S::kZinfinity, "", "O_DIRECT: auto, true or false"},
    {"aio.register_buffers", S::kZinfinity, "", "io_uring fixed buffers and files (true)"},
    {"aio.sqpoll", S::kZinfinity, "", "io_uring kernel submission thread (false)"},

    // ---- zero_optimization --------------------------------------------------------------------
    {"zero_optimization.stage", S::kImplemented, "", "0-3"},
    {"zero_optimization.sub_group_size", S::kImplemented, "", "elements per optimizer sub-group (1e9); 0: one sub-group per largest parameter partition"},
    {"zero_optimization.stage3_prefetch_bucket_size", S::kImplemented, "", "elements prefetched ahead along the recorded trace (5e7); 0: no prefetch; \"auto\": 0.9 x hidden^2"},
    {"zero_optimization.prefetch_bucket_size", S::kAlias, "zero_optimization.stage3_prefetch_bucket_size", "DeepSpeed's field name"},
    {"zero_optimization.stage3_max_live_parameters", S::kImplemented, "", "elements resident at once on the device (1e9)"},
    {"zero_optimization.max_live_parameters", S::kAlias, "zero_optimization.stage3_max_live_parameters", "DeepSpeed's field name"},
    {"zero_optimization.stage3_param_persistence_threshold", S::kImplemented, "", "parameters of at most this many elements stay gathered (1e5); \"auto\": 10 x hidden"},
    {"zero_optimization.param_persistence_threshold", S::kAlias, "zero_optimization.stage3_param_persistence_threshold", "DeepSpeed's field name"},
    {"zero_optimization.stage3_max_reuse_distance", S::kWarned, "", "eviction follows the recorded trace (Belady) instead"},
    {"zero_optimization.max_reuse_distance", S::kAlias, "zero_optimization.stage3_max_reuse_distance", "DeepSpeed's field name"},
    {"zero_optimization.stage3_model_persistence_threshold", S::kWarned, "", "no model-wide persistence bound"},
    {"zero_optimization.model_persistence_threshold", S::kAlias, "zero_optimization.stage3_model_persistence_threshold", "DeepSpeed's field name"},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save", S::kWarned, "", "checkpoints always hold the full states"},
    {"zero_optimization.gather_16bit_weights_on_model_save", S::kAlias, "zero_optimization.stage3_gather_16bit_weights_on_model_save", "DeepSpeed's field name"},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save", S::kWarned, "", "checkpoints always hold the full states"},
    {"zero_optimization.stage3_module_granularity_threshold", S::kWarned, "", "fetches are per parameter"},
    {"zero_optimization.module_granularity_threshold", S::kAlias, "zero_optimization.stage3_module_granularity_threshold", "DeepSpeed's field name"},
    {"zero_optimization.stage3_use_all_reduce_for_fetch_params", S::kWarned, "", "communication scheme only"},
    {"zero_optimization.use_all_reduce_for_fetch_params", S::kAlias, "zero_optimization.stage3_use_all_reduce_for_fetch_params", "DeepSpeed's field name"},
    {"zero_optimization.stage3_allgather_sequential", S::kWarned, "", "communication scheme only"},
    {"zero_optimization.allgather_sequential", S::kAlias, "zero_optimization.stage3_allgather_sequential", "DeepSpeed's field name"},
    {"zero_optimization.contiguous_gradients", S::kWarned, "", "gradients always live in one flat buffer per rank"},
    {"zero_optimization.overlap_comm", S::kWarned, "", "collectives run on the training thread between compute, not overlapped with it"},
    {"zero_optimization.reduce_bucket_size", S::kWarned, "", "gradients are reduced per parameter (stages 2-3: one reduce-scatter each as backward produces it; 0-1: one all-reduce at the boundary), not in buckets"},
    {"zero_optimization.allgather_bucket_size", S::kWarned, "", "parameters are all-gathered per parameter (stage 3 on use, stages 1-2 after the step), not in buckets"},
    {"zero_optimization.allgather_partitions", S::kWarned, "", "communication scheme only"},
    {"zero_optimization.reduce_scatter", S::kWarned, "", "communication scheme only"},
    {"zero_optimization.use_multi_rank_bucket_allreduce", S::kWarned, "", "communication scheme only"},
    {"zero_optimization.round_robin_gradients", S::kWarned, "", "communication scheme only"},
    {"zero_optimization.elastic_checkpoint", S::kWarned, "", "deprecated by DeepSpeed"},
    {"zero_optimization.load_from_fp32_weights", S::kDefaultOnly, "true", "checkpoints restore the fp32 master"},
    {"zero_optimization.ignore_unused_parameters", S::kWarned, "", "unused parameters get zero gradients"},
    {"zero_optimization.legacy_stage1", S::kWarned, "", "stage 1 is always the current one"},
    {"zero_optimization.zero_hpz_partition_size", S::kWarned, "", "no hierarchical partitioning"},
    {"zero_optimization.zero_quantized_weights", S::kDefaultOnly, "false", "quantized weights change the arithmetic"},
    {"zero_optimization.zero_quantized_nontrainable_weights", S::kDefaultOnly, "false", "quantized weights change the arithmetic"},
    {"zero_optimization.zero_quantized_gradients", S::kDefaultOnly, "false", "quantized gradients change the arithmetic"},
    {"zero_optimization.zeropp_loco_param", S::kDefaultOnly, "null", "quantized communication changes the arithmetic"},
    {"zero_optimization.mics_shard_size", S::kWarned, "", "no MiCS sharding"},
    {"zero_optimization.mics_hierarchical_params_gather", S::kWarned, "", "no MiCS sharding"},
    {"zero_optimization.memory_efficient_linear", S::kWarned, "", "zinfinity's Linear is always memory-efficient"},
    {"zero_optimization.pipeline_loading_checkpoint", S::kWarned, "", "no pipeline parallelism"},
    {"zero_optimization.override_module_apply", S::kWarned, "", "PyTorch module hooks only"},
    {"zero_optimization.log_trace_cache_warnings", S::kWarned, "", "the residency manager logs trace changes itself"},
    {"zero_optimization.enable_sanity_checks", S::kWarned, "", "zinfinity asserts its invariants always"},
    {"zero_optimization.save_muon_momentum_buffer_in_memory", S::kWarned, "", "no Muon optimizer"},
    {"zero_optimization.leaf_module", S::kWarned, "", "PyTorch module hooks only"},
    {"zero_optimization.zenflow", S::kDefaultOnly, "null", "ZenFlow's stale updates change the arithmetic"},
    {"zero_optimization.cpu_offload", S::kDeprecated, "", "true: offload_optimizer.device \"cpu\""},
    {"zero_optimization.cpu_offload_param", S::kDeprecated, "", "true: offload_param.device \"cpu\""},
    {"zero_optimization.cpu_offload_params", S::kAlias, "zero_optimization.cpu_offload_param", "a common misspelling"},
    {"zero_optimization.cpu_offload_use_pin_memory", S::kDeprecated, "", "the pin_memory of both offload sections"},
    {"zero_optimization.offload_param", S::kImplemented, "", "parameter offload (stage 3; below it DeepSpeed ignores it: a warning)"},
    {"zero_optimization.offload_param.device", S::kImplemented, "", "none, cpu or nvme"},
    {"zero_optimization.offload_param.nvme_path", S::kImplemented, "", "a directory, or a list (striped)"},
    {"zero_optimization.offload_param.buffer_count", S::kImplemented, "", "host tier buffers (5)"},
    {"zero_optimization.offload_param.buffer_size", S::kImplemented, "", "elements per buffer (1e8)"},
    {"zero_optimization.offload_param.max_in_cpu", S::kImplemented, "", "host tier bound, elements (1e9)"},
    {"zero_optimization.offload_param.pin_memory", S::kImplemented, "", "page-lock the host tier (true)"},
    {"zero_optimization.offload_optimizer", S::kImplemented, "", "optimizer-state offload (stage 1-3)"},
    {"zero_optimization.offload_optimizer.device", S::kImplemented, "", "none, cpu or nvme"},
    {"zero_optimization.offload_optimizer.nvme_path", S::kImplemented, "", "a directory, or a list (striped)"},
    {"zero_optimization.offload_optimizer.pin_memory", S::kImplemented, "", "page-lock the swap buffers for a GPU (true)"},
    {"zero_optimization.offload_optimizer.pipeline_read", S::kImplemented, "", "read sub-group i+1 during the update of i (false)"},
    {"zero_optimization.offload_optimizer.pipeline_write", S::kImplemented, "", "write sub-group i-1 during the update of i (false)"},
    {"zero_optimization.offload_optimizer.stream_gradients", S::kZinfinity, "", "device nvme, stages 2-3, CPU device: true: gradients go to the swap files as backward produces them and stream back per sub-group, instead of a host buffer of the whole partition; false: the host buffer; \"auto\": the host buffer where it fits in device.host_memory_budget beside the pinned buffers, else streamed (\"auto\")"},
    {"zero_optimization.offload_optimizer.state_dtype", S::kZinfinity, "", "how the optimizer's moments are stored, in host memory and on NVMe (the fp32 master stays fp32): \"fp32\" (exact), \"bf16\" (stochastic rounding: 12 -> 8 B per parameter on NVMe) or \"int8\" (blockwise 8-bit exponent-and-mantissa code, one fp32 scale per 2048 elements, stochastic rounding: about 6 B) (\"fp32\")"},
    {"zero_optimization.offload_optimizer.buffer_count", S::kWarned, "", "the swap buffers are sized from the pipeline (3 or 4 per sub-group window)"},
    {"zero_optimization.offload_optimizer.fast_init", S::kWarned, "", "initial states are always written in one pipelined pass"},
    {"zero_optimization.offload_optimizer.ratio", S::kWarned, "", "the whole optimizer domain is offloaded"},
    {"zero_optimization.offload_optimizer.super_offload", S::kWarned, "", "not implemented"},
    {"zero_optimization.offload_optimizer.cpuadam_cores_perc", S::kWarned, "", "cpu_optimizer.threads sets the optimizer's threads"},

    // ---- precision ----------------------------------------------------------------------------
    {"bf16.enabled", S::kImplemented, "", "bf16 parameters and gradients, fp32 master (false; \"auto\": false)"},
    {"bf16.immediate_grad_update", S::kWarned, "", "gradients are always applied at the boundary"},
    {"bf16.check_grad_overflow", S::kWarned, "", "bf16 does not overflow like fp16"},
    {"bf16.bf16_master_weights_and_grads", S::kDefaultOnly, "false", "the master copy is always fp32"},
    {"bf16.bf16_optimizer_states", S::kDefaultOnly, "false", "optimizer states are always fp32"},
    {"fp16.enabled", S::kImplemented, "", "fp16 with loss scaling (false; \"auto\": false)"},
    {"fp16.loss_scale", S::kImplemented, "", "0 (default): dynamic"},
    {"fp16.initial_scale_power", S::kImplemented, "", "initial dynamic scale 2^N (16)"},
    {"fp16.loss_scale_window", S::kImplemented, "", "clean steps before the scale doubles (1000)"},
    {"fp16.hysteresis", S::kImplemented, "", "overflows before the scale halves (2)"},
    {"fp16.min_loss_scale", S::kImplemented, "", "(1)"},
    {"fp16.consecutive_hysteresis", S::kDefaultOnly, "false", "changes when the scale drops"},
    {"fp16.auto_cast", S::kDefaultOnly, "false", "autocast changes the arithmetic"},
    {"fp16.fp16_master_weights_and_grads", S::kDefaultOnly, "false", "the master copy is always fp32"},

    // ---- optimizer ----------------------------------------------------------------------------
    {"optimizer.type", S::kImplemented, "", "Adam, AdamW, Adagrad, Lion"},
    {"optimizer.params", S::kImplemented, "", "the optimizer's hyperparameters"},
    {"optimizer.legacy_fusion", S::kWarned, "", "kernels are always fused"},
    {"optimizer.params.lr", S::kImplemented, "", "(1e-3; \"auto\": the default)"},
    {"optimizer.params.betas", S::kImplemented, "", "[0.9, 0.999] (Lion: [0.9, 0.99]; \"auto\": the default)"},
    {"optimizer.params.eps", S::kImplemented, "", "(1e-8; \"auto\": the default)"},
    {"optimizer.params.weight_decay", S::kImplemented, "", "(0; \"auto\": the default)"},
    {"optimizer.params.adam_w_mode", S::kImplemented, "", "Adam: decoupled weight decay (true)"},
    {"optimizer.params.bias_correction", S::kImplemented, "", "Adam, AdamW: bias-corrected moments (true)"},
    {"optimizer.params.amsgrad", S::kImplemented, "", "Adam, AdamW: AMSGrad's running maximum of the second moment (false)"},
    {"optimizer.params.torch_rounding", S::kZinfinity, "", "Adam, AdamW: torch.optim's operation order, bitwise torch's steps (false)"},
    {"optimizer.params.torch_adam", S::kWarned, "", "zinfinity's kernels compute torch's Adam arithmetic"},
    {"optimizer.params.foreach", S::kWarned, "", "performance only"},
    {"optimizer.params.fused", S::kWarned, "", "performance only"},
    {"optimizer.params.capturable", S::kWarned, "", "CUDA graphs only"},
    {"optimizer.params.set_grad_none", S::kWarned, "", "gradients are zeroed by the engine"},
    {"optimizer.params.maximize", S::kDefaultOnly, "false", "maximising changes the step"},
    {"optimizer.params.initial_accumulator_value", S::kDefaultOnly, "0", "Adagrad's accumulator starts at 0"},
    {"optimizer.params.lr_decay", S::kDefaultOnly, "0", "Adagrad without lr decay"},
    {"optimizer.params.max_grad_norm", S::kDefaultOnly, "0", "use gradient_clipping"},

    // ---- scheduler ----------------------------------------------------------------------------
    {"scheduler.type", S::kImplemented, "", "WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest"},
    {"scheduler.params", S::kImplemented, "", "the schedule's parameters (DeepSpeed's names)"},
    {"scheduler.params.warmup_min_lr", S::kImplemented, "", "WarmupLR, WarmupDecayLR (0; \"auto\": 0)"},
    {"scheduler.params.warmup_max_lr", S::kImplemented, "", "WarmupLR, WarmupDecayLR (0.001; \"auto\": optimizer.params.lr)"},
    {"scheduler.params.warmup_num_steps", S::kImplemented, "", "(1000)"},
    {"scheduler.params.warmup_type", S::kImplemented, "", "log (default) or linear"},
    {"scheduler.params.total_num_steps", S::kImplemented, "", "WarmupDecayLR, WarmupCosineLR: required"},
    {"scheduler.params.warmup_min_ratio", S::kImplemented, "", "WarmupCosineLR (0)"},
    {"scheduler.params.cos_min_ratio", S::kImplemented, "", "WarmupCosineLR (0.0001)"},
    {"scheduler.params.cycle_min_lr", S::kImplemented, "", "OneCycle: required"},
    {"scheduler.params.cycle_max_lr", S::kImplemented, "", "OneCycle: required"},
    {"scheduler.params.decay_lr_rate", S::kImplemented, "", "OneCycle (0)"},
    {"scheduler.params.cycle_first_step_size", S::kImplemented, "", "OneCycle (2000)"},
    {"scheduler.params.cycle_second_step_size", S::kImplemented, "", "OneCycle (as the first)"},
    {"scheduler.params.cycle_first_stair_count", S::kImplemented, "", "OneCycle (0)"},
    {"scheduler.params.cycle_second_stair_count", S::kImplemented, "", "OneCycle (as the first)"},
    {"scheduler.params.decay_step_size", S::kImplemented, "", "OneCycle (0)"},
    {"scheduler.params.cycle_momentum", S::kImplemented, "", "OneCycle: cycle beta1 (true)"},
    {"scheduler.params.cycle_min_mom", S::kImplemented, "", "OneCycle (0.8)"},
    {"scheduler.params.cycle_max_mom", S::kImplemented, "", "OneCycle (0.9)"},
    {"scheduler.params.decay_mom_rate", S::kImplemented, "", "OneCycle (0)"},
    {"scheduler.params.lr_range_test_min_lr", S::kImplemented, "", "LRRangeTest (1e-3)"},
    {"scheduler.params.lr_range_test_step_size", S::kImplemented, "", "LRRangeTest (2000)"},
    {"scheduler.params.lr_range_test_step_rate", S::kImplemented, "", "LRRangeTest (1.0)"},
    {"scheduler.params.lr_range_test_staircase", S::kImplemented, "", "LRRangeTest (false)"},
    {"scheduler.params.last_batch_iteration", S::kDefaultOnly, "-1", "a resumed run restores its step from the checkpoint"},

    // ---- monitors ------------------------------------------------------------------------------
    {"csv_monitor.enabled", S::kImplemented, "", "write the CSV files (false)"},
    {"csv_monitor.output_path", S::kImplemented, "", "the directory job_name/ is created in (\"\": the working directory)"},
    {"csv_monitor.job_name", S::kImplemented, "", "the directory the files go into, under output_path (\"DeepSpeedJobName\")"},

    // ---- zinfinity's blocks ---------------------------------------------------------------------
    {"swap.verify_checksums", S::kZinfinity, "", "verify every swap block read back (true)"},
    {"swap.background_checkpoint", S::kZinfinity, "", "optimizer states on NVMe kept copy-on-write (twice their disk space); a checkpoint copies them from a snapshot in the background while training goes on (false)"},
    {"swap.optimizer_read_ahead", S::kZinfinity, "", "sub-groups of NVMe optimizer states read ahead of the one being updated, 1-8, one pinned sub-group buffer each (needs offload_optimizer.pipeline_read); with swap.overlap_step deeper read-ahead fills the disk while the forward computes (1)"},
    {"swap.overlap_step", S::kZinfinity, "", "the optimizer step of each accumulation window runs beside its last backward on copy-on-write NVMe states, speculatively with clip coefficient 1; committed, redone or skipped once the norm is known, bitwise the sequential step (false)"},
    {"comm.deterministic", S::kZinfinity, "", "sum reductions in rank order: bitwise reproducible (false)"},
    {"comm.timeout_s", S::kZinfinity, "", "a collective not done after this many seconds stops every rank with an error (600; 0: no bound)"},
    {"cpu_optimizer.isa", S::kZinfinity, "", "auto, avx512, avx2, scalar (ZINF_CPU_ISA overrides)"},
    {"cpu_optimizer.threads", S::kZinfinity, "", "0: all cores"},
    {"model.type", S::kZinfinity, "", "mlp, or gpt (a byte-level decoder-only transformer)"},
    {"model.layers", S::kZinfinity, "", "mlp: input, hidden..., classes"},
    {"model.activation", S::kZinfinity, "", "mlp: relu or gelu"},
    {"model.dropout", S::kZinfinity, "", "[0, 1): mlp after each hidden activation; gpt on embeddings and residual branches"},
    {"model.layernorm", S::kZinfinity, "", "mlp: LayerNorm after each hidden Linear"},
    {"model.n_layer", S::kZinfinity, "", "gpt: transformer blocks (4)"},
    {"model.n_head", S::kZinfinity, "", "gpt: attention heads, dividing d_model (4)"},
    {"model.d_model", S::kZinfinity, "", "gpt: embedding width (128)"},
    {"model.seq_len", S::kZinfinity, "", "gpt: context length in bytes (128)"},
    {"model.checkpoint_activations", S::kZinfinity, "", "gpt: keep block inputs only and recompute each block in backward (false); see activation_checkpointing"},
    {"data.dataset", S::kZinfinity, "", "fashion-mnist, synthetic, or text (UTF-8 bytes, for gpt)"},
    {"data.path", S::kZinfinity, "", "the dataset's directory; text: a UTF-8 file or directory (default /usr/share/games/fortunes)"},
    {"data.epochs", S::kZinfinity, "", "(1)"},
    {"data.max_steps", S::kZinfinity, "", "0: no limit"},
    {"data.synthetic_samples", S::kZinfinity, "", "(10000)"},
    {"data.shuffle", S::kZinfinity, "", "seeded per-epoch shuffle (true)"},
    {"data.eval_samples", S::kZinfinity, "", "evaluate on the first N samples of the evaluation set, rounded up to whole batches (0: all)"},
    {"device.type", S::kZinfinity, "", "cpu or cuda"},
    {"device.memory_budget", S::kZinfinity, "", "bytes of device memory (4 GiB)"},
    {"device.local_rank", S::kZinfinity, "", "which GPU"},
    {"device.host_memory_budget", S::kZinfinity, "", "bytes of pinned host memory; 0: unlimited"},
};
// clang-format on

std::string_view parent_of(std::string_view path) {
    const auto dot = path.rfind('.');
    return dot == std::string_view::npos ? std::string_view() : path.substr(0, dot);
}

}  // namespace

std::string_view key_status_name(KeyStatus status) noexcept {
    switch (status) {
        case KeyStatus::kImplemented:
            return "implemented";
        case KeyStatus::kZinfinity:
            return "zinfinity";
        case KeyStatus::kWarned:
            return "warned, not implemented";
        case KeyStatus::kDefaultOnly:
            return "default only";
        case KeyStatus::kRefusedIfEnabled:
            return "refused if enabled";
        case KeyStatus::kDeprecated:
            return "deprecated, mapped";
        case KeyStatus::kAlias:
            return "alias";
    }
    return "?";
}

std::span<const KeyInfo> key_table() noexcept {
    return kKeys;
}

const KeyInfo* find_key(std::string_view path) noexcept {
    for (const KeyInfo& k : kKeys) {
        if (k.path == path) return &k;
    }
    return nullptr;
}

std::string sibling_keys(std::string_view block) {
    std::string out;
    for (const KeyInfo& k : kKeys) {
        if (parent_of(k.path) != block) continue;
        const std::string_view name = block.empty() ? k.path : k.path.substr(block.size() + 1);
        out += out.empty() ? "" : ", ";
        out += name;
    }
    return out;
}

std::string key_table_markdown() {
    std::string out =
        "| key | zinfinity | |\n"
        "|---|---|---|\n";
    for (const KeyInfo& k : kKeys) {
        out.append("| `").append(k.path).append("` | ").append(key_status_name(k.status));
        out.append(" | ");
        if (k.status == KeyStatus::kDefaultOnly) {
            out.append("only ").append(k.accepted).append(" is accepted: ").append(k.note);
        } else if (k.status == KeyStatus::kAlias) {
            out.append("`").append(k.accepted).append("` (").append(k.note);
            out.append("); both at once is an error");
        } else {
            out.append(k.note);
        }
        out.append(" |\n");
    }
    return out;
}

}  // namespace zinf::config
