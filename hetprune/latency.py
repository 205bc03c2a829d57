"""Latency tables: a model's forward time predicted from its parts, each measured once per device.

A model's time is predicted as the time of everything outside its blocks
(embedding, head) plus the time of each block. A block is timed *in context*:
a copy of the model whose every block is a separate copy of that block is
timed whole, and the outside part (the model with every block dropped),
timed in the same interleaved rounds, is subtracted and the rest divided by
the depth. Timed alone, one block's weights stay in the CPU's cache and its
calls leave out the model's dispatch between blocks (in one run on DeiT-B at
batch 8 that under-predicted the speedups of merged and attention-free
blocks by 13-36 %). A block whose
inputs differ in shape from another block's (a model with stages) cannot be
copied into every slot, and is timed alone (``solo``). Timing is
interleaved and repeated as ``hetprune bench`` times whole models (median of
the repeats). A part is keyed
by its *structure* (module types, their settings and parameter shapes) and
its input shapes: a block without its attention, with a merged MLP, dropped,
or width-pruned is a different entry, measured the first time it is asked
for. So a prediction for a pruned model costs nothing once its kinds of block
are in the table.

The table is cached on disk (``cache_dir()/latency``), keyed by the device's
name, torch/timm versions, thread count, dtype, batch size and backend: a
rerun reuses it, and another GPU, batch size or dtype never does.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from . import bench, devices
from .adapters import adapter_for
from .cache import cache_dir, fingerprint
from .costs import hooked_forward
from .errors import HetpruneError
from .io import read_json, write_json_atomic

VERSION = 2   # of the table format and of how parts are timed (2: blocks in context)
OUTSIDE = "outside"


def structure(module: nn.Module, skip: set[int] = frozenset()) -> list:
    """What a module computes, without its weights' values: every submodule's type and settings, every
    parameter's and buffer's shape and dtype. Submodules whose ``id`` is in ``skip`` are left out."""
    out = []
    for name, m in _named_modules(module, skip):
        facts = {k: getattr(m, k) for k in ("num_heads", "fused_attn", "attn_mode") if isinstance(
            getattr(m, k, None), (bool, int, str))}
        own = [(n, list(t.shape), str(t.dtype)) for n, t in list(m.named_parameters(recurse=False))
               + list(m.named_buffers(recurse=False)) if t is not None]
        out.append([name, type(m).__name__, m.extra_repr(), facts, own])
    return out


def _named_modules(module: nn.Module, skip: set[int], prefix: str = ""):
    if id(module) in skip:
        return
    yield prefix, module
    for name, child in module.named_children():
        yield from _named_modules(child, skip, f"{prefix}.{name}" if prefix else name)


def _shapes(value):
    if isinstance(value, torch.Tensor):
        return [list(value.shape), str(value.dtype)]
    if isinstance(value, (list, tuple)):
        return [_shapes(v) for v in value]
    if isinstance(value, dict):
        return {k: _shapes(v) for k, v in sorted(value.items())}
    return repr(value)


@dataclass
class Part:
    """One timed piece of a forward pass: its table key, and (when it must be timed) how to run it."""

    key: str
    what: str                                  # "outside" or "block 3"
    block: nn.Module | None = None             # None: the outside part
    run: Callable[[], object] | None = None


@dataclass
class LatencyTable:
    """Per-device table of part times (seconds per forward at ``batch_size``), with a disk cache."""

    device: torch.device
    batch_size: int = 64
    dtype: str = "fp32"
    repeats: int = 5
    warmup: int = 2
    min_time_s: float = 0.2      # per repeat: shorter windows on a small model read 70 % slow (digits, batch 1)
    cache: bool = True
    log: Callable[[str], None] = print
    entries: dict = field(default_factory=dict)
    measured_now: int = 0           # parts timed by this process (0: all came from the cache)
    warned: bool = False            # a busy machine is reported once per table

    def __post_init__(self):
        self.device = devices.resolve(self.device)
        bench.check_dtype(self.dtype, self.device)
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise HetpruneError(f"latency batch_size must be a whole number >= 1, got {self.batch_size!r}")
        self.key = self._key()   # fixed when the table is made (threads, versions, device)
        if self.cache and self.path.is_file():
            try:
                data = read_json(self.path, "latency table")
            except HetpruneError as exc:   # a cache: what cannot be read is measured again
                self.log(f"latency table: {exc}; measuring afresh")
                data = {}
            if isinstance(data, dict) and data.get("key") == self.key and isinstance(data.get("entries"), dict):
                self.entries = dict(data["entries"])

    # -- the cache -------------------------------------------------------------------------------
    def _key(self) -> dict:
        """What a measured time depends on beyond the part itself."""
        env = bench.environment(self.device, self.dtype, compile=False)
        return {"v": VERSION, "device": env["device_name"], "device_type": self.device.type,
                "torch": env["torch"], "timm": env.get("timm"), "cuda": env.get("cuda"),
                "threads": torch.get_num_threads(), "dtype": self.dtype, "batch_size": self.batch_size,
                "backend": "torch"}

    @property
    def path(self) -> Path:
        return cache_dir() / "latency" / f"{fingerprint(self.key)}.json"

    def save(self) -> None:
        if self.cache:
            write_json_atomic(self.path, {"key": self.key, "entries": self.entries})

    # -- prediction ------------------------------------------------------------------------------
    def predict(self, model: nn.Module, example: torch.Tensor) -> float:
        """Predicted seconds of one forward pass of ``model`` at ``batch_size`` (parts measured if new)."""
        return sum(self.breakdown(model, example).values())

    def breakdown(self, model: nn.Module, example: torch.Tensor) -> dict[str, float]:
        """Predicted seconds per part: ``outside`` and ``block i``."""
        parts = self.parts(model, example)
        missing = {p.key: p for p in parts if p.key not in self.entries}
        if missing:
            self.measure_parts(model, example, list(missing.values()))
        return {p.what: self.entries[p.key]["median_s"] for p in parts}

    def parts(self, model: nn.Module, example: torch.Tensor) -> list[Part]:
        """The outside part and one part per block, keyed by structure and by input shapes (seen in a
        forward pass of one image; the table's key holds the batch size)."""
        blocks = adapter_for(model).blocks(model)
        inputs = _block_inputs(model, blocks, example[:1])
        skip = {id(b) for b in blocks}
        parts = [Part(fingerprint({"part": OUTSIDE, "structure": structure(model, skip),
                                   "input": _shapes(example[:1])}), OUTSIDE)]
        for i, b in enumerate(blocks):
            key = fingerprint({"part": "block", "structure": structure(b), "input": _shapes(inputs[i])})
            parts.append(Part(key, f"block {i}", b))
        return parts

    def measure_parts(self, model: nn.Module, example: torch.Tensor, parts: list[Part]) -> None:
        """Time ``parts`` of ``model`` (one per key) interleaved, at ``batch_size``, and store them."""
        from . import surgery

        x = torch.randn(self.batch_size, *example.shape[1:], device=example.device, dtype=example.dtype)
        adapter = adapter_for(model)
        blocks = adapter.blocks(model)
        inputs = _block_inputs(model, blocks, x)
        # every block called alike (same input shapes and keywords): a copy of any block fits every slot
        in_context = len({fingerprint(_shapes(list(a)) + [sorted(k)]) for a, k in inputs}) == 1
        asked = list(parts)
        outside_part = next((p for p in parts if p.block is None), None)
        subtract = in_context and any(p.block is not None for p in asked)
        if outside_part is None and subtract:   # block times in context subtract the outside, timed alongside
            outside_part = Part("outside, again", OUTSIDE)
            parts = [outside_part] + asked
        for p in parts:
            if p.block is None:
                twin = copy.deepcopy(model)
                for i in set(range(len(blocks))) - set(surgery.dropped_blocks(twin)):
                    surgery.drop_block(twin, i)
                p.run = lambda twin=twin.eval(): twin(x)
            elif in_context:
                twin = copy.deepcopy(model)
                for i in range(len(blocks)):   # separate copies: as many weights to stream as the real model
                    adapter.set_block(twin, i, copy.deepcopy(p.block))
                p.run = lambda twin=twin.eval(): twin(x)
            else:
                args, kwargs = inputs[blocks.index(p.block)]
                p.run = lambda b=p.block, a=args, k=kwargs: b(*a, **k)
        self.log(f"latency table: timing {len(asked)} new part(s) ({', '.join(p.what for p in asked)}) at batch "
                 f"{self.batch_size}, {self.dtype}, on {self.key['device']} ...")
        load = bench.load_average()
        # the load average counts this process's own threads too: warn when others use half the CPUs
        others = load[0] - torch.get_num_threads() if load is not None else 0.0
        if self.device.type == "cpu" and others > 0.5 * (os.cpu_count() or 1) and not self.warned:
            self.warned = True
            self.log(f"latency table: warning: load average {load[0]} on {os.cpu_count()} CPUs with "
                     f"{torch.get_num_threads()} threads of ours; times measured on a busy machine are kept in "
                     f"{self.path} (delete it to measure again when the machine is quiet)")
        runners = {p.key: bench._Runner(None, None, self.device, self.dtype, fn=p.run) for p in parts}
        timed = bench.time_interleaved(runners, self.repeats, self.warmup, self.min_time_s, warm_long_once=True)
        outside = timed[outside_part.key]["latency_s"]["median"] if subtract else 0.0
        for p in parts:
            p.run = None
        for p in asked:
            lat = timed[p.key]["latency_s"]
            entry = {"what": p.what, "median_s": lat["median"], "q1_s": lat["q1"], "q3_s": lat["q3"],
                     "calls_per_repeat": timed[p.key]["calls_per_repeat"], "load": load, "timed": "solo"}
            if p.block is not None and in_context:   # the model of copies of this block, less the outside
                entry.update({f"{q}_s": max(0.0, (lat[q] - outside) / len(blocks)) for q in ("median", "q1", "q3")},
                             timed="in context", copies=len(blocks))
            self.entries[p.key] = entry
        self.measured_now += len(asked)
        self.save()


@torch.inference_mode()
def _block_inputs(model: nn.Module, blocks: list[nn.Module], x: torch.Tensor) -> list:
    """``(args, kwargs)`` each block is called with in a forward pass of ``model`` on ``x``."""
    captured: list = [((), {})] * len(blocks)
    handles = []
    for i, b in enumerate(blocks):
        def grab(mod, args, kwargs, i=i):
            captured[i] = (args, kwargs)
        handles.append(b.register_forward_pre_hook(grab, with_kwargs=True))
    hooked_forward(model, x, handles)
    return captured


def default_dtype(device: torch.device) -> str:
    """bf16 on a CUDA device with native bf16 (what ``--amp auto`` runs), else fp32."""
    return "bf16" if devices.resolve_amp("auto", device) == "bf16" else "fp32"
