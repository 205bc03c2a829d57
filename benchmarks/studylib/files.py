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
