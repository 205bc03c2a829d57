"""Output folders: ``--overwrite`` replaces a hetprune result and never anything else (issue 34, item 1),
an output folder needs a name of its own, and what hetprune writes follows the user's umask (item 23)."""

from __future__ import annotations

import os
import stat

import pytest
import torch

import hetprune
from hetprune import HetpruneError
from hetprune.cli import main
from hetprune.harness.compare import COMPARE_FOLDER, prepare_out
from hetprune.core.io import atomic_folder, check_result_folder
from hetprune.model.recipe import PRUNED_MODEL, arch_of, recipe_from_model
from hetprune.model.spec import build
from conftest import TINY_SPEC


def _pruned(seed: int = 0):
    torch.manual_seed(seed)
    model = build(TINY_SPEC)
    hetprune.model.surgery.remove_activation(model, seed % 4)
    return model.eval(), recipe_from_model(model, TINY_SPEC, arch_of(build(TINY_SPEC)))


def _user_files(folder):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("mycode.py", "print('mine')\n"), ("notes.txt", "my notes\n")):
        (folder / name).write_text(text)


def test_prune_overwrite_refuses_a_folder_holding_the_users_files_and_deletes_nothing(tmp_path, capsys):
    out = tmp_path / "d"
    _user_files(out)
    code = main(["prune", "--strategy", "act-only", "--budget", "2", "--out", str(out), "--overwrite"])
    err = capsys.readouterr().err
    assert code == 2
    assert "hetprune did not write (mycode.py, notes.txt)" in err and "--overwrite" in err
    assert "already holds a" not in err   # a folder of the user's files is not "a result"
    assert (out / "mycode.py").read_text() == "print('mine')\n" and (out / "notes.txt").is_file()
    assert not (tmp_path / "d.work").exists()


def test_python_overwrite_refuses_the_users_files_and_names_the_argument(tmp_path):
    out = tmp_path / "d"
    _user_files(out)
    model, recipe = _pruned()
    with pytest.raises(HetpruneError, match=r"did not write \(mycode.py, notes.txt\).*overwrite=True or without"):
        hetprune.save(out, model, recipe, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["mycode.py", "notes.txt"]


def test_overwrite_replaces_a_result_and_keeps_what_reached_the_folder_meanwhile(tmp_path):
    out = tmp_path / "r"
    model_a, recipe_a = _pruned(0)
    model_b, recipe_b = _pruned(1)
    hetprune.save(out, model_a, recipe_a)
    with pytest.raises(HetpruneError, match="already holds a different result; pass overwrite=True"):
        hetprune.save(out, model_b, recipe_b)
    # a user's file that appears while a new result is being written is moved into it, not deleted
    with atomic_folder(out, overwrite=True, kind=PRUNED_MODEL) as tmp:
        (out / "late.txt").write_text("written during the run\n")
        (tmp / "recipe.json").write_text("{}\n")   # the new result's files (any will do: the swap is tested)
    assert (out / "late.txt").read_text() == "written during the run\n"
    assert not any(".old-" in p.name or ".partial-" in p.name for p in tmp_path.iterdir())
    hetprune.save(tmp_path / "r2", model_a, recipe_a)
    hetprune.save(tmp_path / "r2", model_b, recipe_b, overwrite=True)   # a result of hetprune's: replaced
    assert hetprune.model.recipe.load_recipe(tmp_path / "r2").act_removed == recipe_b.act_removed


def test_compare_overwrite_deletes_only_its_own_entries(tmp_path):
    out = tmp_path / "c"
    (out / "models" / "x").mkdir(parents=True)
    (out / "rows.jsonl").write_text("")
    (out / "results.md").write_text("old\n")
    (out / ".results.md.abc123.tmp").write_text("interrupted write\n")   # its own temporary file: not foreign
    with pytest.raises(HetpruneError, match="already holds a compare result; pass overwrite=True"):
        prepare_out(out, resume=False, overwrite=False)
    prepare_out(out, resume=False, overwrite=True)
    assert list(out.iterdir()) == []
    (out / "rows.jsonl").write_text("")
    (out / "train.py").write_text("# mine\n")
    for overwrite, resume in ((True, False), (False, True), (False, False)):
        with pytest.raises(HetpruneError, match=r"1 entry hetprune did not write \(train.py\)"):
            check_result_folder(out, COMPARE_FOLDER, overwrite=overwrite, resume=resume)
    assert (out / "train.py").read_text() == "# mine\n" and (out / "rows.jsonl").exists()


def test_a_folder_of_the_users_files_is_refused_by_compare_and_ablate_on_the_command_line(tmp_path, capsys):
    out = tmp_path / "mine"
    _user_files(out)
    for command in (["compare", "--budgets", "2"], ["ablate", "--budget", "2"]):
        assert main([*command, "--out", str(out), "--overwrite"]) == 2
        assert "hetprune did not write (mycode.py, notes.txt)" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["mycode.py", "notes.txt"]


@pytest.mark.parametrize("name", [".", "..", "sub/.."])
def test_an_output_folder_without_a_name_of_its_own_is_one_clear_error(tmp_path, monkeypatch, capsys, name):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    assert main(["prune", "--strategy", "act-only", "--budget", "2", "--out", name]) == 2
    err = capsys.readouterr().err
    assert f"output folder {name!r} has no name of its own" in err and "--out runs/mine" in err
    assert "Traceback" not in err


def test_results_follow_the_users_umask(tmp_path):
    old = os.umask(0o022)
    try:
        model, recipe = _pruned()
        out = hetprune.save(tmp_path / "r", model, recipe, extra_files={"report.json": {"a": 1}})
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {
        "recipe.json": 0o644, "model.safetensors": 0o644, "report.json": 0o644}


# -- output paths that are links or files (issue 40, items 4, 6, 7) -----------------------------------------

def test_overwrite_through_a_linked_folder_writes_into_its_target_and_keeps_the_link(tmp_path):
    disk = tmp_path / "other-disk"
    disk.mkdir()
    target, link = disk / "results", tmp_path / "results"
    model_a, recipe_a = _pruned(0)
    model_b, recipe_b = _pruned(1)
    hetprune.save(target, model_a, recipe_a)
    link.symlink_to(target, target_is_directory=True)
    hetprune.save(link, model_b, recipe_b, overwrite=True)
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert hetprune.model.recipe.load_recipe(target).act_removed == recipe_b.act_removed   # the real path: the new one
    assert hetprune.model.recipe.load_recipe(link).act_removed == recipe_b.act_removed
    left = sorted(p.name for p in [*tmp_path.iterdir(), *disk.iterdir()])
    assert left == ["other-disk", "results", "results"], left   # nothing hidden beside the link or the target


def test_compare_and_ablate_folders_that_are_links_are_written_through(tmp_path):
    target = tmp_path / "real"
    (target / "models").mkdir(parents=True)
    (target / "rows.jsonl").write_text("")
    link = tmp_path / "c"
    link.symlink_to(target, target_is_directory=True)
    assert prepare_out(link, resume=False, overwrite=True) == target.resolve()
    assert link.is_symlink() and list(target.iterdir()) == []


def test_a_dangling_link_as_the_output_folder_is_one_error_before_any_work(tmp_path, capsys):
    out = tmp_path / "out"
    out.symlink_to(tmp_path / "gone", target_is_directory=True)
    assert main(["prune", "--strategy", "act-only", "--budget", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "symbolic link to" in err and "which does not exist" in err and "Traceback" not in err
    assert out.is_symlink() and not (tmp_path / "gone").exists() and not (tmp_path / "out.work").exists()
    for kind in (COMPARE_FOLDER, PRUNED_MODEL):
        with pytest.raises(HetpruneError, match="which does not exist"):
            check_result_folder(out, kind, overwrite=True)


def test_a_file_where_the_checkpoints_go_is_one_error_before_any_work(tmp_path, capsys):
    (tmp_path / "out.work").write_text("a file of the user's\n")
    assert main(["prune", "--strategy", "act-only", "--budget", "2", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "out.work is a file, where hetprune keeps the checkpoints" in err and "Traceback" not in err
    assert (tmp_path / "out.work").read_text() == "a file of the user's\n" and not (tmp_path / "out").exists()
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "models").write_text("")
    with pytest.raises(HetpruneError, match="models is a file, where hetprune keeps the compare's models"):
        prepare_out(tmp_path / "c", resume=True, overwrite=False)
