"""benchmarks/map_points.py ``--reuse-from``: an earlier study's units are borrowed only for schemes this pass
does not run, on its benchmarks and seeds, made with the same settings."""

from __future__ import annotations

from benchmark_scripts import script

map_points = script("map_points")


def _unit(bench, seed, scheme, extra=()):
    return {"bench": bench, "seed": seed, "scheme": scheme, "sets": map_points.SCHEMES[scheme] + list(extra),
            "per_target": {}}


def test_units_are_borrowed_only_for_schemes_not_run_here_with_the_same_settings():
    extra = ["scoring.subset=1000"]
    earlier = {"units": [_unit("digit-pairs", 0, "oneshot", extra), _unit("digit-pairs", 1, "oneshot", extra),
                         _unit("digits", 0, "oneshot", extra),              # another benchmark
                         _unit("digit-pairs", 0, "progressive-pipeline3", extra),   # run by this pass
                         _unit("digit-pairs", 0, "progressive", []),        # other settings
                         {**_unit("digit-pairs", 0, "progressive-verify3", extra), "scheme": "gone"}]}
    got = map_points.reused_units(earlier, ["digit-pairs"], [0, 1], ["progressive-pipeline3"], extra)
    assert [(u["bench"], u["seed"], u["scheme"]) for u in got] == [("digit-pairs", 0, "oneshot"),
                                                                   ("digit-pairs", 1, "oneshot")]
    assert map_points.reused_units(earlier, ["digit-pairs"], [2], [], extra) == []
