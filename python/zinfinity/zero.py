"""ZeRO on torch modules: the parameters of a torch model as the C++ engine's, gathered into
torch around each use and released after it, and the gradients handed to the engine as
backward produces them.

Under stages 0-2 every parameter stays whole in the engine's memory; a forward points each
torch parameter at it (``param.data`` is a view of the engine's copy, updated in place by each
step). Under stage 3 (partitioned, possibly on NVMe) a module's parameters are fetched by a
forward pre-hook and released by a forward hook (``param.data`` emptied, as DeepSpeed does),
fetched again before the module's backward (an autograd function on its outputs) and released
after it (one on its inputs); a parameter used outside its module (read through another
module's attribute) is fetched on access and becomes that module's from then on. The engine
records the order of fetches in the first step and prefetches along it.

``Init`` builds a model whose parameters never exist whole in memory together: each module's
parameters go to a file under the config's NVMe path as the module is constructed, and
``initialize`` reads them from there. ``GatheredParameters`` makes parameters readable (and,
before ``initialize``, writable) for a while.
"""

import json
import mmap
import os
import tempfile
import time

import torch

from . import _C

__all__ = ["Init", "GatheredParameters", "Partitioner", "register_external_parameter"]


def _map_tensors(value, fn):
    """fn applied to every tensor in value (tuples, lists, dicts; others unchanged)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(_map_tensors(v, fn) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    return value


class _BackwardCall:
    """One call of a module, for its backward: the parameters to fetch before it, and how many
    of its inputs still await their gradient before they are released."""

    __slots__ = ("module", "params", "fetched", "released", "inputs_pending")

    def __init__(self, module, params):
        self.module = module
        self.params = params
        self.fetched = False
        self.released = False
        self.inputs_pending = 0


class _PreBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partitioner, call, tensor):
        ctx.partitioner = partitioner
        ctx.call = call
        return tensor.detach()

    @staticmethod
    def backward(ctx, grad):
        ctx.partitioner._before_module_backward(ctx.call)
        return None, None, grad


class _PostBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partitioner, call, tensor):
        ctx.partitioner = partitioner
        ctx.call = call
        call.inputs_pending += 1
        return tensor.detach()

    @staticmethod
    def backward(ctx, grad):
        ctx.partitioner._after_module_backward_input(ctx.call)
        return None, None, grad


class _ParameterDict(dict):
    """A module's ``_parameters`` under stage 3: reading a released parameter during a forward
    (a parameter used outside its module) fetches it for the module running."""

    def __init__(self, partitioner, items):
        super().__init__(items)
        self._partitioner = partitioner

    def __getitem__(self, key):
        param = super().__getitem__(key)
        part = self._partitioner
        if param is not None and part._in_forward and part._holds.get(id(param), 1) == 0:
            part._external_access(param)
        return param


def _front_end(method):
    """Counts the time of a hook in front_end_seconds, less the engine calls it makes."""

    def timed(self, *args):
        started, engine = time.perf_counter(), self.engine_seconds
        try:
            return method(self, *args)
        finally:
            self.front_end_seconds += (time.perf_counter() - started
                                       - (self.engine_seconds - engine))

    return timed


class Partitioner:
    """The torch side of the engine: which parameters it trains, their ids, the hooks."""

    def __init__(self, model, model_parameters, source):
        self.model = model
        self.source = source
        self.front_end_seconds = 0.0  # hooks, checks, copies: the front end's own time
        self.engine_seconds = 0.0  # inside the engine's fetch, release and accumulate
        chosen = None
        if model_parameters is not None:
            chosen = set()
            for item in model_parameters:
                if isinstance(item, dict):
                    chosen.update(id(p) for p in item["params"])
                else:
                    chosen.add(id(item))
        self.names, self.params, self.frozen = [], [], []
        for name, p in model.named_parameters():
            store = getattr(p, "_zinf_init", None)
            if p.device.type != "cpu":
                raise ValueError(f"parameter {name} is on {p.device}: the config's device.type is "
                                 "\"cpu\" (the front end trains CPU tensors); move the model to "
                                 "the CPU")
            if p.requires_grad and (chosen is None or id(p) in chosen):
                self.names.append(name)
                self.params.append(p)
            else:
                if store is not None:  # built under Init, frozen: torch's own again
                    p.data = store.view_of(p).clone().to(p.dtype)
                    del p._zinf_init
                self.frozen.append((name, p))
        if not self.params:
            raise ValueError("initialize: the model has no trainable parameters")
        self.ids = {id(p): i for i, p in enumerate(self.params)}
        self.shapes = [tuple(_zinf_shape(p)) for p in self.params]
        self.dtypes = [p.dtype for p in self.params]
        self._holds = {id(p): 0 for p in self.params}
        self._c = None
        self._stage = 0
        self._handles = []
        self._grad_nodes = []
        self._calls = []
        self._stack = []
        self._storages = {}  # storage address of a gathered parameter -> its index
        self._pending, self._pending_bytes = [], 0  # gradients the engine's stream may still read
        self._late = []  # parameters fetched by an unpacked saved tensor, released after backward
        self._in_forward = False
        self._training = False

    # ---- creation ------------------------------------------------------------------------------
    def create_engine(self, config_text, source):
        """The C++ engine over these parameters, initialised with their current values."""
        keep, addresses = [], []
        for p in self.params:
            source_tensor = _init_values(p)
            keep.append(source_tensor)
            addresses.append(source_tensor.data_ptr())
        shapes = [list(s) for s in self.shapes]
        return _C.TorchEngine(config_text, source, self.names, shapes, addresses)

    def attach(self, c, stage):
        self._c = c
        self._stage = stage
        for i, p in enumerate(self.params):
            _release_init_store(p)
            p._zinf_partitioner = self
            if p.numel() == 0:
                # The AccumulateGrad node records the shape it is made with: the full one (an
                # untouched allocation, no memory used; emptied again below or re-pointed).
                p.data = torch.empty(self.shapes[i], dtype=self.dtypes[i])
            node = p.expand_as(p).grad_fn.next_functions[0][0]
            self._grad_nodes.append(node)  # the hook lives as long as the node is referenced
            node.register_hook(self._grad_hook(i, p))
        for module in self.model.modules():
            if any(p is not None and id(p) in self.ids for p in module._parameters.values()):
                self._handles.append(
                    module._register_load_state_dict_pre_hook(self._refuse_load_state_dict))
        if stage == 3:
            for module in self.model.modules():
                self._hook_module(module)
            for p in self.params:
                p.data = torch.empty(0, dtype=p.dtype)
            for module in self.model.modules():
                module._register_state_dict_hook(self._state_dict_hook)
        else:
            self.after_step()

    def detach(self):
        """Gives the torch parameters tensors of their own (their last values) and removes the
        hooks: the engine is closing."""
        if self._c is None:
            return
        values = self._gather_all_values()
        for p, v in zip(self.params, values):
            p.data = v
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._grad_nodes.clear()
        for module in self.model.modules():
            if isinstance(module._parameters, _ParameterDict):
                module._parameters = dict(module._parameters)
        self._c = None

    # ---- passes --------------------------------------------------------------------------------
    def forward(self, training, run):
        self._check_parameters()
        self._c.begin_forward(training)
        ok = False
        self._training = training
        self._in_forward = True
        try:
            if self._stage < 3:
                self._point_all()
            if self._stage == 3 and training:
                # Tensors autograd saves that view a gathered parameter (a Linear's weight.t())
                # would outlive its memory: saved as (parameter, view) and rebuilt over the
                # parameter's memory of the backward.
                with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                    out = run()
            else:
                out = run()
            ok = True
            return out
        finally:
            self._in_forward = False
            if self._stage == 3 and (not ok or not training):
                self._release_leftovers()
            self._c.end_forward(ok)

    def backward(self, loss, retain_graph):
        scale = self._c.begin_backward()
        ok = False
        try:
            (loss * scale if scale != 1.0 else loss).backward(retain_graph=retain_graph)
            ok = True
        finally:
            self._drain()
            if self._stage == 3:
                self._release_leftovers()
            self._c.end_backward(ok)

    def after_step(self):
        if self._stage < 3:
            self._point_all()

    # ---- stage 0-2: parameters point at the engine's whole copy --------------------------------
    @_front_end
    def _point_all(self):
        for i, p in enumerate(self.params):
            view = self._c.fetch(i)
            p.data = _as_param(view, self.shapes[i], self.dtypes[i])
            self._c.release(i)

    # ---- stage 3: fetch and release around each use --------------------------------------------
    def _hook_module(self, module):
        own = [p for p in module._parameters.values() if p is not None and id(p) in self.ids]
        module._zinf_params = own
        module._zinf_registered = list(getattr(module, "_zinf_pending_external", []))
        module._zinf_external = list(module._zinf_registered)
        module._parameters = _ParameterDict(self, module._parameters)
        self._handles.append(module.register_forward_pre_hook(self._pre_forward))
        self._handles.append(module.register_forward_hook(self._post_forward))

    def _module_params(self, module):
        return module._zinf_params + module._zinf_external

    @_front_end
    def _pre_forward(self, module, inputs):
        # The module's own parameters and those registered as its external ones; others it was
        # found reading are fetched again as it reads them (_external_access), as in the first
        # forward, so that every window fetches in one order and the tiers' recorded access
        # trace stays valid (fetched here, they moved ahead of the modules that run before).
        params = module._zinf_params + module._zinf_registered
        self._fetch(params)
        self._stack.append((module, params))
        if not (self._training and torch.is_grad_enabled()):
            return None
        call = _BackwardCall(module, params)
        module._zinf_call = call
        self._calls.append(call)
        if not params:
            return None
        return _map_tensors(inputs, lambda t: _PostBackward.apply(self, call, t)
                            if t.requires_grad else t)

    @_front_end
    def _post_forward(self, module, inputs, output):
        _, params = self._stack.pop()
        self._release(params)
        call = getattr(module, "_zinf_call", None)
        if call is None:
            return None
        module._zinf_call = None
        call.params = list(self._module_params(module))
        if not call.params:
            return None
        return _map_tensors(output, lambda t: _PreBackward.apply(self, call, t)
                            if t.requires_grad else t)

    @_front_end
    def _before_module_backward(self, call):
        if not call.fetched:
            call.fetched = True
            self._fetch(call.params)

    @_front_end
    def _after_module_backward_input(self, call):
        call.inputs_pending -= 1
        if call.inputs_pending == 0 and call.fetched and not call.released:
            call.released = True
            self._release(call.params)

    @_front_end
    def _external_access(self, param):
        """A released parameter read in a forward outside its own module: fetched now, held by
        the module running, and that module's from now on (fetched with it, before its backward
        too)."""
        if not self._stack:
            return
        module, params = self._stack[-1]
        known = module._zinf_external + module._zinf_params
        if not any(param is p for p in known):
            module._zinf_external.append(param)
        self._fetch([param])
        params.append(param)

    @_front_end
    def _release_leftovers(self):
        self._release(self._late)
        self._late.clear()
        for call in self._calls:
            if call.fetched and not call.released:
                call.released = True
                self._release(call.params)
        self._calls.clear()
        for module, params in self._stack:
            self._release(params)
        self._stack.clear()
        for p in self.params:
            while self._holds[id(p)] > 0:
                self._release([p])

    def _fetch(self, params):
        for p in params:
            key = id(p)
            if self._holds[key] == 0:
                i = self.ids[key]
                started = time.perf_counter()
                view = self._c.fetch(i)
                self.engine_seconds += time.perf_counter() - started
                p.data = _as_param(view, self.shapes[i], self.dtypes[i])
                self._storages[p.data.storage().data_ptr()] = i
            self._holds[key] += 1

    def _release(self, params):
        for p in params:
            key = id(p)
            self._holds[key] -= 1
            if self._holds[key] == 0:
                self._storages.pop(p.data.storage().data_ptr(), None)
                p.data = torch.empty(0, dtype=p.dtype)
                started = time.perf_counter()
                self._c.release(self.ids[key])
                self.engine_seconds += time.perf_counter() - started

    @_front_end
    def _pack(self, tensor):
        index = self._storages.get(tensor.storage().data_ptr()) if tensor.numel() else None
        if index is None:
            return tensor
        return (_SavedView, index, tensor.storage_offset(), tuple(tensor.shape),
                tensor.stride(), tensor.requires_grad)

    @_front_end
    def _unpack(self, packed):
        if not (isinstance(packed, tuple) and packed and packed[0] is _SavedView):
            return packed
        _, index, offset, shape, stride, _ = packed
        p = self.params[index]
        if self._holds[id(p)] == 0:  # not fetched by a module's backward: held to its end
            self._fetch([p])
            self._late.append(p)
        return torch.as_strided(p.data, shape, stride, offset)

    # ---- gradients -----------------------------------------------------------------------------
    def _grad_hook(self, index, param):
        shape = torch.Size(self.shapes[index])

        @_front_end
        def hook(self, *_):
            grad = param.grad
            if grad is None:
                return
            if grad.shape != shape:
                raise ValueError(f"parameter {self.names[index]}: its gradient has shape "
                                 f"{tuple(grad.shape)}, the parameter {tuple(shape)}: a forward "
                                 "changed the parameter's shape")
            if grad.dtype != torch.float32 or not grad.is_contiguous() or grad.is_sparse:
                grad = grad.to_dense().float().contiguous()
            started = time.perf_counter()
            # The engine consumes it on its stream while backward goes on; the tensor is kept
            # until the stream is drained (at most _PENDING_BYTES held).
            self._c.accumulate(index, grad.data_ptr(), False)
            self._pending.append(grad)
            self._pending_bytes += grad.numel() * 4
            if self._pending_bytes >= _PENDING_BYTES:
                self._drain()
            self.engine_seconds += time.perf_counter() - started
            param.grad = None

        return lambda *args: hook(self, *args)

    def _drain(self):
        self._c.synchronize()
        self._pending.clear()
        self._pending_bytes = 0

    # ---- checks, values, state -----------------------------------------------------------------
    @_front_end
    def _check_parameters(self):
        for name, p in self.model.named_parameters():
            if id(p) not in self.ids and p.requires_grad and not any(p is f for _, f in
                                                                     self.frozen):
                raise ValueError(f"parameter {name} was added to the model after initialize; "
                                 "build the model whole before initialize")
        if self._stage < 3:
            for i, p in enumerate(self.params):
                if tuple(p.shape) != self.shapes[i]:
                    raise ValueError(f"parameter {self.names[i]} has shape {tuple(p.shape)}, "
                                     f"registered as {self.shapes[i]}: its shape changed")

    def _read_values(self, indices, closing=False):
        """The values of parameters `indices`, each in a tensor of its own, fetched in an
        evaluation pass (with `closing`, plain fetches when a training forward awaits its
        backward: the engine is closing)."""
        try:
            self._c.begin_forward(False)
            opened = True
        except ValueError:
            if not closing:
                raise
            opened = False
        ok = False
        try:
            out = []
            for i in indices:
                view = self._c.fetch(i)
                out.append(_as_param(view, self.shapes[i], self.dtypes[i]).clone())
                self._c.release(i)
            ok = True
            return out
        finally:
            if opened:
                self._c.end_forward(ok)

    def _gather_all_values(self):
        return self._read_values(range(len(self.params)), closing=True)

    def _state_dict_hook(self, module, state_dict, prefix, local_metadata):
        wanted = [(prefix + n, p) for n, p in module._parameters.items()
                  if p is not None and id(p) in self.ids and self._holds[id(p)] == 0]
        if not wanted or self._c is None:
            return
        values = self._read_values([self.ids[id(p)] for _, p in wanted])
        for (key, _), value in zip(wanted, values):
            state_dict[key] = value

    def gather_for_read(self, params):
        """GatheredParameters under an engine: whole values, read-only, until end_read."""
        if self._stage < 3:
            return
        self._c.begin_forward(False)
        try:
            self._fetch(params)
        except BaseException:
            self._c.end_forward(False)
            raise

    def end_read(self, params):
        if self._stage < 3:
            return
        try:
            self._release(params)
        finally:
            self._c.end_forward(True)

    def _refuse_load_state_dict(self, state_dict, prefix, *args):
        """The engine's fp32 master is the parameters' source of truth (each step writes the
        torch parameters from it): values copied into the module would be lost, so refused."""
        raise RuntimeError(f"load_state_dict on the model after zinfinity.initialize ({prefix or 'the model'}"
                           "): the engine holds the trained parameters; load the weights before "
                           "initialize, or restore an engine checkpoint with load_checkpoint")

    def frozen_state(self):
        return {name: p.detach().clone() for name, p in self.frozen}

    def load_frozen(self, values):
        own = dict(self.frozen)
        for name, value in values.items():
            if name in own:
                own[name].data.copy_(value)

    def describe(self, config_text):
        facts = self._c.config()
        return json.dumps({"names": self.names, "shapes": [list(s) for s in self.shapes],
                           "dtypes": [str(d) for d in self.dtypes], "config": config_text,
                           "micro": facts["train_micro_batch_size_per_gpu"],
                           "gas": facts["gradient_accumulation_steps"]})

    def check_same_model(self, described, where):
        names, shapes = described.get("names", []), [tuple(s) for s in described.get("shapes", [])]
        for i, (name, shape) in enumerate(zip(self.names, self.shapes)):
            if i >= len(names):
                raise ValueError(f"checkpoint {where}: another model: it has no parameter {name}")
            if names[i] != name or shapes[i] != shape:
                raise ValueError(f"checkpoint {where}: another model: parameter {i} is {names[i]} "
                                 f"{list(shapes[i])} there, {name} {list(shape)} here")
        if len(names) != len(self.names):
            raise ValueError(f"checkpoint {where}: another model: {len(names)} trained "
                             f"parameters there, {len(self.names)} here")


_PENDING_BYTES = 64 << 20  # gradients held for the engine's stream before waiting for it


class _SavedView:
    """The tag of a saved tensor packed as a view of a gathered parameter."""


def _as_param(view, shape, dtype):
    t = torch.frombuffer(view, dtype=torch.float32).view(shape)
    return t if dtype == torch.float32 else t.to(dtype)


# ---- zero.Init: parameters written out as modules are built -----------------------------------
_INIT_STACK = []


def _zinf_shape(p):
    return getattr(p, "ds_shape", p.shape)


def _init_values(p):
    """fp32 contiguous values of p for the engine's initialisation (a view of Init's file for a
    parameter built under Init)."""
    store = getattr(p, "_zinf_init", None)
    if store is not None:
        return store.view_of(p)
    values = p.detach()
    if values.dtype != torch.float32 or not values.is_contiguous():
        values = values.float().contiguous()
    return values


def _release_init_store(p):
    if getattr(p, "_zinf_init", None) is not None:
        p.data = torch.empty(0, dtype=p.dtype)
        del p._zinf_init


class _InitStore:
    """Parameters built under Init, in one file (unlinked once created): fp32 values appended
    as each module is built, read back through a memory map by initialize."""

    def __init__(self, directory):
        os.makedirs(directory, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix="zinfinity-init-", suffix=".fp32", dir=directory)
        os.unlink(path)  # nothing left behind, whatever happens
        self.fd = fd
        self.size = 0
        self.where = {}
        self.map = None

    def put(self, p):
        values = p.detach().float().contiguous()
        data = values.numpy().tobytes()
        os.pwrite(self.fd, data, self.size)
        self.where[id(p)] = (self.size, values.numel())
        self.size += len(data)
        p.ds_shape = p.shape
        p.ds_numel = p.numel()
        p._zinf_init = self
        p.data = torch.empty(0, dtype=p.dtype)

    def __del__(self):
        try:
            if self.map is not None:
                self.map.close()
        except BufferError:  # a view still alive: the map goes with it
            pass
        os.close(self.fd)

    def view_of(self, p):
        if self.map is None:
            self.map = mmap.mmap(self.fd, self.size, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        offset, numel = self.where[id(p)]
        return torch.frombuffer(self.map, dtype=torch.float32, count=numel,
                                offset=offset).view(p.ds_shape)

    def write(self, p, values):
        offset, numel = self.where[id(p)]
        os.pwrite(self.fd, values.detach().float().contiguous().numpy().tobytes(), offset)


class Init:
    """Modules constructed inside ``with zinfinity.zero.Init(config=...)`` have their parameters
    written out (to a file under ``offload_param.nvme_path``, or ``remote_device``/``path``) as
    each module finishes construction, their torch storage emptied (``param.ds_shape`` keeps the
    shape), so a model larger than host memory can be built; ``initialize`` then partitions them
    into the engine's tiers. ``GatheredParameters`` reads or modifies them in between."""

    def __init__(self, module=None, config=None, config_dict_or_path=None, path=None,
                 enabled=True, **unused):
        self.enabled = enabled
        config = config if config is not None else config_dict_or_path
        if isinstance(config, (str, os.PathLike)):
            with open(config, encoding="utf-8") as f:
                config = json.load(f)
        if path is None:
            offload = ((config or {}).get("zero_optimization", {}).get("offload_param") or {})
            nvme = offload.get("nvme_path")
            path = nvme[0] if isinstance(nvme, list) else nvme
        self.path = path or tempfile.gettempdir()
        self.store = None
        self._patched = None
        if module is not None and enabled:
            self.store = _InitStore(self.path)
            for m in module.modules():
                self._convert(m)

    def _convert(self, module):
        for p in module._parameters.values():
            if p is not None and getattr(p, "_zinf_init", None) is None and p.numel() > 0:
                self.store.put(p)

    def __enter__(self):
        if not self.enabled:
            return self
        self.store = self.store or _InitStore(self.path)
        init = self

        def patched_init(cls):
            orig = cls.__dict__.get("__init__")
            if orig is None or getattr(orig, "_zinf_wrapped", False):
                return

            def wrapped(module, *args, **kwargs):
                depth = module.__dict__.get("_zinf_init_depth", 0)
                object.__setattr__(module, "_zinf_init_depth", depth + 1)
                try:
                    orig(module, *args, **kwargs)
                finally:
                    object.__setattr__(module, "_zinf_init_depth", depth)
                if depth == 0 and _INIT_STACK and _INIT_STACK[-1] is init:
                    init._convert(module)

            wrapped._zinf_wrapped = True
            wrapped._zinf_orig = orig
            cls.__init__ = wrapped
            self._patched.append(cls)

        self._patched = []
        todo = [torch.nn.Module]
        while todo:
            cls = todo.pop()
            todo.extend(cls.__subclasses__())
            if cls is not torch.nn.Module:
                patched_init(cls)
        self._subclass_hook = patched_init
        _INIT_STACK.append(self)
        self._old_init_subclass = torch.nn.Module.__dict__.get("__init_subclass__")

        def init_subclass(cls, **kwargs):
            super(torch.nn.Module, cls).__init_subclass__(**kwargs)
            if _INIT_STACK:
                _INIT_STACK[-1]._subclass_hook(cls)

        torch.nn.Module.__init_subclass__ = classmethod(init_subclass)
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        _INIT_STACK.remove(self)
        for cls in self._patched:
            cls.__init__ = cls.__init__._zinf_orig
        if self._old_init_subclass is None:
            del torch.nn.Module.__init_subclass__
        else:
            torch.nn.Module.__init_subclass__ = self._old_init_subclass
        return False


_ACTIVE = []  # Partitioners of live engines, for GatheredParameters


class GatheredParameters:
    """``with GatheredParameters(params, modifier_rank=None):`` the parameters are whole torch
    tensors inside the block. Built under ``Init`` and not yet given to ``initialize``, changes
    made inside (with ``modifier_rank`` set) are kept: custom initialisation. Under an engine,
    the values are read-only: ``modifier_rank=None`` reads them (changes are discarded, as
    DeepSpeed's), and a ``modifier_rank`` is refused, since the engine's fp32 master (in its
    optimizer states) would not see the change."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        if isinstance(params, torch.Tensor):
            params = [params]
        self.params = [p for p in params if getattr(p, "_zinf_init", None) is not None or
                       getattr(p, "_zinf_partitioner", None) is not None]
        self.modifier_rank = modifier_rank
        self.enabled = enabled

    def __enter__(self):
        if not self.enabled:
            return self
        engine_params = [p for p in self.params if getattr(p, "_zinf_init", None) is None]
        if engine_params and self.modifier_rank is not None:
            raise RuntimeError(
                "GatheredParameters(modifier_rank=...) after initialize: the engine holds these "
                "parameters and their fp32 master, and does not take changes made here; modify "
                "them before initialize (under zero.Init), or read them with modifier_rank=None")
        self.partitioner = engine_params[0]._zinf_partitioner if engine_params else None
        if self.partitioner is not None:
            self.partitioner.gather_for_read(engine_params)
        self.engine_params = engine_params
        for p in self.params:
            store = getattr(p, "_zinf_init", None)
            if store is not None:
                p.data = store.view_of(p).clone().to(p.dtype)
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        for p in self.params:
            store = getattr(p, "_zinf_init", None)
            if store is not None:
                if self.modifier_rank is not None:
                    store.write(p, p.data)
                p.data = torch.empty(0, dtype=p.dtype)
        if self.partitioner is not None:
            self.partitioner.end_read(self.engine_params)
        return False


def register_external_parameter(module, parameter):
    """DeepSpeed's: ``parameter`` is fetched whenever ``module`` runs (the front end also finds
    such uses by itself on access)."""
    if not isinstance(parameter, torch.nn.Parameter):
        raise RuntimeError("Parameter is not a torch.nn.Parameter")
    external = getattr(module, "_zinf_external", None)
    if external is None:
        module._zinf_pending_external = getattr(module, "_zinf_pending_external", []) + [parameter]
    elif not any(parameter is p for p in module._zinf_registered):
        module._zinf_registered.append(parameter)
        if not any(parameter is p for p in external):
            external.append(parameter)
