"""Fixed-split depth strategies and block dropping."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

from hetprune import BudgetUnreachable, Site, sites
from hetprune.plugin_api import DepthStrategy, PruneJob, Section, number, pipeline, setting, surgery


def closest_pair(pairs: list[tuple[int, int]], attn_share: float) -> tuple[int, int]:
    """The feasible pair whose attention share is closest to ``attn_share``.

    Ties go to fewer attention removals (so an odd budget at 50/50 rounds the
    extra removal to the activation side)."""
    from fractions import Fraction

    target = Fraction(attn_share).limit_denominator(10_000)

    def distance(p):
        total = p[0] + p[1]
        return abs(Fraction(p[0], total) - target) if total else Fraction(0)

    return min(pairs, key=lambda p: (distance(p), p[0]))


@dataclass(frozen=True)
class MixOptions(Section):
    """The ``mix`` strategy's split."""

    section: ClassVar[str] = "mix"
    ratio: float = setting(0.5, "the share of the removals that are attention sites")

    def __post_init__(self):
        self.need("ratio", number(self.ratio, 0, 1), "a number within [0, 1]")


class Mix(DepthStrategy):
    """Fixed share of attention removals (mix.ratio, default 0.5); the rest are activations."""

    name = "mix"
    description = "fixed split: a share mix.ratio of the removals are attention sites"
    sections = {"mix": MixOptions}
    defaults = {"mix": MixOptions.defaults()}
    ratio_override: float | None = None

    def ratio(self, job: PruneJob) -> float:
        if self.ratio_override is not None:
            return self.ratio_override
        return float(job.options(MixOptions).ratio)

    def allocate(self, job: PruneJob):
        ratio = self.ratio(job)
        pairs = job.feasible_pairs()
        pick = closest_pair(pairs, ratio)
        if job.budget.sites is not None and ratio not in (0.0, 1.0) and (job.budget.sites * ratio) % 1:
            note = f"{job.budget.sites} x {ratio:g} is not whole: rounded to {pick[0]} attention sites"
        else:
            note = ""
        if ratio == 1.0 and pick[1] > 0 or ratio == 0.0 and pick[0] > 0:
            kind = "attention" if ratio == 1.0 else "activation"
            if job.budget.counts_cost:   # a cost target: the strategy stays what it says, and says it falls short
                raise BudgetUnreachable(
                    f"{job.strategy_name or self.name} cannot meet {job.budget.describe()}: removing {kind} sites "
                    f"alone does not reach it on this model (the nearest split that does is {pick[0]}+{pick[1]})")
            note = f"the budget cannot be met with one kind alone on this model: split {pick}"
        return pick, {"ratio": ratio, **({"note": note} if note else {})}


class Mix50(Mix):
    """50/50 split; an odd budget gives the extra removal to activations."""

    name = "mix50"
    description = "fixed 50/50 split (odd budgets: the extra removal is an activation site)"
    sections: dict = {}
    defaults: dict = {}
    ratio_override = 0.5


class AttnOnly(Mix):
    """Every removal is an attention site."""

    name = "attn-only"
    description = "every removal is an attention sub-block"
    sections: dict = {}
    defaults: dict = {}
    ratio_override = 1.0


class ActOnly(Mix):
    """Every removal is an MLP activation."""

    name = "act-only"
    description = "every removal is an MLP activation"
    sections: dict = {}
    defaults: dict = {}
    ratio_override = 0.0


class BlockDrop(DepthStrategy):
    """Classic depth pruning: drop whole blocks; each counts as 2 sites (odd budgets round down)."""

    name = "block-drop"
    description = "classic depth pruning: drop whole blocks (2 sites each; odd budgets round down)"
    defaults = {}

    def allocate(self, job: PruneJob):
        import copy

        most = len(sites(job.dense, "attn")) - 1  # at least one block must stay
        if job.budget.sites is not None:
            n = job.budget.sites // 2
            note = {"note": f"odd budget {job.budget.sites}: {n} blocks = {2 * n} sites"} if job.budget.sites % 2 else {}
        else:
            # in the budget's cost model; dropping blocks saves the same whichever go, for uniform blocks
            example = job.example
            one = copy.deepcopy(job.dense)
            surgery.drop_block(one, 0)
            job.prepare_costs([job.dense, one], example)
            dense = job.cost(job.dense, example)
            per_block = dense - job.cost(one, example)
            limit = job.budget.limit(dense)
            assert limit is not None   # a budget that is not a site count has a limit
            n = math.ceil(max(0.0, dense - limit) / per_block) if per_block > 0 else most + 1
            note = {}
        if n > most:
            raise BudgetUnreachable(f"block-drop cannot meet {job.budget.describe()}: at most {most} of "
                                f"{most + 1} blocks may be dropped")
        return (n, n), {"blocks": n, **note}

    def choose(self, job: PruneJob, model, counts):
        """Blocks chosen with the same selection as every strategy, then ranked into whole blocks.

        ``select_sites`` picks ``n`` attention and ``n`` activation sites exactly as
        the other strategies pick theirs (for a learning scorer such as gate-taylor:
        the same gate training of the weights, for the same number of removals).
        Blocks with both sites picked come first, then one; ties go to the lower
        mean within-kind rank of the scorer's one-shot scores on that model.
        """
        n = counts["attn"]
        if n == 0:
            return []
        picked = pipeline.select_sites(job, model, {"attn": n, "act": n})
        votes = Counter(s.block for s in picked)
        run = job.config
        scorer = job.registry.build("scorer", run.scorer, **run.options_for("scorer", run.scorer))
        ctx = pipeline.scoring_context(job)
        rank: dict[int, list[float]] = {}
        for kind in ("attn", "act"):
            scores = scorer.score(model, sites(model, kind), ctx)
            ordered = sorted(scores, key=lambda s: (scores[s], s.block))
            for r, s in enumerate(ordered):
                rank.setdefault(s.block, []).append(r / max(1, len(ordered) - 1))
        blocks = sorted(rank, key=lambda b: (-votes[b], sum(rank[b]) / len(rank[b]), b))[:n]
        return [Site(b, k) for b in sorted(blocks) for k in ("attn", "act")]

    def remove(self, job: PruneJob, model, chosen):
        for block in sorted({s.block for s in chosen}):
            surgery.drop_block(model, block)
        return {"dropped_blocks": sorted({s.block for s in chosen})}
