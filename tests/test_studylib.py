"""benchmarks/studylib: what the study scripts share (issue 59, item 4), and the rules of benchmarks/: no script
edits ``sys.path``, and every script imports (its imports resolve) without running its study."""

from __future__ import annotations

import ast
import json

import pytest

from benchmark_scripts import BENCHMARKS, SCRIPTS, script

files, machine, runs, tables = (script(f"studylib.{name}") for name in ("files", "machine", "runs", "tables"))


def test_write_puts_json_and_markdown_side_by_side_with_paths_as_text(tmp_path, capsys):
    folder = files.write(tmp_path / "new", "study", {"work": tmp_path / "runs", "top1": [1.5]}, "# Study",
                         echo=False)
    assert folder == tmp_path / "new" and capsys.readouterr().out == ""
    assert json.loads((folder / "study.json").read_text()) == {"work": str(tmp_path / "runs"), "top1": [1.5]}
    assert (folder / "study.md").read_text() == "# Study\n"
    files.write(folder, "study", {"top1": [2.0]}, "# Again\n")   # replaced whole; printed by default
    assert capsys.readouterr().out == "# Again\n\n"
    assert (folder / "study.md").read_text() == "# Again\n"
    assert sorted(p.name for p in folder.iterdir()) == ["study.json", "study.md"]   # no temporary left behind


def test_a_table_is_header_rule_and_rows():
    assert tables.table(["a", "b"], [["1", 2.5], ["x", ""]]) == ["| a | b |", "|---|---|", "| 1 | 2.5 |", "| x |  |"]
    assert tables.table(["only"], []) == ["| only |", "|---|"]


def test_the_machine_line():
    res = {"machine": "x86_64, 2 cores", "load_start": [1.0, 0.5, 0.25], "load_end": [2.0, 1.0, 0.5], "seconds": 61.4}
    assert machine.machine_line(res) == ("Machine: x86_64, 2 cores; load average [1.0, 0.5, 0.25] at the start, "
                                         "[2.0, 1.0, 0.5] at the end; 61 s")
    assert len(machine.load()) == 3 and "cores" in machine.machine()


def test_a_rerun_resumes_where_rows_are_already(tmp_path):
    argv = ["ablate", "--data", "digits", "--out", str(tmp_path)]
    assert runs.resumable(argv, tmp_path) == argv
    (tmp_path / "rows.jsonl").write_text("")
    assert runs.resumable(argv, tmp_path) == [*argv, "--resume"] and argv[-1] == str(tmp_path)


def test_a_studys_context_and_its_jobs_carry_the_settings_typed(tmp_path):
    """The MAP studies change the run's settings (map_points.job_for: a seed set) through the typed object the
    loader made, not as a dict they splice: the context carries it, and a job made from it runs on it."""
    from map_points import job_for

    from hetprune_hetdpt.options import HetDPTOptions

    ctx = runs.context("digits", ["hetdpt.checks=none"])
    assert ctx.settings.section(HetDPTOptions).checks == "none" and ctx.settings.run.seed == 0
    job = job_for(ctx, "b4", 3, tmp_path / "work", tmp_path / "shared")
    assert job.seed == 3 and job.config.seed == 3 and len(job.feasible_pairs()) == 5


def edits_sys_path(path) -> list[int]:
    """The lines of ``path`` that change ``sys.path`` (an assignment, an augmented one, or a call of its
    methods: insert, append, extend...)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            targets = [node.func.value]
        for t in targets:
            while isinstance(t, ast.Subscript):
                t = t.value
            if ast.unparse(t) == "sys.path":
                found.append(node.lineno)
    return sorted(found)


def test_no_file_in_benchmarks_edits_sys_path():
    """Scripts run as ``python benchmarks/NAME.py``: benchmarks/ is on the path already (``from studylib
    import ...``), and hetprune and its plugins are the installed packages."""
    edits = {str(p.relative_to(BENCHMARKS)): lines for p in sorted(BENCHMARKS.rglob("*.py"))
             if (lines := edits_sys_path(p))}
    assert not edits, f"sys.path edited in benchmarks/: {edits}"


def test_the_rule_sees_every_kind_of_edit(tmp_path):
    code = tmp_path / "x.py"
    code.write_text("import sys\nsys.path.insert(0, 'a')\nsys.path[:0] = ['b']\nsys.path += ['c']\n"
                    "sys.path.append('d')\nprint(sys.path)\nx = sys.path[0]\n")
    assert edits_sys_path(code) == [2, 3, 4, 5]


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_imports_without_running_its_study(name):
    module = script(name)
    assert module.__file__ == str(BENCHMARKS / f"{name}.py")
