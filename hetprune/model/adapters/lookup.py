"""Finding a model's adapter: the one a job serves (`serving`), else the most specific registered
adapter that matches the model or, failing that, a submodule of it (a backbone inside the user's model)."""

from __future__ import annotations

import contextlib
import contextvars
import weakref

from torch import nn

from ...core.errors import HetpruneError
from ...core.plugins import get_registry
from .base import DOCS, Adapter
from .nested import find_nested

_serving: contextvars.ContextVar = contextvars.ContextVar("hetprune_adapter", default=None)


@contextlib.contextmanager
def serving(adapter: Adapter):
    """Within this context, ``adapter`` serves every model it matches: a job resolves its adapter once
    (a generic or nested one no registry knows included) and everything below it gets that one."""
    token = _serving.set(adapter)
    try:
        yield adapter
    finally:
        _serving.reset(token)


_cache: "weakref.WeakKeyDictionary[nn.Module, tuple[int, Adapter]]" = weakref.WeakKeyDictionary()


def adapters() -> list[Adapter]:
    """One instance of every registered adapter, in registration order."""
    return get_registry().adapters()


def adapter_for(model: nn.Module) -> Adapter:
    """The adapter that serves ``model``: the most specific of those whose ``matches`` accepts it.

    Specificity (`Adapter.specificity`) is compared in order: a higher declared ``priority`` wins;
    then the adapter whose ``model_types`` holds the nearest ancestor of the model's class (the class
    itself beats its parent: an adapter for a subclass of ``VisionTransformer`` beats the one for
    ``VisionTransformer``); then the one whose ``block_types`` is nearest to the blocks' classes (an adapter
    for a subclass of timm's ``Block`` beats the generic one). Registration order never decides: two
    equally specific adapters are an error naming both. One ``error:`` line when none matches.
    """
    served = _serving.get()
    if served is not None and served.matches(model):
        return served
    registry = get_registry()
    hit = _cache.get(model)
    if hit is not None and hit[0] == id(registry):
        return hit[1]
    matching = [a for a in registry.adapters() if a.matches(model)]
    if not matching:   # a known model inside the user's own module (a backbone under a head)?
        nested = find_nested(model, registry.adapters())
        if nested is not None:
            nested.check(model)
            _cache[model] = (id(registry), nested)
            return nested
        known = "; ".join(f"{a.name} ({a.description})" for a in registry.adapters()) or "(none registered)"
        raise HetpruneError(f"no architecture adapter recognises {type(model).__name__}: supported families are "
                            f"{known}, at the top or as a submodule. A transformer of your own: hetprune.model.adapters.generic(blocks=..., "
                            f"layout=...); a new family is one adapter: see {DOCS}")
    found = most_specific(matching, model)
    found.check(model)
    _cache[model] = (id(registry), found)
    return found


def most_specific(matching: list[Adapter], model: nn.Module) -> Adapter:
    """The one adapter of ``matching`` that is most specific for ``model``; a tie is an error naming the tied."""
    ranked = [(a.specificity(model), a) for a in matching]
    best = max(rank for rank, _ in ranked)
    tied = [a for rank, a in ranked if rank == best]
    if len(tied) > 1:
        raise HetpruneError(f"architecture adapters {' and '.join(repr(a.name) for a in tied)} both match "
                            f"{type(model).__name__} equally specifically (priority, model type, block type: "
                            f"{best}); give one a higher 'priority', narrow its model_types/block_types, or "
                            "restrict HETPRUNE_PLUGINS")
    return tied[0]


def adapter_named(name: str) -> Adapter:
    for a in get_registry().adapters():
        if a.name == name:
            return a
    raise HetpruneError(f"no architecture adapter named {name!r} is registered; registered: "
                        f"{', '.join(a.name for a in get_registry().adapters()) or '(none)'}")
