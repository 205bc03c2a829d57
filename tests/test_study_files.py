"""benchmarks/study_files.write: the one way the study scripts write their results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import study_files  # noqa: E402


def test_write_puts_json_and_markdown_side_by_side_with_paths_as_text(tmp_path, capsys):
    folder = study_files.write(tmp_path / "new", "study", {"work": tmp_path / "runs", "top1": [1.5]}, "# Study",
                               echo=False)
    assert folder == tmp_path / "new" and capsys.readouterr().out == ""
    assert json.loads((folder / "study.json").read_text()) == {"work": str(tmp_path / "runs"), "top1": [1.5]}
    assert (folder / "study.md").read_text() == "# Study\n"
    study_files.write(folder, "study", {"top1": [2.0]}, "# Again\n")   # replaced whole; printed by default
    assert capsys.readouterr().out == "# Again\n\n"
    assert (folder / "study.md").read_text() == "# Again\n"
    assert sorted(p.name for p in folder.iterdir()) == ["study.json", "study.md"]   # no temporary left behind
