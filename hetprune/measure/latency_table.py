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
interleaved in many short rounds (``budget_s`` per part). A part is keyed
by its *structure* (module types, their settings and parameter shapes) and
its input shapes: a block without its attention, with a merged MLP, dropped,
or width-pruned is a different entry, measured the first time it is asked
for. So a prediction for a pruned model costs nothing once its kinds of block
are in the table.

A shared machine's speed drifts by up to 2x over seconds (digits at batch 1
on 2 cores), so parts timed in different sessions do not compare. Parts
needed together are timed in one session (`LatencyTable.prepare`: a
depth budget's dense block, its variants and the outside), and a later
session re-times known parts beside the new ones (the *anchors*) and maps its
times onto the table's. A busy machine does not slow every part alike: the
compute of a 2-thread matmul takes twice as long when another process holds a
core, while a forward call's fixed cost (Python dispatch, the calls of small
layers) barely moves. So the anchors are two, the outside (mostly that fixed
cost) and a block timed in context (mostly compute), and each round's times
are mapped by the line through them (stored = a + b x this session's): a
drift of the compute alone and a drift of everything alike both map back
exactly, where one ratio to the outside (version 3) read a new block's
compute as slowed as much as the outside's fixed cost and over-predicted it
(up to 2x where that fixed cost dominates the outside). With one known part
only, its ratio scales the session.

A prediction is only as good as the session it was timed in. So
`LatencyTable.prepare` also times the first model it is given (the
model a budget prunes) whole, in the same rounds, and compares that with the
sum of its parts (the *self-check*). When the two disagree by more than
``tolerance``, or other processes keep half the CPUs busy, the table says in
one line that its predictions cannot be trusted here and offers the MAC model
(``--cost-model macs``), and keeps the reason in `LatencyTable.untrusted`
(the run's report shows it) and in the disk cache, so a later run that reads
those times says so again (and how to time them afresh: delete the file).

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

from . import bench
from .bench.environment import environment   # from its module: an old-path import of it rebinds bench.environment
from ..core import devices
from ..model.adapters import adapter_for
from ..core.keys import fingerprint, found
from ..core.io import cache_dir
from ..model.macs import hooked_forward
from ..core.errors import HetpruneError
from ..core.io import read_json, write_json_atomic

VERSION = 4   # of the table format and of how parts are timed (2: blocks in context; 3: one session, anchored;
#               4: two anchors, a line; the self-check)
OUTSIDE = "outside"
CHECK = "self-check"   # the runner of a model timed whole beside its parts


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
    model: nn.Module | None = None             # the model it is part of: the template of its timed twin
    outside: str = ""                          # the key of that model's outside part
    in_context: bool = False                   # a block timed as every block of a copy of its model


@dataclass
class LatencyTable:
    """Per-device table of part times (seconds per forward at ``batch_size``), with a disk cache."""

    device: torch.device
    batch_size: int = 64
    dtype: str = "fp32"
    repeats: int = 5             # rounds at least; as many as fit budget_s per part
    warmup: int = 2
    min_time_s: float = 0.05     # per round
    budget_s: float = 1.0        # per part: the rounds' total (a call longer than that: ``repeats`` rounds)
    cache: bool = True
    log: Callable[[str], None] = print
    entries: dict = field(default_factory=dict)
    measured_now: int = 0           # parts timed by this process (0: all came from the cache)
    tolerance: float = 0.10         # the self-check's |predicted / measured - 1| past which predictions are untrusted
    check: dict | None = None       # the last self-check: the checked model's predicted and measured whole time
    untrusted: str = ""             # why this table's predictions cannot be trusted here ("": they can)

    def __post_init__(self):
        self.device = devices.resolve(self.device)
        if not (isinstance(self.budget_s, (int, float)) and not isinstance(self.budget_s, bool) and self.budget_s > 0):
            raise HetpruneError(f"latency budget_s must be a number of seconds > 0, got {self.budget_s!r}")
        bench.check_dtype(self.dtype, self.device)
        if isinstance(self.tolerance, bool) or not isinstance(self.tolerance, (int, float)) or not self.tolerance > 0:
            raise HetpruneError(f"latency tolerance must be a fraction > 0 (0.1: 10 %), got {self.tolerance!r}")
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
                self.check = data.get("check") if isinstance(data.get("check"), dict) else None
                if isinstance(data.get("untrusted"), str) and data["untrusted"]:
                    self.untrusted = data["untrusted"]
                    self.log(f"latency table: warning: the cached times in {self.path} cannot be trusted: "
                             f"{self.untrusted}; delete that file to time them again on a quiet machine, or count "
                             "MACs with --cost-model macs")

    # -- the cache -------------------------------------------------------------------------------
    def _key(self) -> dict:
        """What a measured time depends on beyond the part itself."""
        env = environment(self.device, self.dtype, compile=False)
        return {"v": VERSION, "device": env["device_name"], "device_type": self.device.type,
                "torch": env["torch"], "timm": env.get("timm"), "cuda": env.get("cuda"),
                "threads": torch.get_num_threads(), "dtype": self.dtype, "batch_size": self.batch_size,
                "backend": "torch"}

    @property
    def path(self) -> Path:
        key = fingerprint(self.key)
        return found(cache_dir() / "latency" / f"{key}.json", cache_dir() / "latency" / f"{key.before}.json")

    def save(self) -> None:
        """Write the table to the disk cache, with its self-check and why its times cannot be trusted (if so)."""
        if self.cache:
            write_json_atomic(self.path, {"key": self.key, "entries": self.entries, "check": self.check,
                                          "untrusted": self.untrusted})

    # -- prediction ------------------------------------------------------------------------------
    def predict(self, model: nn.Module, example: torch.Tensor) -> float:
        """Predicted seconds of one forward pass of ``model`` at ``batch_size`` (parts measured if new)."""
        return sum(self.breakdown(model, example).values())

    def breakdown(self, model: nn.Module, example: torch.Tensor) -> dict[str, float]:
        """Predicted seconds per part: ``outside`` and ``block i``."""
        parts = self.parts(model, example)
        self._measure_missing(parts, example)
        return {p.what: self.entries[p.key]["median_s"] for p in parts}

    def prepare(self, models: list[nn.Module], example: torch.Tensor) -> None:
        """Time every part of ``models`` the table lacks, all in one session (e.g. a dense model and its
        depth variants, before a budget compares them), with the first model timed whole beside them as the
        self-check of the session's predictions."""
        parts = [p for m in models for p in self.parts(m, example)]
        self._measure_missing(parts, example, check=models[0] if models else None)

    def _measure_missing(self, parts: list[Part], example: torch.Tensor, check: nn.Module | None = None) -> None:
        missing = {p.key: p for p in parts if p.key not in self.entries}
        if missing:
            self.measure_parts(example, list(missing.values()), known=parts, check=check)

    def parts(self, model: nn.Module, example: torch.Tensor) -> list[Part]:
        """The outside part and one part per block, keyed by structure and by input shapes (seen in a
        forward pass of one image; the table's key holds the batch size)."""
        blocks = adapter_for(model).blocks(model)
        inputs = _block_inputs(model, blocks, example[:1])
        skip = {id(b) for b in blocks}
        outside = fingerprint({"part": OUTSIDE, "structure": structure(model, skip), "input": _shapes(example[:1])})
        # every block called alike (same input shapes and keywords): a copy of any block fits every slot
        calls = [_shapes(list(a)) + [sorted(k)] for a, k in inputs]
        alike = all(call == calls[0] for call in calls)
        parts = [Part(outside, OUTSIDE, None, model, outside)]
        for i, b in enumerate(blocks):
            key = fingerprint({"part": "block", "structure": structure(b), "input": _shapes(inputs[i])})
            parts.append(Part(key, f"block {i}", b, model, outside, in_context=alike))
        return parts

    def measure_parts(self, example: torch.Tensor, parts: list[Part], known: list[Part] = (),
                      check: nn.Module | None = None) -> None:
        """Time ``parts`` (one per key, each with its model) in one interleaved session at ``batch_size``, and
        store them. When the table has entries, up to two of ``known`` already in it are timed too, as the
        anchors the new times are mapped by (`_anchors`). ``check``: a model timed whole in the same rounds, whose
        measured time is compared with the sum of its parts (`_self_check`)."""
        x = torch.randn(self.batch_size, *example.shape[1:], device=example.device, dtype=example.dtype)
        asked = list(parts)
        solo_inputs: dict[int, tuple] = {}   # per model with a block timed solo: (its blocks, their inputs at x)

        def runner(p: Part) -> Callable[[], object]:
            if p.block is None or p.in_context:
                return _twin_runner(p, x)
            if id(p.model) not in solo_inputs:   # a full-batch forward pass, only where a block is timed alone
                blocks = adapter_for(p.model).blocks(p.model)
                solo_inputs[id(p.model)] = (blocks, _block_inputs(p.model, blocks, x))
            blocks, inputs = solo_inputs[id(p.model)]
            args, kwargs = inputs[blocks.index(p.block)]
            return lambda: p.block(*args, **kwargs)

        timed_parts = {p.key: p for p in asked}
        for p in asked:   # a block timed in context subtracts its model's outside, timed alongside
            if p.in_context and p.outside not in timed_parts:
                timed_parts[p.outside] = Part(p.outside, OUTSIDE, None, p.model, p.outside)
        anchors = _anchors([p for p in known if p.key in self.entries], self.entries)
        for a in anchors:
            timed_parts.setdefault(a.key, a)
        runners = {key: bench.Runner(None, None, self.device, self.dtype, fn=runner(p))
                   for key, p in timed_parts.items()}
        if check is not None:   # the model itself, whole: what its parts must add up to
            check.eval()
            runners[CHECK] = bench.Runner(check, x, self.device, self.dtype)
        self.log(f"latency table: timing {len(asked)} new part(s) ({', '.join(p.what for p in asked)}) at batch "
                 f"{self.batch_size}, {self.dtype}, on {self.key['device']} ...")
        load = bench.load_average()
        busy = self._busy(load)
        timed = bench.time_interleaved(runners, self.repeats, self.warmup, self.min_time_s, warm_long_once=True,
                                       budget_s=self.budget_s)
        runs = {key: t["latency_s"]["runs"] for key, t in timed.items()}
        # each round's times in the table's scale, so what the machine's drift does to a round cancels: in a
        # first session the scale of one part's median here, in a later one the stored times of the anchors
        if not anchors:
            first = next((p for p in asked if p.in_context), asked[0])
            anchors, stored = [first], [bench.summarize(runs[first.key])["median"]]
            anchored = f"{first.what}, this session"
        else:
            stored = [_whole(self.entries[a.key]) for a in anchors]
            anchored = " and ".join(a.what for a in anchors) + ", from the table"
        runs = _to_scale(runs, [runs[a.key] for a in anchors], stored)
        for p in asked:
            entry = {"what": p.what, "calls_per_repeat": timed[p.key]["calls_per_repeat"], "load": load,
                     "rounds": len(runs[p.key]), "timed": "solo", "anchor": anchored}
            values = runs[p.key]
            if p.in_context:   # the model of copies of this block, less the outside, per round
                n = len(adapter_for(p.model).blocks(p.model))
                entry.update(timed="in context", copies=n, whole_s=bench.summarize(values)["median"])
                values = [max(0.0, (v - o) / n) for v, o in zip(values, runs[p.outside])]
            lat = bench.summarize(values)
            entry.update(median_s=lat["median"], q1_s=lat["q1"], q3_s=lat["q3"])
            self.entries[p.key] = entry
        self.measured_now += len(asked)
        reasons = [busy] if busy else []
        if check is not None:
            self.check = self._self_check(check, example, runs[CHECK], load, known)
            if abs(self.check["error"]) > self.tolerance:
                reasons.append(f"the model timed whole took {self.check['measured_s'] * 1e3:.3g} ms, its parts add "
                               f"up to {self.check['predicted_s'] * 1e3:.3g} ms ({self.check['error']:+.0%}, more "
                               f"than the {self.tolerance:.0%} allowed)")
        if reasons and not self.untrusted:
            self.untrusted = "; ".join(reasons)
            self.log(f"latency table: warning: predictions cannot be trusted here: {self.untrusted}; "
                     "--cost-model macs counts MACs instead (device-independent)")
        self.save()

    def _busy(self, load) -> str:
        """Why this machine is too busy to time on (``""``: it is not): other processes keep half its CPUs
        busy (the load average counts this process's own threads too)."""
        others = load[0] - torch.get_num_threads() if load is not None else 0.0
        if self.device.type != "cpu" or others <= 0.5 * (os.cpu_count() or 1):
            return ""
        return (f"load average {load[0]} on {os.cpu_count()} CPUs with {torch.get_num_threads()} threads of ours "
                "(other work is timed with it)")

    def _self_check(self, model: nn.Module, example: torch.Tensor, runs: list[float], load,
                    known: list[Part] = ()) -> dict:
        """The checked model's predicted time (the sum of its parts, all in the table now) against its
        measured whole time in the same session (in the anchor's scale, as the parts are). Its parts are
        among ``known`` when the caller found them already (``prepare``), else found here."""
        mine = [p for p in known if p.model is model] or self.parts(model, example)
        predicted = sum(self.entries[p.key]["median_s"] for p in mine)
        measured = bench.summarize(runs)["median"]
        return {"predicted_s": predicted, "measured_s": measured, "error": predicted / measured - 1 if measured > 0
                else 0.0, "load": load}


def _anchors(stored: list[Part], entries: dict) -> list[Part]:
    """The known parts a later session re-times to map its times by: the cheapest one (the outside: mostly
    fixed cost per call) and the cheapest block timed in context (mostly compute), or what there is."""
    if not stored:
        return []
    cheapest = min(stored, key=lambda p: _whole(entries[p.key]))
    blocks = [p for p in stored if p.in_context and p.block is not None and p.key != cheapest.key]
    return [cheapest] + ([min(blocks, key=lambda p: _whole(entries[p.key]))] if blocks else [])


def _to_scale(runs: dict[str, list[float]], anchor_runs: list[list[float]], stored: list[float]) -> dict:
    """Each round's times mapped onto the table's scale: by the line through the two anchors' (this round's
    time, stored time), or with one anchor (or two whose times do not order alike) by its ratio."""
    def line(i: int):
        now = [r[i] for r in anchor_runs]
        if len(now) == 2 and now[1] > now[0] > 0 and stored[1] > stored[0]:
            slope = (stored[1] - stored[0]) / (now[1] - now[0])
            return lambda v: stored[0] + slope * (v - now[0])
        ref, was = (now[-1], stored[-1])
        return (lambda v: was * v / ref) if ref > 0 else (lambda v: v)
    maps = [line(i) for i in range(len(anchor_runs[0]))]
    return {key: [maps[i](v) for i, v in enumerate(r)] for key, r in runs.items()}


def _twin_runner(p: Part, x: torch.Tensor) -> Callable[[], object]:
    """What timing part ``p`` calls: its model with every block dropped (the outside), or with every block a
    separate copy of ``p.block`` (in context: as many weights to stream as the real model)."""
    adapter = adapter_for(p.model)
    blocks = adapter.blocks(p.model)
    # copy the model but not its blocks (every slot is replaced below): a DeiT-B copy costs a quarter second
    twin = copy.deepcopy(p.model, memo={id(b): b for b in blocks})
    for i in range(len(blocks)):
        if p.block is None:
            adapter.drop_block(twin, i)
        else:
            adapter.set_block(twin, i, copy.deepcopy(p.block))
    twin.eval()
    return lambda: twin(x)


def _whole(entry: dict) -> float:
    """What a part's runner measured when it was stored: the copies model for a block in context."""
    return entry.get("whole_s", entry["median_s"])


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
