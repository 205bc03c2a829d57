"""The two built-in cost models: MACs (what the paper's budgets count) and measured latency."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from hetprune import HetpruneError, bench
from hetprune.plugin_api import Section, latency_table, number, setting, whole
from hetprune.plugin_api import macs as mac


class MacCost:
    """MACs per image: exact, the same on every machine, and what a speedup is *not* always worth."""

    name = "macs"
    unit = "MACs"
    description = "multiply-accumulates per image (Linear, Conv2d, attention matmuls); device-independent"

    def cost(self, model: nn.Module, example: torch.Tensor) -> float:
        return float(mac.count_macs(model, example))

    def describe(self) -> dict:
        return {"unit": "MACs per image", "convention": mac.CONVENTION}


@dataclass(frozen=True)
class LatencyOptions(Section):
    """``cost_model_options.latency``: how block times are measured."""

    section: ClassVar[str] = "cost_model_options.latency"
    batch_size: int = setting(64, "the batch size the table is timed at")
    dtype: str = setting("auto", f"auto (bf16 on CUDA where native, else fp32) or one of {', '.join(bench.DTYPES)}")
    repeats: int = setting(5, "timed rounds per part")
    min_time_s: float = setting(0.05, "the least time one round runs")
    budget_s: float = setting(1.0, "seconds a part may take to time")
    cache: bool = setting(True, "keep the table between runs (per device, dtype and batch size)")
    verify_repeats: int = setting(7, "rounds of the whole-model check")
    tolerance: float = setting(0.10, "how far the table's prediction may miss the whole-model time")

    def __post_init__(self):
        if self.dtype != "auto" and self.dtype not in bench.DTYPES:
            raise HetpruneError(f"latency dtype must be auto or one of {', '.join(bench.DTYPES)}, got {self.dtype!r}")
        for key in ("batch_size", "repeats", "verify_repeats"):
            if not whole(getattr(self, key), 1):
                raise HetpruneError(f"latency {key} must be a whole number >= 1, got {getattr(self, key)!r}")
        for key in ("min_time_s", "budget_s"):
            self.need(key, number(getattr(self, key), 0), "a number of seconds >= 0")
        self.need("tolerance", number(self.tolerance) and self.tolerance > 0, "a number > 0")


class LatencyCost:
    """Seconds per forward pass at ``batch_size`` on the run's device, predicted from a cached table of
    block times (``hetprune.measure.latency_table``); ``measure`` times whole models the same way for the report."""

    name = "latency"
    unit = "s"
    description = "measured forward time on the run's device (cached per device, dtype and batch size)"

    Options = LatencyOptions

    def __init__(self, **options) -> None:
        o = LatencyOptions.from_dict(options)
        self.batch_size, self.dtype, self.repeats = o.batch_size, o.dtype, o.repeats
        self.min_time_s, self.cache, self.verify_repeats = float(o.min_time_s), bool(o.cache), o.verify_repeats
        self.budget_s, self.tolerance = o.budget_s, o.tolerance
        self.tables: dict[str, latency_table.LatencyTable] = {}
        self.log = print

    def table(self, device: torch.device) -> latency_table.LatencyTable:
        key = str(device)
        if key not in self.tables:
            dtype = latency_table.default_dtype(device) if self.dtype == "auto" else self.dtype
            self.tables[key] = latency_table.LatencyTable(
                device, batch_size=self.batch_size, dtype=dtype, repeats=self.repeats, min_time_s=self.min_time_s,
                budget_s=self.budget_s, cache=self.cache, tolerance=self.tolerance, log=self.log)
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
