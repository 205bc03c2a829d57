"""What every study script records about its run and how it writes its results: the machine line, the load
average, and the results' ``NAME.json`` and ``NAME.md`` under ``--results`` (one place, so the studies' files
read alike)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from hetprune.core.io import write_text_atomic


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


def write(results: str | Path, name: str, res: dict, markdown: str, echo: bool = True) -> Path:
    """``res`` as ``NAME.json`` and ``markdown`` as ``NAME.md`` under ``results`` (made if missing), each whole
    or not at all (an interrupted study never leaves half a results file over the committed one); what JSON
    cannot hold (a path, a numpy number) is written as its text. The markdown is printed too unless ``echo`` is
    off. Returns the folder."""
    folder = Path(results)
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / f"{name}.json", json.dumps(res, indent=1, default=str) + "\n")
    write_text_atomic(folder / f"{name}.md", markdown if markdown.endswith("\n") else markdown + "\n")
    if echo:
        print(markdown)
    return folder
