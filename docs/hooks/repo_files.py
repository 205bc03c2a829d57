"""MkDocs hook: links from a docs page to repository files outside docs/ (benchmark results, examples,
source files) work on the site as they do on GitHub.

A page links to such a file with a plain relative path (``../benchmarks/results/x.md`` from docs/, one
``../`` more per folder level), which is right when the Markdown is read in the repository. At build
time every such file is copied into the site as a plain file under ``repo/`` (never rendered as a page),
and the link is pointed at that copy. A link to a repository file that does not exist is left alone,
so ``mkdocs build --strict`` still fails on it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "repo"
LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")


class _RepoFile(File):
    """A repository file copied as it is: a Markdown results file stays a file, not a page."""

    def is_documentation_page(self) -> bool:
        return False

    def is_static_page(self) -> bool:
        return False


def _repo_path(page_uri: str, target: str) -> str | None:
    """The repository path of a link that leaves docs/ and names an existing file, else None."""
    if "://" in target or target.startswith(("/", "mailto:")):
        return None
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(page_uri), target))
    if not joined.startswith("../"):
        return None
    rel = joined[3:]
    return rel if (ROOT / rel).is_file() else None


def on_files(files, config):
    docs = Path(config["docs_dir"])
    wanted = set()
    for f in files.documentation_pages():
        for m in LINK.finditer((docs / f.src_uri).read_text(encoding="utf-8")):
            if (rel := _repo_path(f.src_uri, m.group(2))) is not None:
                wanted.add(rel)
    for rel in sorted(wanted):
        files.append(_RepoFile.generated(config, f"{PREFIX}/{rel}", abs_src_path=str(ROOT / rel)))
    return files


def on_page_markdown(markdown, page, config, files):
    def point(m):
        rel = _repo_path(page.file.src_uri, m.group(2))
        if rel is None:
            return m.group(0)
        new = posixpath.relpath(f"{PREFIX}/{rel}", posixpath.dirname(page.file.src_uri) or ".")
        return f"{m.group(1)}{new}{m.group(3)}"

    return LINK.sub(point, markdown)
