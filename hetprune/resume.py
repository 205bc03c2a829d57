"""Resume keys: what a piece of resumable state (a fine-tune or gate-phase
checkpoint) was computed from, so ``--resume`` reuses it only when everything
that shaped it is the same, and says what changed when it is not."""

from __future__ import annotations

from typing import Callable

from torch import nn

from .io import note_saved, saved_work  # noqa: F401 - public here too: what plugins that checkpoint call


def weights_key(model: nn.Module) -> str:
    """A content hash of every weight of the model, each at its own precision: what a stage starts from.

    The state dict alone does not say which sites are gone (a removed activation holds no weight): key the
    structure too, with `structure_key`."""
    from .models import model_hash

    return model_hash(model)


def structure_key(model: nn.Module, structure: dict | None = None) -> str:
    """A hash of what the model is built of: every module's name and type, every tensor's shape and dtype, and
    ``structure`` (JSON data the caller reads from the model, e.g. its recipe's removed sites, attention mode,
    merges and widths). Two models whose state dicts are equal but whose removed sites differ differ here."""
    import hashlib
    import json

    modules = [[name, f"{type(m).__module__}.{type(m).__qualname__}"] for name, m in model.named_modules()]
    tensors = [[k, list(v.shape), str(v.dtype)] for k, v in model.state_dict().items()]
    text = json.dumps({"modules": modules, "tensors": tensors, "structure": structure}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def differences(stored: dict | None, current: dict) -> list[str]:
    """The entries of ``current`` that ``stored`` does not have with the same value."""
    stored = stored or {}
    return sorted(k for k in set(stored) | set(current) if stored.get(k) != current.get(k))


def reusable(stored: dict | None, current: dict, what: str, log: Callable[[str], None]) -> bool:
    """True when ``stored`` matches ``current``; otherwise say what differs (the caller starts afresh)."""
    changed = differences(stored, current)
    if changed:
        log(f"resume: {what} was made with another {', '.join(changed)}; starting it afresh")
    return not changed
