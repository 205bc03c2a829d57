"""`fingerprint`: the short stable hash of JSON-able settings that keys every cache and piece of resumable
state (the resume keys built on it: `hetprune.training.resume`; where caches live: `hetprune.core.io.cache_dir`)."""

from __future__ import annotations

import hashlib
import json



def fingerprint(obj) -> str:
    """A short stable hash of JSON-able settings, used to key caches and resumable state."""
    text = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def __getattr__(name: str):
    if name == "cache_dir":   # hetprune.cache.cache_dir, from before the move (the module loads no torch)
        from .io import cache_dir

        return cache_dir
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
