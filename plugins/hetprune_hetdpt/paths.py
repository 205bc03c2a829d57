"""The paths of progressive MAP points: which site kind each step removes, and which steps record a point.

The paper's stage 1 (Algorithms 1 and 2 of arXiv 2607.03784) walks from the
dense model one removal at a time, fine-tuning after each from the previous
step's weights: one path removes attention only, one activation only, and
one alternates the kinds, recording a point after each sub-step once both
kinds are present (1+1, 1+2, 2+2, ... with the activation first). Each path
goes as far as the budget's feasible splits need: the axis paths to the most
sites of their kind a feasible split removes, the interleaved path until it
reaches the budget line (it holds at least one feasible split's removals).
"""

from __future__ import annotations

from dataclasses import dataclass, field

Pair = tuple[int, int]
OTHER = {"attn": "act", "act": "attn"}


@dataclass
class Path:
    """One path: its name (part of its points' key), the kinds removed at each step (one fine-tune per
    step), the split after each step, and the splits that record a point."""

    name: str
    kinds: list[list[str]] = field(default_factory=list)
    steps: list[Pair] = field(default_factory=list)
    recorded: list[Pair] = field(default_factory=list)

    def take(self, kinds: list[str]) -> Pair:
        a, m = self.steps[-1] if self.steps else (0, 0)
        pair = (a + kinds.count("attn"), m + kinds.count("act"))
        self.kinds.append(list(kinds))
        self.steps.append(pair)
        return pair

    def since_recorded(self, step: int) -> int:
        """How many steps (fine-tunes) lead to the point at ``step`` (1-based) since the path's last recorded
        point before it: the steps that record nothing are paid for by the next point."""
        before = [i + 1 for i, p in enumerate(self.steps[:step - 1]) if p in self.recorded]
        return step - (before[-1] if before else 0)


def reaches(pair: Pair, feasible: list[Pair]) -> bool:
    """Whether ``pair`` removes at least the sites of some feasible split (it is on or past the budget line)."""
    return any(pair[0] >= a and pair[1] >= m for a, m in feasible)


def removal_order(feasible: list[Pair], first: str) -> list[str]:
    """The interleaved path's removals one by one: alternating kinds, ``first`` first, each kind while any
    feasible split needs more of it, until the removals reach the budget line."""
    room = {"attn": max((a for a, _ in feasible), default=0), "act": max((m for _, m in feasible), default=0)}
    order: list[str] = []
    pair, due = (0, 0), first
    while not (order and reaches(pair, feasible)):
        kind = next((k for k in (due, OTHER[due]) if room[k]), None)
        if kind is None:
            break
        room[kind] -= 1
        order.append(kind)
        pair = (pair[0] + (kind == "attn"), pair[1] + (kind == "act"))
        due = OTHER[kind]
    return order


def paths_for(feasible: list[Pair], first: str = "act", stride: int = 1) -> list[Path]:
    """The three paths a budget with these feasible splits needs (fewer where a kind is never removed);
    ``stride`` removals per step (the last step of a path may take fewer)."""
    if first not in OTHER:
        raise ValueError(f"first must be attn or act, got {first!r}")
    max_a = max((a for a, _ in feasible), default=0)
    max_m = max((m for _, m in feasible), default=0)
    orders = [(kind, [kind] * count) for kind, count in (("attn", max_a), ("act", max_m)) if count]
    if max_a and max_m:
        orders.append((f"interleaved-{first}-first", removal_order(feasible, first)))
    out = []
    for name, order in orders:
        path = Path(name)
        for i in range(0, len(order), stride):
            pair = path.take(order[i:i + stride])
            if pair[0] and pair[1] or name in OTHER:   # one kind alone on the interleaved path: an axis point
                path.recorded.append(pair)
        out.append(path)
    return out
