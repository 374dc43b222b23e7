"""DeepSpeed's op interfaces over zinfinity: ``DeepSpeedCPUAdam``, ``DeepSpeedCPUAdagrad``,
``DeepSpeedCPULion``, ``aio_handle`` and the op builders, with DeepSpeed's argument order,
defaults, state keys, attributes and return codes, so that code written against
``deepspeed.ops`` runs on zinfinity's kernel and I/O engine::

    from zinfinity.compat.deepspeed import DeepSpeedCPUAdam, AsyncIOBuilder
    opt = DeepSpeedCPUAdam(model.parameters(), lr=1e-3)
    h = AsyncIOBuilder().load().aio_handle(1 << 20, 128, False, False, 1)

or, for code that imports DeepSpeed's modules, ``install()`` first: ``import
deepspeed.ops.adam`` (``.adagrad``, ``.lion``, ``.aio``, ``.op_builder``) then resolves here.

State keys are DeepSpeed's: ``step`` (an int), ``exp_avg``, ``exp_avg_sq``, in fp32
(``fp32_optimizer_states=True``, the default) or in the parameter's dtype (False). bf16/fp16
parameters are updated in place, as DeepSpeed's; ``fp32_master=True`` (zinfinity's keyword)
keeps an fp32 master copy in the state (``master``) and steps that instead. The differences
from DeepSpeed are listed in python/README.md.
"""

import sys
import types

import torch

from . import _aio, _ops

__all__ = ["DeepSpeedCPUAdam", "DeepSpeedCPUAdagrad", "DeepSpeedCPULion", "aio_handle",
           "AsyncIOBuilder", "CPUAdamBuilder", "CPUAdagradBuilder", "CPULionBuilder",
           "OpBuilder", "install"]

aio_handle = _aio.aio_handle


# --- op builders ----------------------------------------------------------------------------------
def _op_module(name, functions):
    module = types.ModuleType(name, f"zinfinity's stand-in for DeepSpeed's {name}")
    for f in functions:
        setattr(module, f.__name__, f)
    return module


class OpBuilder:
    """DeepSpeed's OpBuilder face: nothing is compiled; ``load()`` returns the op module (the
    same object at every call)."""

    NAME = None
    BUILD_VAR = None
    _loaded_ops = {}

    def __init__(self, name=None):
        self.name = name or self.NAME
        self.jit_mode = False
        self.build_for_cpu = True
        self.enable_bf16 = True
        self.error_log = None

    def absolute_name(self):
        return self._absolute_name

    def sources(self):
        return []

    def include_paths(self):
        return []

    def cxx_args(self):
        return []

    def is_compatible(self, verbose=False):
        return True

    def _functions(self):
        raise NotImplementedError

    def load(self, verbose=False):
        module = OpBuilder._loaded_ops.get(self.name)
        if module is None:
            module = _op_module(self.absolute_name(), self._functions())
            OpBuilder._loaded_ops[self.name] = module
        return module

    jit_load = load

    def builder(self):
        raise RuntimeError(f"{self.name}: zinfinity's ops are prebuilt; there is nothing to "
                           f"build")


class CPUAdamBuilder(OpBuilder):
    NAME = "cpu_adam"
    BUILD_VAR = "DS_BUILD_CPU_ADAM"
    _absolute_name = "deepspeed.ops.adam.cpu_adam_op"

    def _functions(self):
        return [_ops.create_adam, _ops.adam_update, _ops.adam_rollback, _ops.destroy_adam]


class CPUAdagradBuilder(OpBuilder):
    NAME = "cpu_adagrad"
    BUILD_VAR = "DS_BUILD_CPU_ADAGRAD"
    _absolute_name = "deepspeed.ops.adagrad.cpu_adagrad_op"

    def _functions(self):
        return [_ops.create_adagrad, _ops.adagrad_update, _ops.destroy_adagrad]


class CPULionBuilder(OpBuilder):
    NAME = "cpu_lion"
    BUILD_VAR = "DS_BUILD_CPU_LION"
    _absolute_name = "deepspeed.ops.lion.cpu_lion_op"

    def _functions(self):
        return [_ops.create_lion, _ops.lion_update, _ops.destroy_lion]


class AsyncIOBuilder(OpBuilder):
    NAME = "async_io"
    BUILD_VAR = "DS_BUILD_AIO"
    _absolute_name = "deepspeed.ops.aio.async_io_op"

    def _functions(self):
        return [_aio.aio_handle, _aio.aio_read, _aio.aio_write, _aio.deepspeed_memcpy]


# --- optimizers -----------------------------------------------------------------------------------
def _assert_cpu(name, p):
    # DeepSpeed asserts here (its callers expect AssertionError); raised explicitly so that
    # python -O keeps it.
    if p.device != torch.device("cpu"):
        raise AssertionError(f"{name} param is on {p.device} and must be 'cpu', make sure you "
                             f"enabled 'offload_optimizer': 'cpu' in your ZeRO config.")


def _refuse_amsgrad(cls, amsgrad):
    if amsgrad:
        raise ValueError(f"{cls}: amsgrad=True is not supported (DeepSpeed ignores it); use "
                         f"zinfinity.optim.CPUAdam(amsgrad=True)")


class _DeepSpeedCPUOptimizer(torch.optim.Optimizer):
    """The step loop DeepSpeed's three CPU optimizers share; subclasses name their op and their
    state keys."""

    _name = None          # in messages: "CPUAdam"
    _state_keys = ()      # the moments kept, all created at the first step
    optimizer_id = 0      # DeepSpeed's class-wide counter (per class)

    def _init_ids(self, fp32_optimizer_states, fp32_master):
        cls = type(self)
        self.opt_id = cls.optimizer_id
        cls.optimizer_id += 1
        self.fp32_optimizer_states = bool(fp32_optimizer_states)
        self.fp32_master = bool(fp32_master)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)

    def _state_dtype(self, p):
        if self.fp32_optimizer_states or self.fp32_master:
            return torch.float32
        return p.dtype

    def _new_state(self, p, state):
        state["step"] = 0
        for key in self._state_keys:
            state[key] = torch.zeros_like(p.data, dtype=self._state_dtype(p),
                                          device=torch.device("cpu"))
        if self.fp32_master and p.dtype != torch.float32:
            state["master"] = p.detach().to(torch.float32)

    def _update(self, group, p, grad, state):
        raise NotImplementedError

    def _step_param(self, group, p, state):
        """One step of p with its state (created on first use); the master, if kept, is
        stepped and p receives its rounded value."""
        if len(state) == 0:
            self._new_state(p, state)
        state["step"] += 1
        if "master" in state:
            master = state["master"]
            self._update(group, master, p.grad.data, state)
            p.data.copy_(master)
        else:
            self._update(group, p.data, p.grad.data, state)

    def _params_with_grads(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    _assert_cpu(self._name, p)
                    yield group, p

    @torch.no_grad()
    def step(self, closure=None):
        """One step of every parameter that has a gradient; returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group, p in self._params_with_grads():
            if p.grad.is_sparse:
                self._sparse_step(group, p)
            else:
                self._step_param(group, p, self.state[p])
        return loss

    def _sparse_step(self, group, p):
        raise ValueError(f"{self._name}: the gradient is sparse; only DeepSpeedCPUAdagrad "
                         f"takes sparse gradients")

    def load_state_dict(self, state_dict):
        """torch's, keeping each state in the dtype this optimizer keeps it in (torch would
        cast every floating state to its parameter's dtype first, rounding fp32 moments)."""
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        originals = {p: state_dict["state"].get(i) for i, p in zip(saved_ids, params)}
        super().load_state_dict(state_dict)
        for p, saved in originals.items():
            for key, value in (saved or {}).items():
                if key in self._state_keys:
                    self.state[p][key] = value.to(device="cpu", dtype=self._state_dtype(p),
                                                  copy=True)
                elif key == "master":
                    self.state[p][key] = value.to(device="cpu", dtype=torch.float32, copy=True)

    def __del__(self):
        destroy = getattr(self, "_destroy", None)
        if destroy is not None and hasattr(self, "opt_id"):
            destroy(self.opt_id)


class DeepSpeedCPUAdam(_DeepSpeedCPUOptimizer):
    """DeepSpeed's ``DeepSpeedCPUAdam(model_params, lr, bias_correction, betas, eps,
    weight_decay, amsgrad, adamw_mode, fp32_optimizer_states)`` on zinfinity's kernel.
    ``adamw_mode`` is fixed at construction (attribute ``adam_w_mode``); ``fp32_master``
    (keyword only, zinfinity's) keeps an fp32 master for bf16/fp16 parameters."""

    _name = "CPUAdam"
    _state_keys = ("exp_avg", "exp_avg_sq")
    optimizer_id = 0

    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999),
                 eps=1e-8, weight_decay=0, amsgrad=False, adamw_mode=True,
                 fp32_optimizer_states=True, *, fp32_master=False):
        _refuse_amsgrad("DeepSpeedCPUAdam", amsgrad)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction, amsgrad=amsgrad)
        super().__init__(model_params, defaults)
        self._init_ids(fp32_optimizer_states, fp32_master)
        self.adam_w_mode = adamw_mode
        self.ds_opt_adam = CPUAdamBuilder().load()
        self.ds_opt_adam.create_adam(self.opt_id, lr, betas[0], betas[1], eps, weight_decay,
                                     adamw_mode, False)
        self._destroy = self.ds_opt_adam.destroy_adam

    def _update(self, group, p, grad, state):
        beta1, beta2 = group["betas"]
        self.ds_opt_adam.adam_update(self.opt_id, state["step"], group["lr"], beta1, beta2,
                                     group["eps"], group["weight_decay"],
                                     group["bias_correction"], p, grad, state["exp_avg"],
                                     state["exp_avg_sq"])

    @torch.no_grad()
    def step_subgroup(self, subgroup_id: int, closure=None):
        """DeepSpeed's SuperOffload step: every parameter with a gradient steps with the one
        state ``self.state[subgroup_id]`` (made from the first such parameter)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group, p in self._params_with_grads():
            self._step_param(group, p, self.state[subgroup_id])
        return loss

    @torch.no_grad()
    def rollback_subgroup(self, sub_group_id: int, closure=None):
        """Undoes the last ``step_subgroup(sub_group_id)`` with the gradients it used (fp32
        parameters; for others the op prints an error and changes nothing, and the step count
        still goes down, as DeepSpeed's). RuntimeError when there is no step to undo."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if sub_group_id not in self.state or len(self.state[sub_group_id]) == 0:
            raise RuntimeError(f"Cannot rollback optimizer state for sub_group_id "
                               f"{sub_group_id} as it has not been initialized.")
        state = self.state[sub_group_id]
        if state.get("step", 0) <= 0:
            raise RuntimeError(f"Cannot rollback sub_group_id {sub_group_id}: step count is "
                               f"{state.get('step', 0)}")
        for group, p in self._params_with_grads():
            beta1, beta2 = group["betas"]
            self.ds_opt_adam.adam_rollback(self.opt_id, state["step"], group["lr"], beta1,
                                           beta2, group["eps"], group["weight_decay"],
                                           group["bias_correction"], p.data, p.grad.data,
                                           state["exp_avg"], state["exp_avg_sq"])
            state["step"] -= 1
        return loss


class DeepSpeedCPUAdagrad(_DeepSpeedCPUOptimizer):
    """DeepSpeed's ``DeepSpeedCPUAdagrad(model_params, lr, eps, weight_decay, amsgrad,
    fp32_optimizer_states)``: state ``step``, ``exp_avg_sq``; sparse gradients (e.g.
    ``nn.Embedding(sparse=True)``) step only the rows they hold."""

    _name = "CPUAdagrad"
    _state_keys = ("exp_avg_sq",)
    optimizer_id = 0

    def __init__(self, model_params, lr=1e-2, eps=1e-10, weight_decay=0, amsgrad=False,
                 fp32_optimizer_states=True, *, fp32_master=False):
        _refuse_amsgrad("DeepSpeedCPUAdagrad", amsgrad)
        defaults = dict(lr=lr, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
        super().__init__(model_params, defaults)
        self._init_ids(fp32_optimizer_states, fp32_master)
        self.ds_opt_adagrad = CPUAdagradBuilder().load()
        self.ds_opt_adagrad.create_adagrad(self.opt_id, lr, eps, weight_decay, False)
        self._destroy = self.ds_opt_adagrad.destroy_adagrad

    def _update(self, group, p, grad, state):
        self.ds_opt_adagrad.adagrad_update(self.opt_id, state["step"], group["lr"],
                                           group["eps"], group["weight_decay"], p, grad,
                                           state["exp_avg_sq"])

    def _sparse_step(self, group, p):
        """Steps the elements the sparse gradient holds: gathered, stepped, scattered back."""
        state = self.state[p]
        if len(state) == 0:
            self._new_state(p, state)
        state["step"] += 1
        grad = p.grad.coalesce()
        target = state["master"] if "master" in state else p.data
        values = target.sparse_mask(grad).coalesce()
        moments = state["exp_avg_sq"].sparse_mask(grad).coalesce()
        stepped, moment_values = values.values().contiguous(), moments.values().contiguous()
        self._update(group, stepped, grad.values(), {"step": state["step"],
                                                     "exp_avg_sq": moment_values})
        index = tuple(values.indices())
        target[index] = stepped
        state["exp_avg_sq"][index] = moment_values
        if target is not p.data:
            p.data[index] = stepped.to(p.dtype)


class DeepSpeedCPULion(_DeepSpeedCPUOptimizer):
    """DeepSpeed's ``DeepSpeedCPULion(model_params, lr=1e-3, betas=(0.9, 0.999),
    weight_decay=0, fp32_optimizer_states=True)``: state ``step``, ``exp_avg`` and
    ``exp_avg_sq`` (kept, unused, as DeepSpeed's)."""

    _name = "CPULion"
    _state_keys = ("exp_avg", "exp_avg_sq")
    optimizer_id = 0

    def __init__(self, model_params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0,
                 fp32_optimizer_states=True, *, fp32_master=False):
        defaults = dict(lr=lr, betas=betas, weight_decay=weight_decay)
        super().__init__(model_params, defaults)
        self._init_ids(fp32_optimizer_states, fp32_master)
        self.ds_opt_lion = CPULionBuilder().load()
        self.ds_opt_lion.create_lion(self.opt_id, lr, betas[0], betas[1], weight_decay, False)
        self._destroy = self.ds_opt_lion.destroy_lion

    def _update(self, group, p, grad, state):
        beta1, beta2 = group["betas"]
        self.ds_opt_lion.lion_update(self.opt_id, state["step"], group["lr"], beta1, beta2,
                                     group["weight_decay"], p, grad, state["exp_avg"])


# --- install --------------------------------------------------------------------------------------
_BUILDERS = (CPUAdamBuilder, CPUAdagradBuilder, CPULionBuilder, AsyncIOBuilder)


def _module(name, doc, attributes):
    module = types.ModuleType(name, doc)
    module.__dict__.update(attributes)
    return module


def _package(name):
    """sys.modules[name] if imported or importable, else a new empty package put there."""
    if name in sys.modules:
        return sys.modules[name]
    try:
        __import__(name)
        return sys.modules[name]
    except ImportError:
        package = types.ModuleType(name, "made by zinfinity.compat.deepspeed.install()")
        package.__path__ = []
        sys.modules[name] = package
        return package


def install():
    """Makes ``deepspeed.ops.op_builder``, ``deepspeed.ops.adam``, ``deepspeed.ops.adagrad``,
    ``deepspeed.ops.lion`` and ``deepspeed.ops.aio`` resolve to these (sys.modules entries and
    attributes of their parents; ``deepspeed`` and ``deepspeed.ops`` are made empty where they
    cannot be imported). ``deepspeed.ops.__compatible_ops__`` gets each builder's NAME as True.
    Returns the ``deepspeed.ops`` module."""
    top = _package("deepspeed")
    ops = _package("deepspeed.ops")
    top.ops = ops
    builders = {b.__name__: b for b in _BUILDERS}
    submodules = {
        "op_builder": _module("deepspeed.ops.op_builder", "zinfinity's op builders",
                              dict(builders, OpBuilder=OpBuilder)),
        "adam": _module("deepspeed.ops.adam", "zinfinity's DeepSpeedCPUAdam",
                        {"DeepSpeedCPUAdam": DeepSpeedCPUAdam}),
        "adagrad": _module("deepspeed.ops.adagrad", "zinfinity's DeepSpeedCPUAdagrad",
                           {"DeepSpeedCPUAdagrad": DeepSpeedCPUAdagrad}),
        "lion": _module("deepspeed.ops.lion", "zinfinity's DeepSpeedCPULion",
                        {"DeepSpeedCPULion": DeepSpeedCPULion}),
        "aio": _module("deepspeed.ops.aio", "zinfinity's async I/O op",
                       {"AsyncIOBuilder": AsyncIOBuilder}),
    }
    for name, module in submodules.items():
        sys.modules[f"deepspeed.ops.{name}"] = module
        setattr(ops, name, module)
    compatible = dict(getattr(ops, "__compatible_ops__", {}))
    compatible.update({b.NAME: True for b in _BUILDERS})
    ops.__compatible_ops__ = compatible
    return ops
