"""What every study script records about the machine it ran on: the machine, the load average, and the line
the results files print them in."""

from __future__ import annotations

import os
import platform


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


def machine_line(res: dict) -> str:
    """``Machine: M; load average S at the start, E at the end; N s``: a results file's line for ``res``'s
    ``machine``, ``load_start``, ``load_end`` and ``seconds`` (each study adds what the seconds mean)."""
    return (f"Machine: {res['machine']}; load average {res['load_start']} at the start, {res['load_end']} at the "
            f"end; {res['seconds']:.0f} s")
