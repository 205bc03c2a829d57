"""What every study script records about its run and how it writes its results: the machine line, the load
average, and the results' ``NAME.json`` and ``NAME.md`` under ``--results`` (one place, so the studies' files
read alike)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path


def machine() -> str:
    """The machine as the results files name it: processor (or architecture), core count, platform, and torch
    with the CPU kernels it dispatches to (AVX2, AVX512...: results on the CPU are bit-reproducible only on the
    same kernels)."""
    import torch

    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, "
            f"torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()} kernels)")


def load() -> list[float]:
    """The 1-, 5- and 15-minute load averages, rounded as the results files print them."""
    return [round(v, 2) for v in os.getloadavg()]


def write(results: str | Path, name: str, res: dict, markdown: str) -> Path:
    """``res`` as ``NAME.json`` and ``markdown`` as ``NAME.md`` under ``results`` (made if missing); the
    markdown is printed too. Returns the folder."""
    folder = Path(results)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(res, indent=1) + "\n")
    (folder / f"{name}.md").write_text(markdown)
    print(markdown)
    return folder
