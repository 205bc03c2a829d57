"""How every study script writes its results: ``NAME.json`` and ``NAME.md`` under ``--results``, each whole or not
at all (one place, so the studies' files read alike)."""

from __future__ import annotations

import json
from pathlib import Path

from hetprune.core.io import write_text_atomic


def write(results: str | Path, name: str, res: dict, markdown: str, echo: bool = True) -> Path:
    """``res`` as ``NAME.json`` and ``markdown`` as ``NAME.md`` under ``results`` (made if missing), each whole
    or not at all (an interrupted study never leaves half a results file over the committed one); what JSON
    cannot hold (a path, a numpy number) is written as its text. The markdown is printed too unless ``echo`` is
    off. Returns the folder."""
    folder = Path(results)
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / f"{name}.json", json.dumps(res, indent=1, default=str) + "\n")
    write_text_atomic(folder / f"{name}.md", markdown if markdown.endswith("\n") else markdown + "\n")
    if echo:
        print(markdown)
    return folder


def add_study_arguments(parser, studies: list[str], name: str, results: Path) -> None:
    """The options of a script that reads committed map-points studies (check_regret.py, check_bound.py):
    which studies, the folder they and its own results are in, and its results' name."""
    parser.add_argument("--studies", default=",".join(studies), help="committed map-points results to read (names)")
    parser.add_argument("--results", default=str(results), help="folder of the studies and of what this writes")
    parser.add_argument("--name", default=name)


def read_studies(results: str | Path, names: str, refuse) -> dict[str, dict]:
    """The committed studies ``names`` (comma-separated, each ``NAME.json`` under ``results``) by name, in
    order; a missing one goes to ``refuse`` (an argument parser's ``error``) with the command that makes it."""
    studies = {}
    for name in [s for s in names.split(",") if s]:
        path = Path(results) / f"{name}.json"
        if not path.is_file():
            refuse(f"no committed study {path} (run benchmarks/map_points.py --name {name} first)")
        studies[name] = json.loads(path.read_text())
    return studies
