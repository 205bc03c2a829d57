"""Where hetprune keeps what it can rebuild: trained base models, data."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def cache_dir() -> Path:
    """``$HETPRUNE_CACHE``, else ``$XDG_CACHE_HOME/hetprune``, else ``~/.cache/hetprune``."""
    explicit = os.environ.get("HETPRUNE_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hetprune"


def fingerprint(obj) -> str:
    """A short stable hash of JSON-able settings, used to key caches and resumable state."""
    text = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
