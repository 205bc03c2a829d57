"""What a strategy's run reports: [`Report`][hetprune.pruning.report.Report], typed, and its JSON form (report.json,
``PruneResult.report``), which the plugin contract checks for `REPORT_KEYS`.

Before tasks had other metrics, reports and the embedded base models' info named the metric ``top1``
(``top1``, ``top1_before_finetune``, ``top1_dense``). `legacy_metric` is the one place those names are read;
a top-1 task's report still writes them beside ``metric*``, for readers of older result files."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from torch import nn

from ..model.recipe import Recipe

# what every strategy's report holds; checked by the contract (hetprune.pruning.steps.finish fills all of them)
REPORT_KEYS = ("strategy", "n_attn", "n_act", "sites", "params", "macs", "dense_params", "dense_macs",
               "macs_convention", "metric_name", "metric_before_finetune", "metric", "seconds")
_SUFFIXES = ("", "_before_finetune", "_dense")


def legacy_metric(entries: dict, suffix: str = ""):
    """``entries``' metric ``metric{suffix}``, or its name from before tasks had other metrics (``top1{suffix}``);
    None when it has neither."""
    value = entries.get(f"metric{suffix}")
    return entries.get(f"top1{suffix}") if value is None else value


@dataclass
class Report:
    """A pruning run's report: the split and sites, the task's metric (dense, before and after the
    fine-tune), the costs, and the strategy's own entries (``extra``: allocation, removal, merges, the
    fine-tune's history, the cost model's block)."""

    strategy: str
    n_attn: int
    n_act: int
    sites: list[str]
    metric_name: str
    metric: float | None
    metric_before_finetune: float | None
    params: int
    macs: float
    dense_params: int
    dense_macs: float
    macs_convention: str
    seconds: float | None = None
    higher_is_better: bool = True
    metric_dense: float | None = None
    budget: dict | None = None
    seed: int | None = None
    settings: dict | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The JSON form: every field at the top level, the extra entries among them; a top-1 task's metric
        under the ``top1*`` names too."""
        out = {"strategy": self.strategy, "budget": self.budget, "seed": self.seed, "n_attn": self.n_attn,
               "n_act": self.n_act, "sites": list(self.sites), **self.extra}
        for suffix in _SUFFIXES:
            out[f"metric{suffix}"] = getattr(self, f"metric{suffix}")
            if self.metric_name == "top1":
                out[f"top1{suffix}"] = getattr(self, f"metric{suffix}")
        out.update(metric_name=self.metric_name, higher_is_better=self.higher_is_better, seconds=self.seconds,
                   params=self.params, macs=self.macs, dense_params=self.dense_params, dense_macs=self.dense_macs,
                   macs_convention=self.macs_convention, settings=self.settings)
        return out

    @classmethod
    def from_dict(cls, entries: dict) -> "Report":
        """A report read back from its JSON form (also one written before tasks had other metrics, whose
        metric is named ``top1*``). Keys that are not fields are kept in ``extra``."""
        named = {f.name for f in fields(cls)} - {"extra"}
        legacy = {f"top1{s}" for s in _SUFFIXES}
        values = {k: v for k, v in entries.items() if k in named}
        for suffix in _SUFFIXES:
            values[f"metric{suffix}"] = legacy_metric(entries, suffix)
        values.setdefault("metric_name", "top1")
        for key in ("strategy", "n_attn", "n_act", "sites", "params", "macs", "dense_params", "dense_macs",
                    "macs_convention"):
            values.setdefault(key, None)
        extra = {k: v for k, v in entries.items() if k not in named and k not in legacy}
        return cls(**values, extra=extra)


@dataclass
class PruneResult:
    """What a strategy's ``run`` returns: the pruned model, its recipe, and its report (the JSON form of a
    [`Report`][hetprune.pruning.report.Report])."""

    model: nn.Module
    recipe: Recipe
    report: dict


def metric_entries(job, report: dict) -> dict:
    """``report`` with the task's metric under its own keys: ``metric``, ``metric_before_finetune`` and
    ``metric_dense``, named by ``metric_name`` (and ``higher_is_better``). A top-1 task keeps the ``top1*``
    keys too; a strategy that still writes only ``top1*`` has them read as the metric, and the dense metric
    comes from the base's info when the strategy did not measure it."""
    out = {k: v for k, v in report.items() if not k.startswith("top1")}
    for suffix in _SUFFIXES:
        out[f"metric{suffix}"] = legacy_metric(report, suffix)
    if out["metric_dense"] is None:
        out["metric_dense"] = legacy_metric(job.base_info, "")
    for suffix in _SUFFIXES:
        if job.task.metric_name == "top1":
            out[f"top1{suffix}"] = out[f"metric{suffix}"]
    out["metric_name"], out["higher_is_better"] = job.task.metric_name, job.task.higher_is_better
    return out
