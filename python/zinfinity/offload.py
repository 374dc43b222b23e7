"""An optimizer whose fp32 master parameters and states live on NVMe, for any torch model.

``NVMeOptimizer(model.parameters(), optimizer="adamw", nvme_path="/mnt/nvme")`` keeps, per
parameter group, the fp32 master copy and the optimizer's moments in zinfinity's swap store: a
file in a locked run directory under ``nvme_path`` (removed by ``close()``), every 64 KiB block
checksummed on the way out and verified on the way in. ``step()`` (after ``loss.backward()``)
streams the group through pinned buffers in sub-groups of ``sub_group_size`` parameters: it
reads sub-group i+1 while the SIMD kernel updates sub-group i and writes sub-group i-1, so the
host holds three sub-groups, never the states. The torch parameters stay where they are (CPU,
fp32 or bf16/fp16) and receive the updated values.

Hyper-parameters are per group and read at every step (learning-rate schedulers work).
``state_dict()`` streams the states sub-group by sub-group into torch's layout for the same
optimizer (``step``, ``exp_avg``, ``exp_avg_sq``, ...; ``master`` for bf16/fp16 parameters);
``load_state_dict()`` writes them back.

A swap block that fails its checksum raises ``zinfinity.CorruptionError`` naming the partition
and offset; an I/O error raises ``OSError``. After either, the parameters and states of the
sub-groups already stepped hold the new step: restore a checkpoint.
"""

import os
import shutil
import tempfile
import warnings

import torch

from . import _C
from ._tensors import check_cpu, dtype_name
from .optim import kept_moments

__all__ = ["NVMeOptimizer"]

# DeepSpeed's `aio` keys (and zinfinity's `backend`), with DeepSpeed's defaults.
_AIO_DEFAULTS = {
    "block_size": 1048576,
    "queue_depth": 8,
    "intra_op_parallelism": 1,
    "single_submit": False,
    "overlap_events": True,
    "backend": "auto",
}
_AIO_ALIASES = {"thread_count": "intra_op_parallelism"}
_AIO_NOT_IMPLEMENTED = {"use_gds"}

_KINDS = {
    # kind: torch's defaults (the states kept come from the engine's descriptor)
    "adamw": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
    "adam": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0),
    "adagrad": dict(lr=1e-2, betas=(0.0, 0.0), eps=1e-10, weight_decay=0.0),
    "lion": dict(lr=1e-4, betas=(0.9, 0.99), eps=0.0, weight_decay=0.0),
}


def _aio_options(aio):
    out = dict(_AIO_DEFAULTS)
    for key, value in (aio or {}).items():
        key = _AIO_ALIASES.get(key, key)
        if key in _AIO_NOT_IMPLEMENTED:
            if value:
                warnings.warn(f"NVMeOptimizer: aio.{key} is not implemented; ignored", stacklevel=3)
            continue
        if key not in out:
            raise ValueError(f"NVMeOptimizer: unknown aio key {key!r}; known: {sorted(out)}")
        out[key] = value
    return out


class NVMeOptimizer(torch.optim.Optimizer):
    """Adam, AdamW, Adagrad or Lion with its fp32 masters and states on NVMe.

    Args:
        params: parameters or parameter groups (CPU tensors; fp32, bf16 or fp16).
        optimizer: "adamw" (default), "adam" (L2 decay), "adagrad" or "lion".
        nvme_path: a directory, or a list of directories striped over (one per drive).
        sub_group_size: parameters per streamed sub-group (DeepSpeed's
            ``zero_optimization.sub_group_size``); the pinned buffers hold three sub-groups.
        aio: DeepSpeed's ``aio`` block: block_size, queue_depth, intra_op_parallelism
            (thread_count), single_submit, overlap_events; and ``backend``.
        lr, betas, eps, weight_decay, amsgrad, bias_correction: as torch's optimizer of that
            name (defaults: torch's).
        pipeline_read, pipeline_write: overlap the next read / the last write with the update.
        verify_checksums: checksum every swap block (DeepSpeed has no such check; default on).
        torch_rounding: Adam and AdamW round every operation as torch.optim.Adam / AdamW do, so
            a run equals torch's bit for bit on AVX2 / AVX-512 CPUs (default on with fp32
            states: a model moved from torch.optim.AdamW to NVMeOptimizer trains identically).
            False: the kernel's own order, within a few ulps per step, which a long run
            amplifies like any other change. Not with compressed states.
        threads: threads of the kernel (0: every core).
        state_dtype: how the moments are stored on disk (the fp32 master stays fp32), as the
            engine's ``offload_optimizer.state_dtype``: "fp32" (exact, default; 12 B per
            parameter for Adam), "bf16" (stochastic rounding, reproducible: 8 B) or "int8"
            (blockwise 8-bit code of exponent and mantissa, one fp32 scale per 2048 elements,
            stochastic rounding: about 6 B). Fewer bytes make the I/O-bound step faster; ``state_dict()`` gives the
            decoded fp32 values, ``load_state_dict`` rounds them to this dtype (to nearest). The
            sub-group size is rounded up to a multiple of 2048.
    """

    def __init__(self, params, optimizer="adamw", nvme_path=None, sub_group_size=1 << 24,
                 aio=None, lr=None, betas=None, eps=None, weight_decay=None, amsgrad=False,
                 bias_correction=True, pipeline_read=True, pipeline_write=True,
                 verify_checksums=True, threads=0, torch_rounding=None, state_dtype="fp32"):
        kind = str(optimizer).lower()
        if kind not in _KINDS:
            raise ValueError(f"NVMeOptimizer: optimizer {optimizer!r}; expected one of {sorted(_KINDS)}")
        if nvme_path is None:
            raise ValueError("NVMeOptimizer: nvme_path is required (a directory on the NVMe drive)")
        paths = [nvme_path] if isinstance(nvme_path, (str, os.PathLike)) else list(nvme_path)
        paths = [os.fspath(p) for p in paths]
        for p in paths:
            if not os.path.isdir(p):
                raise FileNotFoundError(f"NVMeOptimizer: nvme_path {p!r} is not a directory")
        if int(sub_group_size) <= 0:
            raise ValueError(f"NVMeOptimizer: sub_group_size {sub_group_size} must be positive")
        state_dtype = str(state_dtype).lower()
        if state_dtype not in ("fp32", "bf16", "int8"):
            raise ValueError(f"NVMeOptimizer: state_dtype {state_dtype!r}; expected fp32, bf16 "
                             "or int8")
        if torch_rounding is None:
            torch_rounding = state_dtype == "fp32"
        elif torch_rounding and state_dtype != "fp32":
            raise ValueError("NVMeOptimizer: torch_rounding is defined for fp32 states only; "
                             f"state_dtype is {state_dtype!r}")
        if amsgrad and kind not in ("adam", "adamw"):
            raise ValueError(f"NVMeOptimizer: amsgrad is an Adam option, not {kind}'s")
        base = _KINDS[kind]
        given = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        defaults = {k: (v if given[k] is None else given[k]) for k, v in base.items()}
        defaults["betas"] = tuple(defaults["betas"])
        defaults.update(amsgrad=bool(amsgrad), bias_correction=bool(bias_correction),
                        maximize=False,
                        torch_rounding=bool(torch_rounding) and kind in ("adam", "adamw"))
        self._kind = kind
        self._state_names = tuple(m["torch_name"] for m in kept_moments(kind, amsgrad))
        self._native = None
        super().__init__(params, defaults)

        numels = []
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                check_cpu(p, f"parameter {pi} of group {gi}")
                dtype_name(p, f"parameter {pi} of group {gi}")
            numels.append(sum(p.numel() for p in group["params"]))
        a = _aio_options(aio)
        # One directory of its own under each nvme_path, so that several optimizers (and
        # several processes) share a drive; the swap store locks it and makes its run directory
        # inside.
        self._dirs = [tempfile.mkdtemp(prefix="zinfinity-optimizer-", dir=p) for p in paths]
        try:
            self._native = _C.NvmeOptimizer(
                group_numels=numels, kind=kind, amsgrad=bool(amsgrad), nvme_paths=self._dirs,
                sub_group_size=int(sub_group_size), block_size=int(a["block_size"]),
                queue_depth=int(a["queue_depth"]), single_submit=bool(a["single_submit"]),
                overlap_events=bool(a["overlap_events"]),
                intra_op_parallelism=int(a["intra_op_parallelism"]), backend=str(a["backend"]),
                pipeline_read=bool(pipeline_read), pipeline_write=bool(pipeline_write),
                verify_checksums=bool(verify_checksums), threads=int(threads),
                state_dtype=state_dtype)
        except BaseException:
            self._remove_dirs()
            raise
        self._steps = [0] * len(self.param_groups)
        self.last_step_stats = []
        for gi, group in enumerate(self.param_groups):
            self._native.initialize(gi, self._pieces(group, gi, with_grads=False))

    def add_param_group(self, param_group):
        if getattr(self, "_native", None) is not None:
            raise ValueError("NVMeOptimizer: parameter groups are fixed when it is created "
                             "(their states are laid out on disk then)")
        super().add_param_group(param_group)

    def _pieces(self, group, gi, with_grads):
        pieces = []
        self._keep = []  # contiguous gradient copies, alive until the step returns
        for pi, p in enumerate(group["params"]):
            grad, grad_dtype = 0, None
            if with_grads and p.grad is not None:
                g = p.grad
                check_cpu(g, f"the gradient of parameter {pi} of group {gi}", contiguous=False)
                if not g.is_contiguous():
                    g = g.contiguous()
                    self._keep.append(g)
                grad, grad_dtype = g.data_ptr(), dtype_name(g, f"the gradient of parameter {pi}")
            pieces.append((p.data_ptr(), dtype_name(p, f"parameter {pi}"), grad, grad_dtype,
                           p.numel()))
        return pieces

    @torch.no_grad()
    def step(self, closure=None):
        """One optimizer step over every group whose parameters have gradients."""
        self._check_open()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        stats = []
        for gi, group in enumerate(self.param_groups):
            if all(p.grad is None for p in group["params"]):
                continue
            pieces = self._pieces(group, gi, with_grads=True)
            self._steps[gi] += 1
            beta1, beta2 = group["betas"]
            try:
                stats.append(self._native.step(
                    gi, pieces, step=self._steps[gi], lr=group["lr"], beta1=beta1, beta2=beta2,
                    eps=group["eps"], weight_decay=group["weight_decay"],
                    bias_correction=group["bias_correction"],
                    grad_scale=-1.0 if group.get("maximize", False) else 1.0,
                    torch_rounding=bool(group.get("torch_rounding", False))))
            except ValueError:
                self._steps[gi] -= 1  # refused before anything changed
                raise
            finally:
                self._keep = []
        self.last_step_stats = stats
        return loss

    def _state_targets(self, group, tensors):
        """Per parameter: (numel, master, state...) addresses for read_states/write_states."""
        targets = []
        for p, t in zip(group["params"], tensors):
            # The swapper's order: the master, then the kept moments (the descriptor's).
            addrs = [t["master"].data_ptr()]
            for name in self._state_names:
                addrs.append(t[name].data_ptr() if name in t else 0)
            targets.append((p.numel(), *addrs))
        return targets

    def state_dict(self):
        """torch's layout for the same optimizer, streamed from the swap store sub-group by
        sub-group. bf16/fp16 parameters also carry their fp32 ``master``."""
        self._check_open()
        state, groups, index = {}, [], 0
        for gi, group in enumerate(self.param_groups):
            tensors = []
            for p in group["params"]:
                t = {"master": torch.empty(p.shape, dtype=torch.float32)}
                for name in self._state_names:
                    t[name] = torch.empty(p.shape, dtype=torch.float32)
                tensors.append(t)
            self._native.read_states(gi, self._state_targets(group, tensors))
            ids = []
            for p, t in zip(group["params"], tensors):
                entry = {"step": torch.tensor(float(self._steps[gi]))}
                entry.update({name: t[name] for name in self._state_names})
                if p.dtype != torch.float32:
                    entry["master"] = t["master"]
                if self._steps[gi] > 0:
                    state[index] = entry
                ids.append(index)
                index += 1
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = ids
            groups.append(packed)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Writes the states of ``state_dict`` (from ``state_dict()`` or torch's optimizer of the
        same kind) to the swap store, and takes its hyper-parameters. Everything is checked
        before anything is written."""
        self._check_open()
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"NVMeOptimizer: state_dict has {len(saved_groups)} parameter groups; "
                             f"this optimizer has {len(self.param_groups)}")

        def fp32(value, p, what):
            if not torch.is_tensor(value) or value.numel() != p.numel():
                size = value.numel() if torch.is_tensor(value) else type(value).__name__
                raise ValueError(f"NVMeOptimizer: {what} has {size} elements; the parameter "
                                 f"{p.numel()}")
            return value.detach().to(device="cpu", dtype=torch.float32).contiguous()

        plans = []
        for gi, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"NVMeOptimizer: group {gi} of state_dict has "
                                 f"{len(saved['params'])} parameters; this one has "
                                 f"{len(group['params'])}")
            if "amsgrad" in saved and bool(saved["amsgrad"]) != bool(group["amsgrad"]):
                raise ValueError(f"NVMeOptimizer: group {gi} of state_dict has amsgrad="
                                 f"{bool(saved['amsgrad'])}; this optimizer was created with "
                                 f"amsgrad={bool(group['amsgrad'])} (its disk layout)")
            if saved.get("lr_decay", 0):
                raise ValueError(f"NVMeOptimizer: group {gi} of state_dict has lr_decay "
                                 f"{saved['lr_decay']}; NVMeOptimizer's adagrad has none")
            tensors, steps = [], set()
            for pi, (p, sid) in enumerate(zip(group["params"], saved["params"])):
                entry = state_dict["state"].get(sid, state_dict["state"].get(str(sid)))
                what = f"parameter {pi} of group {gi}"
                if entry is None:  # never stepped: zero states
                    steps.add(0)
                    entry = {}
                else:
                    steps.add(int(float(entry["step"])))
                t = {"master": fp32(entry.get("master", p), p, f"the master of {what}")}
                for name in self._state_names:
                    if name in entry:
                        t[name] = fp32(entry[name], p, f"{name} of {what}")
                    elif steps != {0}:
                        raise ValueError(f"NVMeOptimizer: {what} has no {name} in the "
                                         f"state_dict (a different optimizer?)")
                    else:
                        t[name] = torch.zeros(p.numel(), dtype=torch.float32)
                tensors.append(t)
            if len(steps) > 1:
                raise ValueError(f"NVMeOptimizer: group {gi} mixes step counts {sorted(steps)}; "
                                 "its parameters step together")
            plans.append((tensors, steps.pop() if steps else 0))
        for gi, ((tensors, step), group, saved) in enumerate(
                zip(plans, self.param_groups, saved_groups)):
            self._native.write_states(gi, self._state_targets(group, tensors))
            self._steps[gi] = step
            for key, value in saved.items():
                if key in group and key not in ("params", "amsgrad"):
                    group[key] = value

    def swap_files(self):
        """The swap data files (one per nvme_path)."""
        self._check_open()
        return self._native.swap_files()

    @property
    def backend(self):
        self._check_open()
        return self._native.backend

    @property
    def state_dtype(self):
        """How the moments are stored on disk: "fp32", "bf16" or "int8"."""
        self._check_open()
        return self._native.state_dtype

    @property
    def bytes_on_disk(self):
        """Bytes of masters and states in the swap files."""
        self._check_open()
        return self._native.bytes_on_disk

    def close(self):
        """Removes the swap files and the run directory; the optimizer cannot step after."""
        self._native = None
        self._remove_dirs()

    def _remove_dirs(self):
        for d in getattr(self, "_dirs", []):
            shutil.rmtree(d, ignore_errors=True)
        self._dirs = []

    def __del__(self):
        self.close()

    def _check_open(self):
        if self._native is None:
            raise RuntimeError("NVMeOptimizer: closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
