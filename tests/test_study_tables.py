"""The committed study pages re-render from their JSON (issue 72, item 4: one table renderer for the studies).

Each page under benchmarks/results/ that a script with a renderer wrote is rendered again from the JSON beside it
by that script's own function, and compared with the committed page: the whole page where it re-renders
byte-identical today, else the tables (runs of lines starting with ``|``: the numbers) that do. A page written by
older code (a column added since, a row label renamed, the library's own speed table changed) keeps only the
tables that still match; which ones is written down here, so a change to a script's tables that moves a committed
number fails. The committed files are never edited to make this pass.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from benchmark_scripts import BENCHMARKS, script

RESULTS = BENCHMARKS / "results"


def tables(text: str) -> list[list[str]]:
    """The markdown tables of ``text``: each run of consecutive lines that start with ``|``."""
    found, run = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            run.append(line)
        elif run:
            found.append(run)
            run = []
    return found


def _map_points(res: dict) -> str:
    module = script("map_points")
    return (module.combined_markdown if "combined" in res else module.markdown)(res)


def _hetdpt_plus_speed(res: dict) -> list[str]:
    return script("hetdpt_plus_speed").over_isomorphic(res, res["settings"]["batch_sizes"])


# the renderer of each script, from its results JSON: a page (str) or the script's own tables (list of lines)
RENDER = {
    "first_compare": lambda res: script("first_compare").markdown(res),
    "gpu_speed": lambda res: script("gpu_speed").render(res),
    "latency_model": lambda res: script("latency_model").markdown(res["results"], res["command"]),
    "loader_throughput": lambda res: script("loader_throughput").render(res),
    "machine_noise": lambda res: script("machine_noise").markdown(res["results"], res["environment"],
                                                                  res["command"], res["load"]),
    "map_points": _map_points,
    "observations": lambda res: script("observations").markdown(res),
    "point_proxies": lambda res: script("point_proxies").markdown(res["results"], res["command"]),
    "quantize": lambda res: script("quantize").render(res),
    "scale_rehearsal": lambda res: script("scale_rehearsal").markdown(res),
    "speed_onnxruntime": lambda res: script("speed_onnxruntime").render(res),
    "speed_paper_configs": lambda res: script("speed_paper_configs").render(res),
    "default_target": lambda res: script("default_target").target_table(res["targets"]),
    "hetdpt_plus_speed": _hetdpt_plus_speed,
    "plus_order": lambda res: script("plus_order").order_table(res["rows"]),
    "refine_regret": lambda res: script("refine_regret").regret_table(res["runs"]),
    "scorer_study": lambda res: script("scorer_study").scorer_table(res["rows"]),
}

PAGE = "page"   # the whole page re-renders byte-identical
# page (its stem under benchmarks/results/) -> (the script that wrote it, what re-renders today: PAGE, or the
# indices of the committed page's tables that do, whole; a table-only renderer's tables must all be among them)
PAGES = {
    "default-target": ("default_target", (0,)),
    "default-target-grid": ("default_target", (0,)),
    "digit-pairs-refine-b12": ("refine_regret", (0,)),
    "digit-pairs-refine-b12-ft3x300": ("refine_regret", (0,)),
    "digit-pairs-refine-b12-gradual": ("refine_regret", (0,)),
    "digit-pairs-refine-b12-lossdrop-points": ("refine_regret", (0,)),
    "digit-pairs-refine-b8": ("refine_regret", (0,)),
    "digit-pairs-refine-b8-ft3x300": ("refine_regret", (0,)),
    "digit-pairs-refine-b8-lossdrop-points": ("refine_regret", (0,)),
    "digits-refine-b12": ("refine_regret", (0,)),
    "digits-refine-b12-ft3x300": ("refine_regret", (0,)),
    "digit-pairs-scorers-b12-5+7": ("scorer_study", (0,)),
    "digits-scorers-b12-6+6": ("scorer_study", (0,)),
    "first-compare": ("first_compare", ()),   # older: its header's limit was 3 min (issue 43); rows: ROWS
    "first-compare-avx2": ("first_compare", ()),
    "first-compare-fresh-clone": ("first_compare", PAGE),
    "first-compare-spread6": ("first_compare", PAGE),
    "first-compare-this-machine": ("first_compare", PAGE),
    "gpu-h200/gpu-speed": ("gpu_speed", PAGE),
    "gpu-h200/hetdpt-plus-speed-cuda": ("hetdpt_plus_speed", (1,)),   # table 0: the library's format_table
    "hetdpt-plus-speed-cpu-b1-b32": ("hetdpt_plus_speed", (1, 2)),
    "hetdpt-plus-speed-cpu-b1-b32-bf16": ("hetdpt_plus_speed", (1, 2)),
    "hetdpt-plus-order": ("plus_order", (0,)),
    "hetdpt-plus-order-59": ("plus_order", (0,)),
    "latency-model-embedded": ("latency_model", (0, 1, 2, 3)),   # its text changed since, not its tables
    "loader-throughput": ("loader_throughput", PAGE),
    "gpu-h200/loader": ("loader_throughput", PAGE),
    "machine-noise": ("machine_noise", PAGE),
    # older passes: the headline's row labels were renamed since (issues 43, 58); the rest is as written
    "map-points-grid-macs035": ("map_points", (1, 2, 3, 4, 5, 6)),
    "map-points-images": ("map_points", (1, 2, 3, 4, 5, 6)),
    "map-points-images6": ("map_points", (1, 2, 3, 4, 5, 6)),
    "map-points-images6-grid": ("map_points", (1, 2, 3, 4, 5, 6)),
    "map-points-images6-more": ("map_points", (1, 2, 3, 4, 5, 6)),
    "map-points-pairs1000": ("map_points", (1, 2, 3, 4, 5, 6)),
    "map-points-pairs1000-seeds6": ("map_points", (1, 2, 3, 4, 5, 6)),
    "map-points-ref-pairs": ("map_points", (1, 2, 3, 4, 5, 6)),
    "map-points-scoring1000": ("map_points", (1, 2, 3, 4, 5, 6)),
    "map-points-selection": ("map_points", (2, 3, 4, 5, 6)),   # and its schemes' words
    "map-points-spread-grid": ("map_points", (1, 2, 3, 4, 5, 6)),
    "map-points-spread-grid2": ("map_points", (1, 2, 3, 4, 5, 6)),
    "map-points-spread-pairs": ("map_points", (1, 2, 3, 4, 5, 6)),
    "map-points-grid-macs035-spread6": ("map_points", PAGE),
    "map-points-spread6-digits3": ("map_points", PAGE),
    "map-points-spread6-grid": ("map_points", PAGE),
    "map-points-spread6-pairs": ("map_points", PAGE),
    "map-points-images6-all": ("map_points", (0, 1)),   # combined passes: the rule's words changed since
    "map-points-spread": ("map_points", (0, 1)),
    "map-points-spread6": ("map_points", PAGE),
    "observations": ("observations", PAGE),
    "point-proxies": ("point_proxies", PAGE),
    "quantize-cpu": ("quantize", (0, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13)),   # 2: a column added since
    "quantize-cpu-avx2": ("quantize", PAGE),
    "scale-rehearsal": ("scale_rehearsal", PAGE),
    # the speed tables of hetprune.measure.bench.format_table (a column added since) are the library's, not
    # the script's: the script's own summary table re-renders
    "speed-cpu": ("speed_paper_configs", (0,)),
    "speed-cpu-run1": ("speed_paper_configs", (0, 3, 4)),
    "speed-onnxruntime-cpu": ("speed_onnxruntime", (0,)),
}
# pages whose header changed since but whose rows (the numbers) re-render: the indices of those tables
ROWS = {"first-compare": (0,), "first-compare-avx2": (0,)}
# pages of these scripts their renderer cannot read today (their JSON lacks what it has read since)
UNREADABLE = {
    "latency-model-cpu": "no session_spread (sessions came later)",
    "latency-model-cpu-digits": "no session_spread",
    "latency-model-cpu-digits-b256-rerun1": "no session_spread",
    "latency-model-cpu-digits-b256-rerun2": "no session_spread",
    "map-points": "no worst_excess in its choice (the rule changed, issue 43)",
}


def rerendered(stem: str) -> tuple[str | list[str], str]:
    """What the script renders from the page's JSON, and the committed page."""
    name = written_by(stem)
    res = json.loads((RESULTS / f"{stem}.json").read_text())
    return RENDER[name](res), (RESULTS / f"{stem}.md").read_text()


@pytest.mark.parametrize("stem", sorted(PAGES))
def test_a_committed_page_re_renders_from_its_json(stem):
    got, want = rerendered(stem)
    expected = PAGES[stem][1]
    if expected == PAGE:
        assert (got if got.endswith("\n") else got + "\n") == want
        return
    mine = tables(got if isinstance(got, str) else "\n".join(got))
    committed = tables(want)
    assert [i for i, t in enumerate(committed) if t in mine] == list(expected)
    rows = [t[2:] for t in mine]
    assert [i for i, t in enumerate(committed) if t[2:] in rows and i not in expected] == list(ROWS.get(stem, ()))


def written_by(stem: str) -> str | None:
    """The script whose renderer wrote the committed page ``stem``: the one its JSON's command (or, failing
    that, its page's first lines) runs."""
    res = json.loads((RESULTS / f"{stem}.json").read_text())
    text = str(res.get("command", "")) if isinstance(res, dict) else ""
    found = re.search(r"benchmarks/(\w+)\.py", text) or re.search(
        r"benchmarks/(\w+)\.py", (RESULTS / f"{stem}.md").read_text()[:600])
    return found and found.group(1)


def test_every_committed_page_of_these_scripts_is_checked():
    """A new committed page of a script with a renderer is checked too (or said to be unreadable)."""
    stems = [str(p.relative_to(RESULTS).with_suffix("")) for p in sorted(RESULTS.rglob("*.json"))
             if p.with_suffix(".md").is_file()]
    theirs = {s for s in stems if written_by(s) in RENDER}
    assert theirs == set(PAGES) | set(UNREADABLE)
    assert {written_by(s) for s in PAGES} == set(RENDER)


@pytest.mark.parametrize("stem", sorted(UNREADABLE))
def test_an_unreadable_page_still_cannot_be_read(stem):
    """Once it can (a renderer reading older results again), it moves to PAGES."""
    with pytest.raises(KeyError):
        rerendered(stem)


def hand_built_tables(path: Path) -> list[int]:
    """The lines of ``path`` whose string literals (f-strings' text included) start a markdown table row or
    rule (``"| "``, ``"|---"``) or join cells with ``" | "`` outside a header list: a table built by hand."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if text.lstrip().startswith(("| ", "|---")) or "---|" in text or " | " in text:
                found.append(node.lineno)
    return sorted(set(found))


def test_no_benchmark_script_builds_its_own_markdown_table():
    """Every study's tables come from studylib.tables.table (issue 72, item 4): one renderer, one format."""
    built = {p.name: lines for p in sorted(BENCHMARKS.glob("*.py")) if (lines := hand_built_tables(p))}
    assert not built, f"markdown tables built by hand (use studylib.tables.table): {built}"


def test_the_rule_sees_a_table_built_by_hand(tmp_path):
    code = tmp_path / "x.py"
    code.write_text('lines = ["| a | b |", "|---|---|"]\nlines.append(f"| {1} | {2} |")\n'
                    'row = "| " + " | ".join(["x"]) + " |"\nok = ["a", "b"]\n')
    assert hand_built_tables(code) == [1, 2, 3]
