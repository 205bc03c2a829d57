"""Tensors nested in what models return and what batches hold: a tensor, or tuples, lists, namedtuples and
dicts of them (a backbone under two heads returns ``(cls_logits, token_logits)``; a Hugging Face model a
``ModelOutput`` dict). Every check that compares outputs (the plugin contract, removal, merge, reload) reads
them through these functions, so a model with several outputs is checked on all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Iterator

import torch


def leaves(obj, path: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in ``obj`` with where it sits (``[0]``, ``.logits``, ``['labels']``), in a fixed order
    (a dict's by key); anything else in it is skipped."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        for name, value in zip(obj._fields, obj):
            yield from leaves(value, f"{path}.{name}")
    elif isinstance(obj, (tuple, list)):
        for i, value in enumerate(obj):
            yield from leaves(value, f"{path}[{i}]")
    elif isinstance(obj, Mapping):
        for key in sorted(obj, key=str):
            yield from leaves(obj[key], f"{path}[{key!r}]")


def shapes(obj) -> dict[str, tuple[int, ...]]:
    """Where each tensor sits and its shape: what must not change when a site is removed."""
    return {where: tuple(t.shape) for where, t in leaves(obj)}


def describe(shapes_: dict[str, tuple[int, ...]]) -> str:
    """``(2, 10)`` for a single tensor, ``[0] (2, 10), [1] (2, 16, 5)`` for several."""
    if list(shapes_) == [""]:
        return str(shapes_[""])
    return ", ".join(f"{where} {shape}" for where, shape in shapes_.items()) or "no tensor"


def all_finite(obj) -> bool:
    return all(bool(torch.isfinite(t).all()) for _, t in leaves(obj) if t.is_floating_point() or t.is_complex())


def _pairs(reference, candidate) -> list[tuple[torch.Tensor, torch.Tensor]]:
    ref, cand = dict(leaves(reference)), dict(leaves(candidate))
    if {k: tuple(v.shape) for k, v in ref.items()} != {k: tuple(v.shape) for k, v in cand.items()}:
        raise ValueError(f"the outputs differ in structure: {describe(shapes(reference))} against "
                         f"{describe(shapes(candidate))}")
    if not ref:
        raise ValueError("the outputs hold no tensor to compare")
    return [(ref[k], cand[k]) for k in ref]


def _largest(values) -> float:
    """The largest of the values, NaN if any is NaN (a NaN output must never pass a tolerance)."""
    worst = 0.0
    for v in values:
        if v != v:
            return float("nan")
        worst = max(worst, v)
    return worst


def max_abs_diff(reference, candidate) -> float:
    """The largest absolute difference over every output tensor (their structures must agree)."""
    return _largest(float((r.double() - c.double()).abs().max()) for r, c in _pairs(reference, candidate)
                    if r.numel())


def relative_error(reference, candidate) -> float:
    """max |reference - candidate| / max |reference|, per output tensor, the largest: the scale-free error a
    tolerance bounds (each output on its own scale)."""
    return _largest(float(((r - c).abs().max() / r.abs().max().clamp_min(1e-12)).item())
                    for r, c in _pairs(reference, candidate) if r.numel())


def equal(a, b) -> bool:
    """Bit-identical outputs: the same structure and every tensor equal."""
    try:
        return all(torch.equal(x, y) for x, y in _pairs(a, b))
    except ValueError:
        return False
