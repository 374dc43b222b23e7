"""CPU optimizers that run zinfinity's SIMD kernel (AVX-512, AVX2 or scalar; every core).

``CPUAdam`` is a drop-in for ``deepspeed.ops.adam.DeepSpeedCPUAdam`` and, with the same
hyper-parameters, for ``torch.optim.AdamW`` (``adamw_mode=True``) or ``torch.optim.Adam``
(``adamw_mode=False``): the same per-parameter state (``step``, ``exp_avg``, ``exp_avg_sq``,
``max_exp_avg_sq`` with ``amsgrad``) and the same ``param_groups`` keys, so ``state_dict()`` of one
loads into the other. ``CPUAdagrad`` matches ``torch.optim.Adagrad`` (state ``step``, ``sum``);
``CPULion`` is Lion (Chen et al. 2023; state ``exp_avg``). ``CPUAdagrad`` also loads the
state of DeepSpeed's ``DeepSpeedCPUAdagrad`` (``exp_avg_sq``). DeepSpeed's own signatures,
state keys and bf16 behaviour are in ``zinfinity.compat.deepspeed``.

Parameters live on the CPU and are fp32, updated in place with fp32 gradients. A bf16 or fp16
parameter (a low-precision model) gets an fp32 master copy in its state (``master``): the kernel
steps the master with the bf16/fp16 gradient and writes the rounded parameter in the same pass.
"""

import itertools
import math

import torch

from . import _C
from ._tensors import check_cpu, dtype_name

__all__ = ["CPUAdam", "CPUAdagrad", "CPULion", "Adagrad", "Lion", "descriptor"]

# What each optimizer keeps, from the engine's one home for it (src/base/optimizer_descriptor.h).
_DESCRIPTORS = {d["name"]: d for d in _C.optimizer_descriptors()}


def descriptor(kind):
    """The engine's descriptor of optimizer ``kind`` ("adam", "adamw", "adagrad", "lion"):
    its moments (``name``, ``torch_name``, ...), flags and default betas."""
    return _DESCRIPTORS[kind]


def kept_moments(kind, amsgrad=False):
    """The moments ``kind`` keeps, in the kernel's order."""
    return [m for m in _DESCRIPTORS[kind]["moments"] if amsgrad or not m["amsgrad_only"]]


def _check_range(name, value, low=0.0, high=None, high_open=False):
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < low or (
        high is not None and (value >= high if high_open else value > high)
    ):
        bound = f"[{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"invalid {name}: {value} (expected {bound})")


class _CPUOptimizer(torch.optim.Optimizer):
    """The step loop shared by the three optimizers: one kernel call per parameter tensor."""

    _kind = None  # set per group by _group_kind

    def _group_kind(self, group) -> str:
        raise NotImplementedError

    def _hyper(self, group, step):
        raise NotImplementedError

    def _initial_moment(self, group, moment):
        """The value a new moment starts at (torch's: zero)."""
        return 0.0

    def _moment_keys(self, group):
        """The state keys of the kept moments, in the kernel's order (torch's names)."""
        kind = self._group_kind(group)
        return [m["torch_name"] for m in kept_moments(kind, group.get("amsgrad", False))]

    def _init_state(self, group, p, state):
        state["step"] = torch.tensor(0.0)
        kind = self._group_kind(group)
        for m in kept_moments(kind, group.get("amsgrad", False)):
            state[m["torch_name"]] = torch.full(p.shape, float(self._initial_moment(group, m)),
                                                dtype=torch.float32)

    # Settings of ours that torch's state_dict of the same optimizer lacks: kept from the
    # constructor when such a state_dict is loaded.
    _own_keys = ()

    @staticmethod
    def _fp32_state(state, key, p, what):
        """state[key] as a contiguous fp32 CPU tensor of p's size (the kernel's view of it)."""
        t = state[key]
        if t.numel() != p.numel():
            raise ValueError(f"{what}: state {key!r} has {t.numel()} elements; the parameter "
                             f"{p.numel()}")
        if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous():
            t = t.detach().to(device="cpu", dtype=torch.float32).contiguous()
            state[key] = t
        return t

    def load_state_dict(self, state_dict):
        """torch's load_state_dict, keeping the states in fp32 (torch casts floating-point
        states to each parameter's dtype, which would round a bf16 parameter's fp32 master and
        moments) and keeping our own settings where the saved groups lack them."""
        own = [{k: g[k] for k in self._own_keys if k in g} for g in self.param_groups]
        saved_ids = itertools.chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = itertools.chain.from_iterable(g["params"] for g in self.param_groups)
        originals = {p: state_dict["state"].get(i) for i, p in zip(saved_ids, params)}
        super().load_state_dict(state_dict)
        for group, kept, saved in zip(self.param_groups, own, state_dict["param_groups"]):
            for key, value in kept.items():
                if key not in saved:
                    group[key] = value
        for p, saved in originals.items():
            if not saved:
                continue
            for key, value in saved.items():
                if key != "step" and torch.is_tensor(value) and value.is_floating_point():
                    self.state[p][key] = value.detach().to(device="cpu",
                                                           dtype=torch.float32).clone()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for gi, group in enumerate(self.param_groups):
            kind = self._group_kind(group)
            for pi, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                what = f"parameter {pi} of group {gi}"
                check_cpu(p, what)
                check_cpu(p.grad, f"the gradient of {what}", contiguous=False)
                if p.grad.is_sparse:
                    raise ValueError(f"the gradient of {what} is sparse; not supported")
                grad = p.grad if p.grad.is_contiguous() else p.grad.contiguous()
                state = self.state[p]
                if len(state) == 0:
                    self._init_state(group, p, state)
                low_precision = p.dtype != torch.float32
                if low_precision and "master" not in state:
                    dtype_name(p, what)
                    state["master"] = p.detach().to(torch.float32)
                master = self._fp32_state(state, "master", p, what) if low_precision else p
                step = int(float(state["step"])) + 1  # counted once the step has happened
                moments = []
                for key in self._moment_keys(group):
                    if key not in state:  # e.g. amsgrad turned on after the first steps
                        state[key] = torch.zeros(p.shape, dtype=torch.float32)
                    moments.append(self._fp32_state(state, key, p, what).data_ptr())
                hyper = self._hyper(group, step)
                _C.optimizer_step(
                    kind=kind,
                    numel=p.numel(),
                    params=master.data_ptr(),
                    grads=grad.data_ptr(),
                    grad_dtype=dtype_name(grad, f"the gradient of {what}"),
                    moments=moments,
                    copy=p.data_ptr() if low_precision else 0,
                    copy_dtype=dtype_name(p, what),
                    step=step,
                    grad_scale=-1.0 if group.get("maximize", False) else 1.0,
                    **hyper,
                )
                state["step"] += 1
        return loss


class CPUAdam(_CPUOptimizer):
    """Adam / AdamW on CPU tensors, as ``DeepSpeedCPUAdam``.

    Arguments as DeepSpeed's: ``adamw_mode=True`` decouples the weight decay (AdamW), False adds
    it to the gradient (Adam's L2); ``bias_correction`` as in the Adam paper; ``amsgrad`` as
    torch's. ``maximize`` as torch's. ``torch_rounding=True`` rounds every operation as
    torch.optim.AdamW / Adam do on the CPU, so the results equal torch's bit for bit (on AVX2
    and AVX-512 CPUs, where torch fuses its multiply-adds too); the default, False, is the
    kernel's own order, within a few ulps of torch's per step.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 adamw_mode=True, bias_correction=True, amsgrad=False, maximize=False,
                 torch_rounding=False):
        _check_range("learning rate", lr)
        _check_range("beta1", betas[0], 0.0, 1.0, high_open=True)
        _check_range("beta2", betas[1], 0.0, 1.0, high_open=True)
        _check_range("eps", eps)
        _check_range("weight_decay", weight_decay)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        amsgrad=bool(amsgrad), foreach=None, maximize=bool(maximize),
                        capturable=False, adamw_mode=bool(adamw_mode),
                        bias_correction=bool(bias_correction),
                        torch_rounding=bool(torch_rounding))
        super().__init__(params, defaults)

    def __setstate__(self, state):
        # A state_dict from torch.optim.Adam/AdamW has neither of DeepSpeed's keys.
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("adamw_mode", True)
            group.setdefault("bias_correction", True)
            group.setdefault("amsgrad", False)
            group.setdefault("maximize", False)
            group.setdefault("torch_rounding", False)

    _own_keys = ("adamw_mode", "bias_correction", "torch_rounding")

    def _group_kind(self, group):
        return "adamw" if group.get("adamw_mode", True) else "adam"

    def _hyper(self, group, step):
        beta1, beta2 = group["betas"]
        return dict(lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                    weight_decay=group["weight_decay"],
                    bias_correction=group.get("bias_correction", True),
                    amsgrad=group["amsgrad"], torch_rounding=group.get("torch_rounding", False))


class CPUAdagrad(_CPUOptimizer):
    """Adagrad on CPU tensors, as ``torch.optim.Adagrad`` (state ``sum``) and DeepSpeed's
    ``DeepSpeedCPUAdagrad``: L2 weight decay, ``lr_decay`` and ``initial_accumulator_value``."""

    def __init__(self, params, lr=1e-2, lr_decay=0.0, weight_decay=0.0,
                 initial_accumulator_value=0.0, eps=1e-10, maximize=False):
        _check_range("learning rate", lr)
        _check_range("lr_decay", lr_decay)
        _check_range("weight_decay", weight_decay)
        _check_range("initial_accumulator_value", initial_accumulator_value)
        _check_range("eps", eps)
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, foreach=None,
                        maximize=bool(maximize))
        super().__init__(params, defaults)

    # DeepSpeed's DeepSpeedCPUAdagrad saves groups without these: kept from the constructor.
    _own_keys = ("lr_decay", "initial_accumulator_value", "maximize")

    def _group_kind(self, group):
        return "adagrad"

    def load_state_dict(self, state_dict):
        """torch's (state ``sum``) or DeepSpeed's ``DeepSpeedCPUAdagrad`` (state
        ``exp_avg_sq``, an int ``step``): the latter is renamed to torch's layout."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            if "exp_avg_sq" in state and "sum" not in state:
                state["sum"] = state.pop("exp_avg_sq")
            if "step" in state and not torch.is_tensor(state["step"]):
                state["step"] = torch.tensor(float(state["step"]))

    def _initial_moment(self, group, moment):
        return group["initial_accumulator_value"]

    def _hyper(self, group, step):
        lr = group["lr"] / (1 + (step - 1) * group["lr_decay"])
        return dict(lr=lr, beta1=0.0, beta2=0.0, eps=group["eps"],
                    weight_decay=group["weight_decay"], bias_correction=False, amsgrad=False)


class CPULion(_CPUOptimizer):
    """Lion (Chen et al. 2023) on CPU tensors: the sign of beta1-interpolated momentum, decoupled
    weight decay, momentum decayed by beta2 (state ``exp_avg``), as DeepSpeed's
    ``DeepSpeedCPULion``."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, maximize=False):
        _check_range("learning rate", lr)
        _check_range("beta1", betas[0], 0.0, 1.0, high_open=True)
        _check_range("beta2", betas[1], 0.0, 1.0, high_open=True)
        _check_range("weight_decay", weight_decay)
        defaults = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay,
                        maximize=bool(maximize))
        super().__init__(params, defaults)

    def _group_kind(self, group):
        return "lion"

    def _hyper(self, group, step):
        beta1, beta2 = group["betas"]
        return dict(lr=group["lr"], beta1=beta1, beta2=beta2, eps=0.0,
                    weight_decay=group["weight_decay"], bias_correction=False, amsgrad=False)


Adagrad = CPUAdagrad
Lion = CPULion
