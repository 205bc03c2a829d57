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


def test_a_saved_unit_is_read_back_only_under_the_settings_it_ran_with_defaults_included(tmp_path):
    """A unit is found by its targets, its scheme's --set list and every resolved setting: one saved before a
    default moved (same list, other settings) is made again rather than passed off as today's."""
    import json

    from studylib.runs import resolved_settings

    sets = map_points.SCHEMES["oneshot"]
    now = resolved_settings(sets)
    assert now["hetdpt"]["verify"] == 0 and now["hetdpt"]["predictor"] == "poly"   # the list plus today's defaults
    path = tmp_path / "unit.json"
    path.write_text(json.dumps({"targets": ["b8"], "sets": sets, "resolved": now, "per_target": {"b8": {}}}))
    assert map_points.saved_unit(path, ["b8"], sets, now)["per_target"] == {"b8": {}}
    assert map_points.saved_unit(path, ["b8", "b12"], sets, now) is None               # other targets
    before = json.loads(json.dumps(now))
    before["hetdpt"]["predictor"] = "local"                                           # a default since moved
    path.write_text(json.dumps({"targets": ["b8"], "sets": sets, "resolved": before, "per_target": {}}))
    assert map_points.saved_unit(path, ["b8"], sets, now) is None
    path.write_text(json.dumps({"targets": ["b8"], "sets": sets, "per_target": {}}))  # saved before they were kept
    assert map_points.saved_unit(path, ["b8"], sets, now) is None
    assert map_points.saved_unit(tmp_path / "none.json", ["b8"], sets, now) is None
    # the pinned schemes resolve to what they measured, whatever today's defaults
    pinned = resolved_settings(map_points.SCHEMES["oneshot-pipeline3-img"])["hetdpt"]
    assert (pinned["verify_among"], pinned["verify_selection_at_least"]) == ("best", None)
