"""The documentation's examples still run (issue 29: docs that cannot rot).

Every fenced ``python``, ``bash``, ``console`` and ``sh`` block of README.md and docs/**/*.md carries a
marker on the line right before it: ``<!-- runnable -->`` (this test runs it) or
``<!-- not-runnable: REASON -->`` (skipped; the reason is required). A block with neither fails the test,
so nothing is left unchecked by accident. The convention is described in docs/development.md
("Contributing to the docs").

A page's runnable shell blocks run first, in order, in one fresh temporary folder; then its runnable Python
blocks run there, concatenated in order, as one script (so a block may use what an earlier one defined).
``hetprune ARGS`` lines run as ``python -m hetprune ARGS`` with the tiny options of ``TINY`` appended
(argparse keeps the last value of a repeated option, so they override the page's); other lines run in bash
as written.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LANGS = ("python", "bash", "console", "sh")
RUNNABLE = "<!-- runnable -->"
NOT_RUNNABLE = re.compile(r"^<!-- not-runnable: *(.*?) *-->$")
FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)")
TIMEOUT_S = 300

# The tiny stand-in for the embedded digits ViT: depth 12, so the documented budgets (up to 24 sites)
# exist, but 16 wide and 4 tokens, so a whole strategy runs in seconds.
TINY_MODEL = dict(img_size=16, patch_size=8, in_chans=1, num_classes=10, embed_dim=16, depth=12, num_heads=2,
                  init_values=0.1)
_FAST = ["--set", "finetune.epochs=1", "--set", "finetune.subset=48", "--set", "short_finetune.epochs=1",
         "--set", "short_finetune.subset=48", "--set", "scoring.subset=48", "--set", "scoring.batches=1",
         "--set", "scorer_options={gate-taylor: {epochs_per_removal: 1, warmup_epochs: 0}}"]
_FAST_HETDPT = ["--set", "hetdpt.axis_points=2", "--set", "hetdpt.mixed_points=2"]   # only where hetdpt runs
# per sub-command: the options appended to a documented command line ("{model}": the tiny stand-in's
# options, added only when the command names no --model of its own; "{hetdpt}": _FAST_HETDPT, added only
# when the command runs the hetdpt strategy, since other strategies refuse its settings)
TINY = {
    "prune": ["{model}", *_FAST, "{hetdpt}"],
    "compare": ["{model}", *_FAST, "{hetdpt}", "--seeds", "0", "--speed-budget", "0", "--batch-sizes", "1,8"],
    "ablate": ["{model}", *_FAST, "{hetdpt}", "--seeds", "0"],
    "bench": ["--batch-sizes", "1", "--repeats", "2", "--warmup", "1", "--min-time", "0", "--threads", "1"],
    "apply": [], "export": [], "plugins": [],
}


@dataclass
class Block:
    path: Path
    line: int            # 1-based line of the opening fence
    lang: str
    code: str
    marker: str | None   # "runnable", "not-runnable", or None (missing)
    reason: str = ""

    def where(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path.name
        return f"{path}:{self.line}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks_of(path: Path) -> list[Block]:
    """Every fenced block of a collected language in a Markdown file, with the marker before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            i += 1
        body = "\n".join(lines[start + 1:i])
        i += 1
        if lang not in LANGS:
            continue
        prev = lines[start - 1].strip() if start else ""
        nr = NOT_RUNNABLE.match(prev)
        marker = "runnable" if prev == RUNNABLE else ("not-runnable" if nr else None)
        found.append(Block(path, start + 1, lang, body, marker, nr.group(1) if nr else ""))
    return found


def all_blocks() -> list[Block]:
    return [b for p in doc_files() for b in blocks_of(p)]


# -- running ------------------------------------------------------------------------------------------------

def command_lines(block: Block) -> list[str]:
    """The commands of a shell block: continuation lines joined; a console block's lines that start with $."""
    text = block.code.replace("\\\n", " ")
    if block.lang == "console":
        return [ln[2:].strip() for ln in text.splitlines() if ln.startswith("$ ")]
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def strategies_of(args: list[str]) -> list[str]:
    """The strategies a prune, compare or ablate command line runs (hetdpt where it names none)."""
    for option in ("--strategy", "--strategies"):
        if option in args and args.index(option) + 1 < len(args):
            return args[args.index(option) + 1].split(",")
    return ["hetdpt"]   # the default of prune and ablate, and one of compare's default strategies


def hetprune_argv(line: str, model_args: list[str]) -> list[str] | None:
    """``python -m hetprune ...`` with the tiny options for a ``hetprune`` line; None for any other line."""
    words = shlex.split(line, comments=True)
    if not words or words[0] != "hetprune":
        return None
    args = words[1:]
    command = next((a for a in args if not a.startswith("-")), None)
    extra = []
    for option in TINY.get(command, []):
        if option == "{model}":
            extra += [] if "--model" in args else model_args
        elif option == "{hetdpt}":
            extra += _FAST_HETDPT if "hetdpt" in strategies_of(args) else []
        else:
            extra.append(option)
    return [sys.executable, "-m", "hetprune", *args, *extra]


def run_checked(argv, cwd: Path, env: dict, what: str, shell: bool = False) -> None:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, shell=shell,
                          executable="/bin/bash" if shell else None)
    if proc.returncode != 0:
        shown = argv if shell else shlex.join(argv)
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        pytest.fail(f"{what} failed (exit {proc.returncode})\n  ran: {shown}\n{tail}", pytrace=False)


def run_page(blocks: list[Block], cwd: Path, env: dict, model_args: list[str]) -> None:
    """A page's runnable shell blocks in order, then its runnable Python blocks as one script."""
    for b in blocks:
        if b.lang == "python":
            continue
        for line in command_lines(b):
            argv = hetprune_argv(line, model_args)
            what = f"{b.where()} `{line}`"
            run_checked(line if argv is None else argv, cwd, env, what, shell=argv is None)
    python = [b for b in blocks if b.lang == "python"]
    if python:
        script = cwd / "docs_example.py"
        script.write_text("\n\n".join(f"# --- {b.where()}\n{b.code}" for b in python) + "\n")
        run_checked([sys.executable, str(script)], cwd, env, f"the Python blocks of {python[0].where()}")


@pytest.fixture(scope="session")
def tiny_model_args(tmp_path_factory) -> list[str]:
    """``--model ... --model-kwargs ... --checkpoint ...`` of the tiny stand-in (random weights)."""
    import torch

    from hetprune.core.io import save_weights
    from hetprune.model.spec import ModelSpec, build

    spec = ModelSpec("vit_tiny_patch16_224", TINY_MODEL)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("docs-model") / "tiny12.safetensors"
    save_weights(path, build(spec))
    return ["--model", spec.name, "--model-kwargs", json.dumps(spec.kwargs), "--checkpoint", str(path)]


def example_env(cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HETPRUNE_PLUGINS", "HETPRUNE_DEBUG")}
    env.update(HETPRUNE_CACHE=str(cache), HETPRUNE_NO_PROGRESS="1", OMP_NUM_THREADS="1", MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    return env


# -- the tests ----------------------------------------------------------------------------------------------

def test_every_code_block_is_marked():
    blocks = all_blocks()
    assert len(blocks) > 20, "the collector found almost no code blocks: is it reading the docs?"
    unmarked = [b.where() for b in blocks if b.marker is None]
    assert not unmarked, ("code blocks without <!-- runnable --> or <!-- not-runnable: REASON --> on the line "
                          "before them:\n  " + "\n  ".join(unmarked))
    no_reason = [b.where() for b in blocks if b.marker == "not-runnable" and not b.reason]
    assert not no_reason, "not-runnable blocks without a reason:\n  " + "\n  ".join(no_reason)


def test_collector_sees_markers_and_refuses_unmarked_blocks(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n\n```bash\nhetprune plugins\n```\n\n<!-- runnable -->\n```python\nx = 1\n```\n"
                    "<!-- not-runnable: needs a GPU -->\n```sh\nnvidia-smi\n```\n\n```text\nnot code\n```\n")
    found = blocks_of(page)
    assert [(b.lang, b.marker, b.reason, b.line) for b in found] == [
        ("bash", None, "", 3), ("python", "runnable", "", 8), ("sh", "not-runnable", "needs a GPU", 12)]


def test_tiny_options_follow_the_documented_command():
    model = ["--model", "tiny"]
    argv = hetprune_argv("hetprune compare --budgets 8,12 --seeds 0,1,2   # a comment", model)
    assert argv[:3] == [sys.executable, "-m", "hetprune"]
    args = argv[3:]
    assert args[:5] == ["compare", "--budgets", "8,12", "--seeds", "0,1,2"]
    assert args[5:7] == model and args[args.index("--seeds", 5) + 1] == "0"   # the last --seeds wins
    assert "hetdpt.axis_points=2" in args                                      # compare runs hetdpt by default
    assert hetprune_argv("hetprune prune --model deit_small_patch16_224", model).count("--model") == 1
    assert "hetdpt.axis_points=2" not in hetprune_argv("hetprune prune --strategy act-only --budget 4", model)
    assert hetprune_argv("python benchmarks/x.py", model) is None


def test_a_broken_documented_command_fails(tmp_path, tiny_model_args):
    page = tmp_path / "page.md"
    page.write_text("<!-- runnable -->\n```bash\nhetprune plugins --no-such-option\n```\n")
    with pytest.raises(pytest.fail.Exception, match=r"(?s)page.md:2 `hetprune plugins --no-such-option`.*"
                                                    r"exit 2.*unrecognized arguments: --no-such-option"):
        run_page(blocks_of(page), tmp_path, example_env(tmp_path / "cache"), tiny_model_args)


def _pages_with_runnable_blocks() -> list[Path]:
    return [p for p in doc_files() if any(b.marker == "runnable" for b in blocks_of(p))]


@pytest.mark.parametrize("page", _pages_with_runnable_blocks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_runnable_blocks_run(page, tmp_path, tiny_model_args):
    blocks = [b for b in blocks_of(page) if b.marker == "runnable"]
    work = tmp_path / "work"
    work.mkdir()
    run_page(blocks, work, example_env(tmp_path / "cache"), tiny_model_args)


# -- docstrings render on the site: Markdown cross-references, never reST roles ---------------------------------
RAW_ROLE = re.compile(r":(func|class|meth|mod|data|attr|exc|obj|ref):`")


def docstrings(path: Path):
    """``(line, text)`` of every module, class and function docstring in ``path``."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text:
                yield getattr(node, "lineno", 1), text


def raw_roles(paths, root: Path = ROOT) -> list[str]:
    return [f"{p.relative_to(root)}:{line}: {m.group(0)}" for p in paths for line, text in docstrings(p)
            for m in RAW_ROLE.finditer(text)]


def test_no_docstring_holds_a_raw_rest_role():
    """mkdocstrings renders docstrings as Markdown: a reST role (:func:`x`) shows on the site as typed. Write
    [`x`][hetprune.module.x] (a link where x is documented) or `x`."""
    paths = sorted([*(ROOT / "hetprune").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")])
    assert not raw_roles(paths), "\n".join(raw_roles(paths))


def test_the_role_check_sees_a_raw_role(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('def f():\n    """See :func:`hetprune.prune`."""\n')
    assert raw_roles([bad], tmp_path) == ["bad.py:1: :func:`"]


def test_ci_runs_the_test_command_the_install_section_gives():
    """README's install section names the command CI runs: .ci/run must call that exact pytest command (and the
    docs' copies of the section must name the same one), so a change to one cannot leave the other behind."""
    command = re.compile(r"^bash scripts/install\.sh && (python -m pytest[^#]*?)\s*#", re.M)
    given = {page: command.findall((ROOT / page).read_text()) for page in
             ("README.md", "docs/index.md", "docs/getting-started.md")}
    assert all(len(found) == 1 for found in given.values()), given
    assert len({found[0] for found in given.values()}) == 1, given
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip().startswith("python -m pytest")]
    assert ci == given["README.md"], (ci, given["README.md"])


# issue 60's limits for the front door: a README that fits on a few screens, one claim per results row
README_MAX_LINES = 170
README_MAX_CELL = 250


def test_the_readme_fits_a_few_screens_and_its_table_cells_stay_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (f"README.md has {len(lines)} lines; issue 60 keeps it within "
                                            f"{README_MAX_LINES}: move detail to docs/")
    cells = [(n, cell.strip()) for n, line in enumerate(lines, 1) if line.startswith("|")
             for cell in line.strip().strip("|").split(" | ")]
    long = [(n, len(c)) for n, c in cells if len(c) > README_MAX_CELL]
    assert not long, f"README.md table cells over {README_MAX_CELL} characters (line, length): {long}"


# -- the site's pages and links (issue 60, item 6): what `mkdocs build --strict` checks, without building ----------
DOCS = ROOT / "docs"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
GENERATED = ("<!-- cli-reference -->", "<!-- settings-reference -->", "<!-- hookspecs-reference -->")


def nav_pages(nav) -> list[str]:
    """Every page path named in mkdocs.yml's nav, in order."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in nav_pages(item)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in nav_pages(value)]
    return []


def site_pages() -> list[str]:
    """Every Markdown page under docs/ that mkdocs builds (docs/hooks/ is excluded there too)."""
    return sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    import yaml

    nav = nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    assert len(nav) == len(set(nav)), f"pages named twice in mkdocs.yml's nav: {sorted({p for p in nav if nav.count(p) > 1})}"
    missing_file = [p for p in nav if not (DOCS / p).is_file()]
    assert not missing_file, f"mkdocs.yml's nav names pages that do not exist under docs/: {missing_file}"
    not_in_nav = [p for p in site_pages() if p not in nav]
    assert not not_in_nav, f"pages under docs/ that mkdocs.yml's nav does not list: {not_in_nav}"


def headings_anchors(path: Path) -> set[str]:
    """The anchors Python-Markdown's toc gives the headings of a page (outside fenced code)."""
    from markdown.extensions.toc import slugify

    anchors, fenced = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1)).replace("`", "")
            anchors.add(slugify(text, "-"))
    return anchors


def broken_links(pages: list[Path]) -> list[str]:
    """Relative links of these pages to a file that does not exist, or to a heading a page does not have."""
    bad = []
    for page in pages:
        text = re.sub(r"(?ms)^(`{3,}).*?^\1", "", page.read_text(encoding="utf-8"))   # not inside code blocks
        for m in LINK.finditer(text):
            target = m.group(1) or m.group(2)
            if "://" in target or target.startswith(("mailto:", "#")):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve()
            where = f"{page.relative_to(ROOT)}: {target}"
            if not dest.exists():
                bad.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and dest.is_relative_to(DOCS) \
                    and not any(g in dest.read_text(encoding="utf-8") for g in GENERATED) \
                    and anchor not in headings_anchors(dest):
                bad.append(f"{where} (no heading with that anchor)")
    return bad


def test_relative_links_of_the_readme_and_the_docs_lead_somewhere():
    pages = [ROOT / "README.md", *(DOCS / p for p in site_pages())]
    bad = broken_links(pages)
    assert not bad, "broken relative links:\n  " + "\n  ".join(bad)


def test_the_link_check_sees_a_missing_file_and_a_missing_anchor(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "DOCS", tmp_path)
    (tmp_path / "a.md").write_text("# A page\n\n## Its `section` here\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#its-section-here) [no file](c.md) [no anchor](a.md#nowhere) [web](https://x.org)\n"
                    "```text\n[in code](d.md)\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert broken_links([page]) == ["b.md: c.md (no such file)", "b.md: a.md#nowhere (no heading with that anchor)"]


# -- a file shown whole on a page is the file as it is ------------------------------------------------------
SHOWN_WHOLE = re.compile(r"the whole file (\S+) \(tests/test_docs\.py checks it is shown as it is\)")


def test_files_shown_whole_match_the_repository():
    shown = [(b, SHOWN_WHOLE.search(b.reason)) for b in all_blocks() if b.marker == "not-runnable"]
    shown = [(b, m.group(1)) for b, m in shown if m]
    assert shown, "no page shows a repository file whole: is the marker's wording still the one this test reads?"
    stale = [f"{b.where()}: {path}" for b, path in shown
             if b.code.strip() != (ROOT / path).read_text(encoding="utf-8").strip()]
    assert not stale, "blocks that no longer match the file they show (copy the file again):\n  " + "\n  ".join(stale)
