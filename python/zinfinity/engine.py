"""``zinfinity.initialize``: a user's own torch model trained by zinfinity's engine, with
DeepSpeed's calls (``initialize``, ``engine(inputs)``, ``backward``, ``step``,
``save_checkpoint``, ``load_checkpoint``).

The config is the JSON ``zinfinity-train`` reads, validated by the same C++ parser (the same
keys, meanings, suggestions and warnings). The engine underneath is the C++ one: the ZeRO
stage's partitioning, the placement of parameters, gradients and optimizer states (device =
host memory here, pinned host, NVMe through the swap store), the optimizer kernel, fp16 loss
scaling, bf16 rounding, accumulation, clipping, the config's LR schedule and the checkpoints.
Torch runs the forward and backward: its parameters are views of the engine's memory, gathered
before use (every forward under stages 0-2; per module, and again before its backward, under
stage 3, where a released parameter's storage is empty, as DeepSpeed's) and each gradient goes
to the engine as backward produces it (a hook on the parameter's AccumulateGrad node).

Frozen parameters (``requires_grad=False``, or not in ``model_parameters``) stay torch's own and
are never written by the engine; module buffers too (both are saved in checkpoints).
"""

import argparse
import io
import json
import os
import signal
import threading
import warnings

import torch

from . import _C
from . import zero as _zero

__all__ = ["initialize", "add_config_arguments", "ZinfinityEngine"]

_FRONT_END_FILE = "torch_front_end"  # checkpoint extra: names, shapes, config (JSON)
_TORCH_STATE_FILE = "torch_state"  # checkpoint extra: client_state, buffers, frozen, scheduler

# Optimizer classes whose hyper-parameters map onto the config's `optimizer` block.
_CLIENT_OPTIMIZERS = {"Adam": "Adam", "AdamW": "AdamW", "Adagrad": "Adagrad", "CPUAdam": None,
                      "CPUAdagrad": "Adagrad", "CPULion": "Lion", "DeepSpeedCPUAdam": None,
                      "DeepSpeedCPUAdagrad": "Adagrad", "DeepSpeedCPULion": "Lion"}


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """DeepSpeed's arguments: ``--deepspeed``, ``--deepspeed_config`` (and the deprecated
    ``--deepscale``, ``--deepscale_config``), plus zinfinity's spelling ``--zinfinity_config``."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations (zinfinity)")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="Enable DeepSpeed (helper flag for user code, no effect on zinfinity)")
    group.add_argument("--deepspeed_config", default=None, type=str,
                       help="DeepSpeed json configuration file (zinfinity reads it).")
    group.add_argument("--zinfinity_config", default=None, type=str,
                       help="The same: a zinfinity (DeepSpeed) json configuration file.")
    group.add_argument("--deepscale", default=False, action="store_true",
                       help="Deprecated enable DeepSpeed (helper flag for user code)")
    group.add_argument("--deepscale_config", default=None, type=str,
                       help="Deprecated DeepSpeed json configuration file.")
    return parser


def _resolve_config(args, config):
    """The config text and its name, from args.deepspeed_config (or zinfinity_config,
    deepscale_config) or ``config`` (a path or a dict), as DeepSpeed resolves them."""
    from_args = None
    for attr in ("deepspeed_config", "zinfinity_config", "deepscale_config"):
        value = getattr(args, attr, None) if args is not None else None
        if value is not None:
            if from_args is not None:
                raise ValueError(f"initialize: both --{from_args[0]} and --{attr} are given")
            from_args = (attr, value)
    if from_args is not None:
        if config is not None:
            raise ValueError(f"initialize: a config both in args (--{from_args[0]}) and in "
                             "config=; give one")
        config = from_args[1]
    if config is None:
        raise ValueError("initialize: no config: pass config= (a path or a dict) or "
                         "--deepspeed_config")
    if isinstance(config, dict):
        return json.dumps(config), "<config dict>", config
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"initialize: config file {path!r} not found")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON: {e}") from None
        return text, path, raw
    raise TypeError(f"initialize: config must be a path or a dict, got {type(config).__name__}")


def _client_optimizer_block(optimizer, raw):
    """The config's `optimizer` block for a client optimizer instance (its class and first
    group's hyper-parameters), or a ValueError when it cannot be one."""
    name = type(optimizer).__name__
    if name not in _CLIENT_OPTIMIZERS:
        raise ValueError(f"initialize: optimizer {name}: zinfinity steps with its own kernels "
                         f"(Adam, AdamW, Adagrad, Lion); give one of {sorted(_CLIENT_OPTIMIZERS)} "
                         "or an `optimizer` block in the config")
    if "optimizer" in raw:
        raise ValueError("initialize: both an optimizer= and the config's `optimizer` block; give "
                         "one")
    groups = optimizer.param_groups
    keys = ("lr", "betas", "eps", "weight_decay")
    for g in groups[1:]:
        for k in keys:
            if k in g and g[k] != groups[0].get(k):
                raise ValueError(f"initialize: optimizer {name}: parameter groups with their own "
                                 f"{k} are not supported (one set of hyper-parameters)")
    g = groups[0]
    kind = _CLIENT_OPTIMIZERS[name]
    if kind is None:  # zinfinity's / DeepSpeed's CPUAdam: adamw_mode decides
        kind = "AdamW" if getattr(optimizer, "adamw_mode", g.get("adamw_mode", True)) else "Adam"
    params = {k: (list(g[k]) if k == "betas" else g[k]) for k in keys if k in g}
    if g.get("amsgrad"):
        params["amsgrad"] = True
    for flag in ("maximize", "nesterov"):
        if g.get(flag):
            raise ValueError(f"initialize: optimizer {name}: {flag}=True is not supported")
    return {"type": kind, "params": params}


class _EngineOptimizer(torch.optim.Optimizer):
    """The optimizer ``initialize`` returns: the engine's. ``param_groups[0]['lr']`` is the
    learning rate of the next step (a torch LR scheduler given to ``initialize`` sets it);
    ``step()`` is the engine's, at ``engine.step()``: calling it here is an error."""

    def __init__(self, engine):
        self._engine = engine
        super().__init__([torch.zeros(1)], {"lr": engine._c.current_lr()})

    def step(self, closure=None):
        raise RuntimeError("the engine steps the optimizer: call engine.step() after "
                           "engine.backward(loss)")

    def zero_grad(self, set_to_none=True):
        self._engine.zero_grad()

    @property
    def loss_scale(self):
        return self._engine._c.loss_scale()

    @property
    def cur_scale(self):
        return self._engine._c.loss_scale()


class ZinfinityEngine(torch.nn.Module):
    """DeepSpeed's engine surface over zinfinity's C++ engine (see the module's doc)."""

    def __init__(self, model, config_text, source, raw, model_parameters=None, optimizer=None,
                 lr_scheduler=None, training_data=None, collate_fn=None):
        super().__init__()
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"initialize: model must be a torch.nn.Module, got "
                            f"{type(model).__name__}")
        for key in ("model", "data"):
            if key in raw:
                warnings.warn(f"{source}: `{key}`: zinfinity-train's block; initialize trains the "
                              "torch model given, so it is ignored", stacklevel=3)
        if isinstance(optimizer, torch.optim.Optimizer) or type(optimizer).__name__ in \
                _CLIENT_OPTIMIZERS:
            raw = dict(raw)
            raw["optimizer"] = _client_optimizer_block(optimizer, raw)
            config_text = json.dumps(raw)
        elif optimizer is not None:
            raise ValueError("initialize: an optimizer callable: zinfinity steps with its own "
                             "kernels; give an `optimizer` block in the config")
        self.module = model
        self._raw = raw
        self._source = source
        self._config_text = config_text
        self._closed = False
        self._zero = _zero.Partitioner(model, model_parameters, source)
        self._c = self._zero.create_engine(config_text, source)
        facts = self._c.config()
        self._facts = facts
        self._stage = int(facts["stage"])
        self._zero.attach(self._c, self._stage)
        self.optimizer = _EngineOptimizer(self)
        self.lr_scheduler = self._make_scheduler(lr_scheduler)
        self._step_applied = False
        self.losses = 0.0
        rank, world = _C.launch()
        self.global_rank, self.world_size, self.dp_world_size = rank, world, world
        self.local_rank = _local_rank()
        self.device = torch.device("cpu")
        self.training_dataloader = (self.deepspeed_io(training_data, collate_fn=collate_fn)
                                    if training_data is not None else None)

    # ---- forward / backward / step ------------------------------------------------------------
    def forward(self, *inputs, **kwargs):
        self._check_open()
        training = self.module.training and torch.is_grad_enabled()
        return self._zero.forward(training, lambda: self.module(*inputs, **kwargs))

    def backward(self, loss, retain_graph=False, scale_wrt_gas=True, allreduce_gradients=True,
                 release_loss=False):
        """Backward of ``loss`` (the mean over this micro-batch); gradients are scaled by the
        loss scale and 1 / gradient_accumulation_steps. Returns the loss over that count."""
        self._check_open()
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError("backward: loss must be a one-element tensor")
        if not scale_wrt_gas:
            raise ValueError("backward: scale_wrt_gas=False is not supported (the engine always "
                             "averages over the accumulation window)")
        gas = self.gradient_accumulation_steps()
        self._zero.backward(loss, retain_graph)
        scaled = loss.detach() / gas if gas > 1 else loss.detach()
        self.losses += float(scaled)
        return scaled

    def step(self, lr_kwargs=None):
        """Counts the micro-step; at a gradient accumulation boundary the engine reduces the
        gradients, checks fp16 overflow, clips and runs the optimizer (and a client LR scheduler
        steps after it, unless the step was skipped)."""
        self._check_open()
        if self.lr_scheduler is not None and self._client_scheduler:
            self._c.set_lr_override(float(self.optimizer.param_groups[0]["lr"]))
        self._step_applied = False
        self._c.step()
        report = self._c.last_step()
        if report["boundary"]:
            self._step_applied = not report["overflow"]
            if self._step_applied and self._client_scheduler:
                # torch's schedulers count the optimizer's steps (the engine took this one)
                self.optimizer._step_count = getattr(self.optimizer, "_step_count", 0) + 1
                self.lr_scheduler.step(**(lr_kwargs or {}))
            if not self._client_scheduler:
                self.optimizer.param_groups[0]["lr"] = self._c.current_lr()
            self._zero.after_step()
            self.losses = 0.0

    def zero_grad(self):
        """Gradients live in the engine, cleared by each boundary step; torch's are None."""
        for p in self.module.parameters():
            p.grad = None

    # ---- DeepSpeed's accessors -----------------------------------------------------------------
    def train(self, mode=True):
        self.module.train(mode)

    def eval(self):
        self.module.train(False)

    @property
    def global_steps(self):
        return self._c.global_steps

    @property
    def micro_steps(self):
        return self._c.micro_steps

    @property
    def global_samples(self):
        return self._c.global_samples

    @property
    def skipped_steps(self):
        return self._c.skipped_steps

    def is_gradient_accumulation_boundary(self):
        return self._c.is_gradient_accumulation_boundary()

    def train_batch_size(self):
        return int(self._facts["train_batch_size"])

    def train_micro_batch_size_per_gpu(self):
        return int(self._facts["train_micro_batch_size_per_gpu"])

    def gradient_accumulation_steps(self):
        return int(self._facts["gradient_accumulation_steps"])

    def get_lr(self):
        return [float(self.optimizer.param_groups[0]["lr"])]

    def was_step_applied(self):
        return self._step_applied

    def zero_optimization_stage(self):
        return self._stage

    def fp16_enabled(self):
        return bool(self._facts["fp16"])

    def bfloat16_enabled(self):
        return bool(self._facts["bf16"])

    def figures(self):
        """The engine's figures: bytes read and written, stall, phase times, fetches, where
        each state lives, and the front end's own time (hooks, copies) in ``front_end_seconds``;
        with ``swap.overlap_step``, ``overlap_step``: the windows whose step ran beside backward
        and what became of it (committed, redone, skipped, abandoned, not_speculated, recorded)."""
        f = dict(self._c.figures())
        f["front_end_seconds"] = self._zero.front_end_seconds
        return f

    def summary(self):
        return self._c.summary()

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            module = super().__getattr__("module")
            return getattr(module, name)

    # ---- data -----------------------------------------------------------------------------------
    def deepspeed_io(self, dataset, batch_size=None, route="train", pin_memory=False,
                     data_sampler=None, collate_fn=None, num_local_io_workers=None):
        """A DataLoader of this rank's micro-batches: DistributedSampler over the ranks
        (shuffled, seed 0, as DeepSpeed's), ``train_micro_batch_size_per_gpu`` rows each."""
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")) and not \
                isinstance(dataset, torch.utils.data.IterableDataset):
            raise ValueError("Training data must be a torch Dataset")
        if data_sampler is None and not isinstance(dataset, torch.utils.data.IterableDataset):
            data_sampler = torch.utils.data.distributed.DistributedSampler(
                dataset, num_replicas=self.dp_world_size, rank=self.global_rank,
                shuffle=route == "train", seed=0)
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size or self.train_micro_batch_size_per_gpu(),
            sampler=data_sampler, num_workers=num_local_io_workers or 0, pin_memory=pin_memory,
            drop_last=bool(self._raw.get("dataloader_drop_last", False)), collate_fn=collate_fn)
        loader.data_sampler = data_sampler
        return loader

    # ---- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True,
                        exclude_frozen_parameters=False):
        """Every state to ``save_dir/<tag>`` (default ``global_step<N>``) atomically, with
        ``client_state``, the module's buffers, frozen parameters and a client scheduler's
        state; ``save_dir/latest`` names it. Every rank calls it. Returns True."""
        self._check_open()
        if not save_latest:
            warnings.warn("save_checkpoint: save_latest=False is not implemented: `latest` "
                          "names every completed checkpoint", stacklevel=2)
        tag = str(tag) if tag is not None else f"global_step{self.global_steps}"
        state = {
            "client_state": dict(client_state or {}),
            "buffers": {k: v.detach().clone() for k, v in self.module.named_buffers()},
            "frozen": {} if exclude_frozen_parameters else self._zero.frozen_state(),
            "lr_scheduler": (self.lr_scheduler.state_dict()
                             if self.lr_scheduler is not None and self._client_scheduler
                             else None),
            "dp_world_size": self.dp_world_size,
        }
        blob = io.BytesIO()
        torch.save(state, blob)
        extras = [(_FRONT_END_FILE, self._zero.describe(self._config_text).encode()),
                  (_TORCH_STATE_FILE, blob.getvalue())]
        os.makedirs(save_dir, exist_ok=True)
        self._c.save_checkpoint(os.fspath(save_dir), tag, extras)
        return True

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True,
                        load_optimizer_states=True, load_lr_scheduler_states=True,
                        load_module_only=False):
        """Restores every state from ``load_dir/<tag>`` (default: what ``latest`` names); the
        engine continues bitwise as the one that saved. Returns ``(path, client_state)``, or
        ``(None, None)`` when there is no ``latest``. A checkpoint of another model (other
        parameter names or shapes) raises ValueError naming the difference, loading nothing."""
        self._check_open()
        if load_module_only or not load_optimizer_states:
            raise ValueError("load_checkpoint: the engine restores parameters and optimizer "
                             "states together (load_module_only / load_optimizer_states=False "
                             "are not supported)")
        load_dir = os.fspath(load_dir)
        if tag is None:
            latest = os.path.join(load_dir, "latest")
            if not os.path.isfile(latest):
                warnings.warn(f"load_checkpoint: {latest} not found; nothing loaded", stacklevel=2)
                return None, None
            with open(latest, encoding="utf-8") as f:
                tag = f.read().strip()
        tag = str(tag)
        described = self._c.read_checkpoint_extra(load_dir, tag, _FRONT_END_FILE)
        if described is None:
            raise ValueError(f"checkpoint {load_dir}/{tag}: not saved by zinfinity.initialize's "
                             "engine (no torch_front_end record)")
        self._zero.check_same_model(json.loads(described.decode()), f"{load_dir}/{tag}")
        blob = self._c.read_checkpoint_extra(load_dir, tag, _TORCH_STATE_FILE)
        state = torch.load(io.BytesIO(blob)) if blob is not None else {}
        self._c.load_checkpoint(load_dir, tag)
        buffers = dict(self.module.named_buffers())
        for name, value in state.get("buffers", {}).items():
            if name in buffers:
                buffers[name].data.copy_(value)
            elif load_module_strict:
                raise ValueError(f"load_checkpoint: buffer {name} is not in this model")
        self._zero.load_frozen(state.get("frozen", {}))
        if (load_lr_scheduler_states and self._client_scheduler and
                state.get("lr_scheduler") is not None):
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        if not self._client_scheduler:
            self.optimizer.param_groups[0]["lr"] = self._c.current_lr()
        self._zero.after_step()
        return os.path.join(load_dir, tag), state.get("client_state", {})

    def module_state_dict(self, destination=None, prefix="", keep_vars=False):
        return self.module.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)

    def close(self):
        """Ends the engine: its swap files are removed and its memory freed. The module's
        parameters keep their last values (gathered into torch tensors of their own)."""
        if self._closed:
            return
        self._zero.detach()
        self._c.close()
        self._closed = True

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass

    # ---- internals ------------------------------------------------------------------------------
    def _check_open(self):
        if self._closed:
            raise RuntimeError("the engine was closed")

    def _make_scheduler(self, lr_scheduler):
        self._client_scheduler = False
        if lr_scheduler is None:
            return None
        if "scheduler" in self._raw:
            raise ValueError("initialize: both an lr_scheduler= and the config's `scheduler` "
                             "block; give one")
        self._client_scheduler = True
        if callable(lr_scheduler) and not hasattr(lr_scheduler, "step"):
            lr_scheduler = lr_scheduler(self.optimizer)
        if getattr(lr_scheduler, "optimizer", self.optimizer) is not self.optimizer:
            raise ValueError("initialize: an lr_scheduler instance must be built on the optimizer "
                             "initialize returns; pass a callable f(optimizer) instead")
        return lr_scheduler


def _local_rank():
    """This process's rank on its node: the launcher's LOCAL_RANK (mpirun's name too), else 0."""
    return int(os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")))


def _stop_on_sigterm(signum, frame):
    """SIGTERM (mpirun stopping the job, a scheduler) with no handler of the program's own:
    every open engine closes (its swap files removed), then the process dies of the signal."""
    _C.finalize()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _watch_sigterm():
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _stop_on_sigterm)


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, mpu=None, dist_init_required=None, collate_fn=None,
               config=None, config_params=None, distributed_port=None, mesh_param=None):
    """DeepSpeed's ``initialize``: returns ``(engine, optimizer, training_dataloader,
    lr_scheduler)``. The config comes from ``args.deepspeed_config`` (``--deepspeed_config``,
    ``--zinfinity_config``) or ``config`` (a path or a dict). ``model_parameters`` narrows what
    is trained (the rest is frozen). ``optimizer``: an Adam/AdamW/Adagrad/Lion instance whose
    hyper-parameters become the config's `optimizer` block (or leave it to the config).
    ``lr_scheduler``: a torch scheduler built on the returned optimizer, or a callable
    ``f(optimizer)``; stepped after each applied optimizer step."""
    if model is None:
        raise ValueError("initialize requires a model")
    if mpu is not None:
        raise ValueError("initialize: mpu (model parallelism) is not supported by zinfinity")
    if config is None and config_params is not None:
        config = config_params
    text, source, raw = _resolve_config(args, config)
    if args is not None and hasattr(args, "local_rank"):
        args.local_rank = _local_rank()
    _watch_sigterm()
    engine = ZinfinityEngine(model, text, source, raw, model_parameters=model_parameters,
                             optimizer=optimizer, lr_scheduler=lr_scheduler,
                             training_data=training_data, collate_fn=collate_fn)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler
