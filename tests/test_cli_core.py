"""The ``hetprune`` command line as a user runs it: a real process, ``python -m hetprune``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import hetprune
from hetprune.cli import build_parser, main


def run(*args, **env):
    full_env = {k: v for k, v in os.environ.items() if k != "HETPRUNE_PLUGINS"}
    full_env.update(env)
    return subprocess.run([sys.executable, "-m", "hetprune", *args], capture_output=True, text=True,
                          env=full_env, timeout=120)


def test_help_lists_the_commands():
    r = run("--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: hetprune")
    for command in ("plugins", "apply", "prune"):
        assert command in r.stdout


def test_plugins_command_in_a_real_process():
    r = run("plugins")
    assert r.returncode == 0, r.stderr
    assert f"hetdpt {hetprune.__version__}  (entry point hetprune_hetdpt)" in r.stdout
    assert "poly" in r.stdout and "mix50" in r.stdout


def test_no_command_prints_help_and_version_is_reported(capsys):
    assert main([]) == 0
    assert "usage: hetprune" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"hetprune {hetprune.__version__}"


def test_every_command_has_help_and_takes_plugin(capsys):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, subparser in sub.choices.items():
        with pytest.raises(SystemExit) as exit_:
            main([name, "--help"])
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: hetprune {name}") and "--plugin MODULE" in out, name


def test_bad_model_kwargs_are_a_clear_error(tmp_path, capsys):
    for kwargs, message in (("{not json", "--model-kwargs is not valid JSON"),
                            ("[1, 2]", "--model-kwargs must be a JSON object")):
        assert main(["apply", "--model", "vit_tiny_patch16_224", "--model-kwargs", kwargs,
                     "--recipe", "deit_base_hetdpt_paper", "--out", str(tmp_path / "o")]) == 2
        assert message in capsys.readouterr().err
    assert main(["apply", "--model", "no_such_timm_model", "--recipe", "deit_base_hetdpt_paper",
                 "--out", str(tmp_path / "o")]) == 2
    assert "timm has no model named 'no_such_timm_model'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_long_error_is_one_line_and_debug_keeps_the_detail(tmp_path):
    """PyYAML's error runs over several lines with carets: the user sees one line; --debug shows it all."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("finetune: [1, 2\n")
    plain = run("prune", "--config", str(bad), "--budget", "1", "--out", str(tmp_path / "o"))
    assert plain.returncode == 2
    assert plain.stderr.strip().splitlines() == [plain.stderr.strip()]
    assert plain.stderr.startswith(f"error: config file {bad} is not valid YAML: ") and "line 2" in plain.stderr
    debug = run("prune", "--debug", "--config", str(bad), "--budget", "1", "--out", str(tmp_path / "o"))
    assert debug.returncode == 2 and "Traceback" in debug.stderr
    assert "while parsing a flow sequence" in debug.stderr and "^" in debug.stderr  # PyYAML's own text
    assert [line for line in debug.stderr.splitlines() if line.startswith("error:")] == \
        plain.stderr.strip().splitlines()


def test_a_message_of_several_lines_is_cut_to_its_first(capsys, monkeypatch):
    """Any error whose text runs on (a library's message quoted in it) still prints one line."""
    from hetprune.cli.commands import plugins_cmd
    from hetprune.core.errors import HetpruneError

    def fail(args):
        raise HetpruneError("first line says what\nsecond line\n  third")

    monkeypatch.setattr(plugins_cmd, "run", fail)
    assert main(["plugins"]) == 2
    assert capsys.readouterr().err.splitlines() == ["error: first line says what (--debug shows the rest)"]
