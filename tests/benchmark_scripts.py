"""The study scripts under benchmarks/ as modules, for the tests that read them: ``python benchmarks/NAME.py``
puts benchmarks/ on ``sys.path`` (so a script imports ``studylib`` and its neighbours); here the tests do."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py"))


def script(name: str):
    """benchmarks/NAME.py imported as the module ``NAME`` (its ``main`` not run)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module(name)
