"""DeepSpeed's raw CPU optimizer ops (what ``CPUAdamBuilder().load()`` and its siblings return)
over zinfinity's kernel: positional arguments in DeepSpeed's order, 0 on success.

Each optimizer is registered under an integer id by ``create_*`` (its fixed settings: Adam's
``adamw_mode``) and removed by ``destroy_*``; every step passes the rest. Tensors are updated
in place. Supported (parameter, state) dtypes, as DeepSpeed's: (fp32, fp32), (bf16, fp32),
(bf16, bf16), (fp16, fp32), (fp16, fp16). The kernel works in fp32: a bf16/fp16 parameter or
state is widened chunk by chunk into fp32 scratch memory, stepped, and rounded back to nearest
even, so memory stays that of the caller's tensors plus 4 MiB per scratch array.
"""

import threading

import torch

from .. import _C
from .._tensors import DTYPE_NAMES

# Elements per kernel call when parameters or states are bf16/fp16 (each scratch array is
# this many fp32 values, 4 MiB).
CHUNK_NUMEL = 1 << 20

_PAIRS = {(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
          (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32),
          (torch.float16, torch.float16)}

_REGISTRY = {"Adam": {}, "Adagrad": {}, "Lion": {}}
_MUTEX = threading.Lock()


def _create(family, optimizer_id, settings, should_log, config):
    with _MUTEX:
        _REGISTRY[family][int(optimizer_id)] = settings  # as DeepSpeed: a new create replaces
    if should_log:
        isa = _C.kernel_info()["isa"]
        print(f"{family} Optimizer #{int(optimizer_id)} is created with {isa} arithmetic "
              f"capability.")
        print(f"Config: {config}")
    return 0


def _settings(family, optimizer_id):
    with _MUTEX:
        settings = _REGISTRY[family].get(int(optimizer_id))
    if settings is None:
        raise RuntimeError(f"{family} optimizer #{optimizer_id} does not exist: call "
                           f"create_{family.lower()} first (or it was destroyed)")
    return settings


def _destroy(family, optimizer_id):
    with _MUTEX:
        _REGISTRY[family].pop(int(optimizer_id), None)
    return 0


def _check(family, params, grads, states):
    for name, t in [("params", params), ("grads", grads)] + states:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{family} update: {name} is a {type(t).__name__}, not a tensor")
        if t.device.type != "cpu":
            raise ValueError(f"{family} update: {name} is on {t.device}; the CPU optimizer "
                             f"works on CPU tensors")
        if t.is_sparse:
            raise ValueError(f"{family} update: {name} is sparse; pass its values()")
        if t.numel() != params.numel():
            raise ValueError(f"{family} update: {name} has {t.numel()} elements, params "
                             f"{params.numel()}")
    state_dtype = states[0][1].dtype
    if (params.dtype, state_dtype) not in _PAIRS or any(
            t.dtype != state_dtype for _, t in states):
        raise RuntimeError(f"{family} optimizer with param type {params.dtype} and state type "
                           f"{state_dtype} is not supported on current hardware")
    if grads.dtype not in DTYPE_NAMES:
        raise ValueError(f"{family} update: grads of dtype {grads.dtype}; expected float32, "
                         f"bfloat16 or float16")


def _flat(t):
    """A contiguous 1-D view of t, or a contiguous copy (written back by the caller)."""
    return t.view(-1) if t.is_contiguous() else t.contiguous().view(-1)


def _step(kind, family, step, hyper, params, grads, states):
    """One kernel step over params with the given states (list of (name, tensor)), in place."""
    _check(family, params, grads, states)
    if params.numel() == 0:
        return 0
    p, g = _flat(params), _flat(grads)
    s = [_flat(t) for _, t in states]
    common = dict(kind=kind, grad_dtype=DTYPE_NAMES[g.dtype], step=int(step), **hyper)
    if p.dtype == torch.float32:
        _C.optimizer_step(numel=p.numel(), params=p.data_ptr(), grads=g.data_ptr(),
                          moments=[m.data_ptr() for m in s], copy=0, copy_dtype="bfloat16",
                          **common)
    else:
        _low_precision_step(p, g, s, common)
    for (_, original), flat in zip([("params", params)] + states, [p] + s):
        if flat.data_ptr() != original.data_ptr():
            original.copy_(flat.view(original.shape))
    return 0


def _low_precision_step(p, g, s, common):
    """bf16/fp16 parameters: widened to fp32 scratch per chunk, stepped, and written back
    rounded by the kernel (ParamCopy); bf16/fp16 states widened and rounded back likewise."""
    n = p.numel()
    scratch_p = torch.empty(min(n, CHUNK_NUMEL), dtype=torch.float32)
    narrow_states = s and s[0].dtype != torch.float32
    scratch_s = [torch.empty_like(scratch_p) for _ in s] if narrow_states else []
    for begin in range(0, n, CHUNK_NUMEL):
        end = min(n, begin + CHUNK_NUMEL)
        count = end - begin
        p32 = scratch_p[:count]
        p32.copy_(p[begin:end])
        if narrow_states:
            moments = [t[:count].copy_(m[begin:end]) for t, m in zip(scratch_s, s)]
        else:
            moments = [m[begin:end] for m in s]
        _C.optimizer_step(numel=count, params=p32.data_ptr(), grads=g[begin:end].data_ptr(),
                          moments=[m.data_ptr() for m in moments],
                          copy=p[begin:end].data_ptr(), copy_dtype=DTYPE_NAMES[p.dtype],
                          **common)
        if narrow_states:
            for m, wide in zip(s, moments):
                m[begin:end].copy_(wide)  # round to nearest even, as torch's casts


# --- Adam -----------------------------------------------------------------------------------------
def create_adam(optimizer_id, alpha, betta1, betta2, eps, weight_decay, adamw_mode, should_log):
    """Registers Adam #id; ``adamw_mode`` (decoupled weight decay) is fixed from here on."""
    return _create("Adam", optimizer_id, {"adamw_mode": bool(adamw_mode)}, should_log,
                   f"alpha={alpha:f}, betas=({betta1:f}, {betta2:f}), "
                   f"weight_decay={weight_decay:f}, adam_w={int(bool(adamw_mode))}")


def _adam_hyper(settings, lr, beta1, beta2, epsilon, weight_decay, bias_correction):
    return dict(lr=float(lr), beta1=float(beta1), beta2=float(beta2), eps=float(epsilon),
                weight_decay=float(weight_decay), bias_correction=bool(bias_correction),
                amsgrad=False)


def adam_update(optimizer_id, step, lr, beta1, beta2, epsilon, weight_decay, bias_correction,
                params, grads, exp_avg, exp_avg_sq):
    """One Adam step (``step`` counts from 1) of params with grads; returns 0."""
    settings = _settings("Adam", optimizer_id)
    kind = "adamw" if settings["adamw_mode"] else "adam"
    hyper = _adam_hyper(settings, lr, beta1, beta2, epsilon, weight_decay, bias_correction)
    return _step(kind, "Adam", step, hyper, params, grads,
                 [("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)])


def adam_rollback(optimizer_id, step, lr, beta1, beta2, epsilon, weight_decay, bias_correction,
                  params, grads, exp_avg, exp_avg_sq):
    """Undoes the Adam step number ``step`` made with ``grads`` (fp32 tensors only): returns 0,
    or -1 with a message (nothing changed) when a tensor is not float32."""
    settings = _settings("Adam", optimizer_id)
    tensors = (params, grads, exp_avg, exp_avg_sq)
    if any(not isinstance(t, torch.Tensor) or t.dtype != torch.float32 for t in tensors):
        print("Error: Adam rollback currently only supports float32 tensors")
        return -1
    _check("Adam", params, grads, [("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)])
    p, g, m, v = (t.contiguous() for t in tensors)
    t = int(step)
    lr, beta1, beta2, eps, wd = (float(x) for x in (lr, beta1, beta2, epsilon, weight_decay))
    bc1 = 1.0 - beta1 ** t if bias_correction else 1.0
    bc2 = 1.0 - beta2 ** t if bias_correction else 1.0
    with torch.no_grad():
        update = (lr / bc1) * m / (v.sqrt() / bc2 ** 0.5 + eps)
        p.add_(update)
        if wd > 0 and settings["adamw_mode"]:
            p.div_(1.0 - lr * wd)
        p.masked_fill_(~torch.isfinite(p), 0.0)
        if wd > 0 and not settings["adamw_mode"]:
            g = g + wd * p  # the gradient the moments saw (L2 mode)
        m.sub_((1.0 - beta1) * g).div_(beta1)
        v.sub_((1.0 - beta2) * g * g).div_(beta2).clamp_(min=0.0)
        for original, new in zip((params, exp_avg, exp_avg_sq), (p, m, v)):
            if new.data_ptr() != original.data_ptr():
                original.copy_(new)
    return 0


def destroy_adam(optimizer_id):
    return _destroy("Adam", optimizer_id)


# --- Adagrad --------------------------------------------------------------------------------------
def create_adagrad(optimizer_id, alpha, eps, weight_decay, should_log):
    return _create("Adagrad", optimizer_id, {}, should_log,
                   f"alpha={alpha:f}, weight_decay={weight_decay:f}")


def adagrad_update(optimizer_id, step, lr, epsilon, weight_decay, params, grads, exp_avg_sq):
    """One Adagrad step (torch's: L2 weight decay in the gradient); returns 0."""
    _settings("Adagrad", optimizer_id)
    hyper = dict(lr=float(lr), beta1=0.0, beta2=0.0, eps=float(epsilon),
                 weight_decay=float(weight_decay), bias_correction=False, amsgrad=False)
    return _step("adagrad", "Adagrad", step, hyper, params, grads, [("exp_avg_sq", exp_avg_sq)])


def destroy_adagrad(optimizer_id):
    return _destroy("Adagrad", optimizer_id)


# --- Lion -----------------------------------------------------------------------------------------
def create_lion(optimizer_id, alpha, betta1, betta2, weight_decay, should_log):
    return _create("Lion", optimizer_id, {}, should_log,
                   f"alpha={alpha:f}, betas=({betta1:f}, {betta2:f}), "
                   f"weight_decay={weight_decay:f}")


def lion_update(optimizer_id, step, lr, beta1, beta2, weight_decay, params, grads, exp_avg):
    """One Lion step; returns 0."""
    _settings("Lion", optimizer_id)
    hyper = dict(lr=float(lr), beta1=float(beta1), beta2=float(beta2), eps=0.0,
                 weight_decay=float(weight_decay), bias_correction=False, amsgrad=False)
    return _step("lion", "Lion", step, hyper, params, grads, [("exp_avg", exp_avg)])


def destroy_lion(optimizer_id):
    return _destroy("Lion", optimizer_id)
