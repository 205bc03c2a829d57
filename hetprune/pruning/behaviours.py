"""Which behaviour of each component made a result: the numbers a finished result records, so a release whose
components make other results from the same settings does not reuse it without a word.

A key says what a result was made *from* (model, data, settings); it cannot say what the code made of them. When
a component changes what it makes (the gate phase selecting other sites from the same settings), its
``behaviour`` number is bumped (a class attribute, 1 where absent), and every result records the numbers of the
components it used (`behaviours`). A stored result whose numbers differ from this release's, or that has none
(made before them), is not reused: the resume says so in one line, and ``--reuse-older`` reuses it, labelled.
``tests/test_behaviours.py`` pins a small run per strategy and scorer and says which number to bump when one
moves.
"""

from __future__ import annotations

from ..core.plugins import Registry
from ..core.settings import Settings

# the shared machinery every strategy runs through: the trainer (fine-tunes, the gate phase's steps) and the
# pipeline's steps (removal, merge, evaluation); bump one where it changes what any result is
CORE = {"trainer": 1, "pipeline": 1}


def named_components(settings: Settings) -> list[tuple[str, str, str]]:
    """Every component a run's settings name, as ``(where, kind, name)``: the scorer, removers and mergers, and in
    every section a ``predictor``/``..._predictor``, ``scorer``/``..._scorer``, ``..._strategy`` (HetDPT+'s depth
    part) or ``pruner`` (the width pruner)."""
    run = settings.run
    named = [("scorer", "scorer", run.scorer), ("attn_remover", "remover", run.attn_remover),
             ("act_remover", "remover", run.act_remover), *(("mergers", "merger", m) for m in run.mergers)]
    for section, values in settings.as_settings().items():
        if isinstance(values, dict):
            for key, value in values.items():
                kind = ("predictor" if key == "predictor" or key.endswith("_predictor") else
                        "scorer" if key == "scorer" or key.endswith("_scorer") else
                        "strategy" if key.endswith("_strategy") else
                        "width_pruner" if key == "pruner" else None)
                if kind is not None and isinstance(value, str):
                    named.append((f"{section}.{key}", kind, value))
    return named


def behaviour_of(registry: Registry, kind: str, name: str) -> int:
    """A registered component's behaviour number (its class's ``behaviour``; 1 where it declares none)."""
    return int(getattr(registry.component(kind, name).factory, "behaviour", 1))


def behaviours(registry: Registry, settings: Settings, strategy: str | None) -> dict[str, int]:
    """The behaviour numbers of everything a result of ``strategy`` under ``settings`` is made by: the core's
    (`CORE`), the strategy's and every component the settings name (a fixed split, ``strategy`` None, has no
    strategy of its own)."""
    out = {f"core:{name}": number for name, number in CORE.items()}
    used = ([("strategy", strategy)] if strategy else []) + [(k, n) for _, k, n in named_components(settings)]
    for kind, name in used:
        out[f"{kind}:{name}"] = behaviour_of(registry, kind, name)
    return dict(sorted(out.items()))


def changed(stored: dict | None, current: dict[str, int]) -> str | None:
    """Why a stored result is another behaviour's (``gate-taylor 1 -> 2``, or that it was made before behaviour
    numbers), None where it is this release's."""
    if stored is None:
        return "made before results recorded their behaviour"
    moved = [f"{k.split(':', 1)[1]} {stored.get(k, '?')} -> {v}" for k, v in current.items() if stored.get(k) != v]
    return ", ".join(moved) or None
