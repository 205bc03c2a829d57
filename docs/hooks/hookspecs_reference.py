"""MkDocs hook: write the list of plugin hooks from hetprune/core/hookspecs.py.

The page docs/plugins.md holds a marker; at build time it is replaced by a table with one row per hook
marked ``@hookspec``: its name, its arguments (from the signature), the first sentence of its docstring,
and a link to the page's own section on it. The list therefore cannot drift from the code, and a hook
without a section on the page fails the build.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

from markdown.extensions.toc import slugify

MARKER = "<!-- hookspecs-reference -->"
ROOT = Path(__file__).resolve().parents[2]
HEADING = re.compile(r"^#{2,6}\s+(.*?)\s*$", re.M)


def hooks() -> list[tuple[str, inspect.Signature, str]]:
    """``(name, signature, docstring)`` of every hookspec, in the file's order."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from hetprune.core import hookspecs

    found = []
    for name, fn in vars(hookspecs).items():
        if inspect.isfunction(fn) and hasattr(fn, f"{hookspecs.PROJECT}_spec"):
            found.append((name, inspect.signature(fn), inspect.getdoc(fn) or ""))
    return sorted(found, key=lambda h: inspect.getsourcelines(getattr(hookspecs, h[0]))[1])


def first_sentence(doc: str) -> str:
    """The docstring's first sentence: up to the first full stop outside parentheses."""
    text = " ".join(doc.split("\n\n")[0].split()).replace("``", "`")
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "." and depth == 0 and (i + 1 == len(text) or text[i + 1] == " "):
            text = text[:i + 1]
            break
    return text.replace("|", "\\|")


def sections(markdown: str) -> dict[str, str]:
    """Hook name -> anchor of the first heading of the page that names it in backticks."""
    out = {}
    for m in HEADING.finditer(markdown):
        for name in re.findall(r"`(\w+)`", m.group(1)):
            out.setdefault(name, slugify(m.group(1).replace("`", ""), "-"))
    return out


def render(markdown: str) -> str:
    anchors = sections(markdown)
    lines = ["| hook | arguments | kind | what it is for |", "|---|---|---|---|"]
    missing = []
    for name, sig, doc in hooks():
        if name not in anchors:
            missing.append(name)
            continue
        args = ", ".join(f"`{p}`" for p in sig.parameters)
        kind = "registration" if name.startswith("register_") else "event"
        lines.append(f"| [`{name}`](#{anchors[name]}) | {args} | {kind} | {first_sentence(doc)} |")
    if missing:
        raise ValueError(f"docs/plugins.md has no section heading naming the hook(s) {missing}")
    return "\n".join(lines)


def on_page_markdown(markdown, page, config, files):
    if MARKER in markdown:
        return markdown.replace(MARKER, render(markdown))
    return markdown
