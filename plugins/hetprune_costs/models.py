"""The two built-in cost models: MACs (what the paper's budgets count) and measured latency."""

from __future__ import annotations

import torch
from torch import nn

from hetprune import HetpruneError, bench
from hetprune.costs import CONVENTION, count_macs
from hetprune.latency import LatencyTable, default_dtype


class MacCost:
    """MACs per image: exact, the same on every machine, and what a speedup is *not* always worth."""

    name = "macs"
    unit = "MACs"
    description = "multiply-accumulates per image (Linear, Conv2d, attention matmuls); device-independent"

    def cost(self, model: nn.Module, example: torch.Tensor) -> float:
        return float(count_macs(model, example))

    def describe(self) -> dict:
        return {"unit": "MACs per image", "convention": CONVENTION}


class LatencyCost:
    """Seconds per forward pass at ``batch_size`` on the run's device, predicted from a cached table of
    block times (``hetprune.latency``); ``measure`` times whole models the same way for the report."""

    name = "latency"
    unit = "s"
    description = "measured forward time on the run's device (cached per device, dtype and batch size)"

    def __init__(self, batch_size: int = 64, dtype: str = "auto", repeats: int = 5, min_time_s: float = 0.05,
                 budget_s: float = 1.0, cache: bool = True, verify_repeats: int = 7, tolerance: float = 0.10):
        if dtype != "auto" and dtype not in bench.DTYPES:
            raise HetpruneError(f"latency dtype must be auto or one of {', '.join(bench.DTYPES)}, got {dtype!r}")
        for key, value in (("batch_size", batch_size), ("repeats", repeats), ("verify_repeats", verify_repeats)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise HetpruneError(f"latency {key} must be a whole number >= 1, got {value!r}")
        self.batch_size, self.dtype, self.repeats = batch_size, dtype, repeats
        self.min_time_s, self.cache, self.verify_repeats = float(min_time_s), bool(cache), verify_repeats
        self.budget_s, self.tolerance = budget_s, tolerance
        self.tables: dict[str, LatencyTable] = {}
        self.log = print

    def table(self, device: torch.device) -> LatencyTable:
        key = str(device)
        if key not in self.tables:
            dtype = default_dtype(device) if self.dtype == "auto" else self.dtype
            self.tables[key] = LatencyTable(device, batch_size=self.batch_size, dtype=dtype, repeats=self.repeats,
                                            min_time_s=self.min_time_s, budget_s=self.budget_s, cache=self.cache,
                                            tolerance=self.tolerance, log=self.log)
        return self.tables[key]

    def cost(self, model: nn.Module, example: torch.Tensor) -> float:
        return self.table(example.device).predict(model, example)

    def prepare(self, models: list[nn.Module], example: torch.Tensor) -> None:
        """Time the parts of models about to be costed together, in one session (their times compare)."""
        self.table(example.device).prepare(models, example)

    def measure(self, models: dict, example: torch.Tensor) -> dict:
        """Whole models timed interleaved at the table's batch size and dtype: the median seconds per pass."""
        table = self.table(example.device)
        result = bench.measure(dict(models), tuple(example.shape[1:]), [self.batch_size], device=str(table.device),
                               dtype=table.dtype, repeats=self.verify_repeats, min_time_s=self.min_time_s,
                               budget_s=self.budget_s)
        return {r["model"]: r["latency_s"]["median"] for r in result["results"]}

    def describe(self) -> dict:
        out = {"unit": f"seconds per forward pass at batch {self.batch_size}", "batch_size": self.batch_size}
        for device, table in self.tables.items():
            out.update({"device": table.key["device"], "dtype": table.dtype, "table": str(table.path),
                        "parts_timed_now": table.measured_now, "parts_in_table": len(table.entries),
                        "self_check": table.check})
            if table.untrusted:   # the run's report says why, and what to count instead
                out["untrusted"] = f"{table.untrusted}; --cost-model macs counts MACs instead"
        return out
