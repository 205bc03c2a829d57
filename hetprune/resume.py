"""Resume keys: what a piece of resumable state (a fine-tune or gate-phase
checkpoint) was computed from, so ``--resume`` reuses it only when everything
that shaped it is the same, and says what changed when it is not."""

from __future__ import annotations

from typing import Callable

from torch import nn


def weights_key(model: nn.Module) -> str:
    """A content hash of the model's state (its structure and every weight): what a stage starts from."""
    from .models import model_hash

    return model_hash(model)


def differences(stored: dict | None, current: dict) -> list[str]:
    """The entries of ``current`` that ``stored`` does not have with the same value."""
    stored = stored or {}
    return sorted(k for k in set(stored) | set(current) if stored.get(k) != current.get(k))


def reusable(stored: dict | None, current: dict, what: str, log: Callable[[str], None]) -> bool:
    """True when ``stored`` matches ``current``; otherwise say what differs (the caller starts afresh)."""
    changed = differences(stored, current)
    if changed:
        log(f"--resume: {what} was made with another {', '.join(changed)}; starting it afresh")
    return not changed
