"""Checkpoints of ``zinfinity.initialize``'s engine as plain torch weights.

``consolidate(checkpoint_dir, out_path)`` writes a ``torch.save``-loadable fp32 state_dict (the
names of ``model.state_dict()``: trained parameters from the optimizer's fp32 masters, frozen
parameters and buffers as saved) from a checkpoint of any stage, placement and world size,
without building the model: DeepSpeed's ``zero_to_fp32.py`` job. The engine that reads it is
the checkpoint's own config at one rank (re-partitioning the shards), so its states stay within
that config's budgets; the output tensors live in a memory-mapped file beside ``out_path``
while they are written, so host memory holds one parameter at a time.
"""

import io
import json
import os

import torch

from . import _C

__all__ = ["consolidate", "get_fp32_state_dict_from_zero_checkpoint"]


def _tag_of(checkpoint_dir, tag):
    if tag is not None:
        return str(tag)
    latest = os.path.join(checkpoint_dir, "latest")
    if not os.path.isfile(latest):
        raise ValueError(f"{checkpoint_dir}: no 'latest' file; give the tag")
    with open(latest, encoding="utf-8") as f:
        return f.read().strip()


def _one_rank_config(described):
    config = json.loads(described["config"])
    config["train_micro_batch_size_per_gpu"] = described["micro"]
    config["gradient_accumulation_steps"] = described["gas"]
    config["train_batch_size"] = described["micro"] * described["gas"]
    return json.dumps(config)


def _read_engine(checkpoint_dir, tag):
    # A throw-away engine only to read the record: the smallest config there is.
    probe = _C.TorchEngine(json.dumps({"train_batch_size": 1}), "<probe>", ["p"], [[1]], [0])
    try:
        described = probe.read_checkpoint_extra(checkpoint_dir, tag, "torch_front_end")
        state = probe.read_checkpoint_extra(checkpoint_dir, tag, "torch_state")
    finally:
        probe.close()
    if described is None:
        raise ValueError(f"checkpoint {checkpoint_dir}/{tag}: not saved by "
                         "zinfinity.initialize's engine")
    described = json.loads(described.decode())
    engine = _C.TorchEngine(_one_rank_config(described), f"{checkpoint_dir}/{tag}",
                            described["names"], described["shapes"],
                            [0] * len(described["names"]))
    return engine, described, (torch.load(io.BytesIO(state)) if state is not None else {})


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None, storage_path=None):
    """The consolidated fp32 state_dict (an OrderedDict of name -> tensor). With
    ``storage_path``, the trained parameters' tensors share one memory-mapped file there."""
    checkpoint_dir = os.fspath(checkpoint_dir)
    tag = _tag_of(checkpoint_dir, tag)
    engine, described, state = _read_engine(checkpoint_dir, tag)
    try:
        engine.load_checkpoint(checkpoint_dir, tag)
        shapes = [torch.Size(s) for s in described["shapes"]]
        total = sum(s.numel() for s in shapes)
        if storage_path is not None:
            flat = torch.from_file(storage_path, shared=True, size=total, dtype=torch.float32)
        else:
            flat = torch.empty(total, dtype=torch.float32)
        out = {}
        for name, value in state.get("buffers", {}).items():
            out[name] = value.float() if value.is_floating_point() else value
        for name, value in state.get("frozen", {}).items():
            out[name] = value.float()
        engine.begin_forward(False)
        at = 0
        try:
            for i, (name, shape) in enumerate(zip(described["names"], shapes)):
                view = torch.frombuffer(engine.fetch(i), dtype=torch.float32)
                piece = flat[at:at + shape.numel()]
                piece.copy_(view)
                engine.release(i)
                out[name] = piece.view(shape)
                at += shape.numel()
        finally:
            engine.end_forward(True)
        return out
    finally:
        engine.close()


def consolidate(checkpoint_dir, out_path, tag=None):
    """Writes the checkpoint's fp32 weights to ``out_path`` with ``torch.save`` (a flat
    name -> tensor dict, loadable with ``model.load_state_dict(torch.load(out_path))``).
    Returns the number of tensors written."""
    out_path = os.fspath(out_path)
    storage = out_path + ".partial-storage"
    try:
        sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, storage_path=storage)
        # The parameters share the one mapped storage: torch.save writes it once, from the map.
        tmp = out_path + ".tmp"
        torch.save(sd, tmp)
        os.replace(tmp, out_path)
        return len(sd)
    finally:
        if os.path.exists(storage):
            os.unlink(storage)
