"""Key version 2 (issue 59): every key moved once, on purpose, and the stores still find what earlier releases stored
under version 1 (MAP points, a fine-tune's checkpoint, a kept gate state); hetprune's own classes are named in
keys by package and name, so a module that moves moves no key."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch

from hetprune.core import keys
from hetprune.core.io import plain_strings
from hetprune.core.config import TrainConfig
from hetprune.model import surgery
from hetprune.model.spec import build
from hetprune.training.resume import structure_key
from hetprune.training.train import train

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from conftest import TINY_SPEC, tiny_example  # noqa: E402
from store_keys import job_for  # noqa: E402


def test_a_key_is_this_releases_string_and_knows_version_1s():
    key = keys.fingerprint({"a": 1})
    assert isinstance(key, str) and key != key.before and len(key) == len(key.before) == 16
    assert json.loads(json.dumps({"k": key})) == {"k": str(key)}
    assert keys.then({"outer": keys.fingerprint({"inner": key})}) == {"outer": keys.fingerprint({"inner": key}).before}
    assert type(plain_strings([key])[0]) is str and copy.deepcopy(key).before == key.before


def test_map_points_stored_under_version_1_are_found(tmp_path):
    from hetprune_hetdpt.strategy import HetDPT

    job = job_for(tmp_path, "hetdpt.point_selection=oneshot")
    scheme = HetDPT().scheme(job)
    store = scheme.store()
    store.path.parent.mkdir(parents=True, exist_ok=True)
    old = {"n_attn": 1, "n_act": 0, "metric": 71.5, "key": scheme.key.before, "measured_at": "2026-11-01 10:00"}
    other = {"n_attn": 0, "n_act": 1, "metric": 12.0, "key": keys.fingerprint({"other": 1}).before}
    store.path.write_text(json.dumps(old) + "\n" + json.dumps(other) + "\n")
    store.append({"n_attn": 0, "n_act": 2, "metric": 60.0})   # one this release measured
    found = store.load()
    assert set(found) == {(1, 0), (0, 2)} and found[(1, 0)]["metric"] == 71.5
    assert json.loads(store.path.read_text().splitlines()[-1])["key"] == str(scheme.key)   # new ones: version 2


def test_a_fine_tune_checkpoint_stored_under_version_1_is_continued(tiny_model, digits_data, tmp_path):
    cfg = TrainConfig(epochs=2, subset=48, batch_size=16, kd="none", seed=3)
    key = {"data": keys.fingerprint({"data": "digits"}), "structure": structure_key(tiny_model),
           "teacher": keys.fingerprint({"teacher": None})}
    full = copy.deepcopy(tiny_model)
    train(full, digits_data, cfg, progress=False)

    class Stop(Exception):
        pass

    def stop(epoch, metrics):
        raise Stop

    try:
        train(copy.deepcopy(tiny_model), digits_data, cfg, checkpoint_dir=tmp_path, resume_key=key, progress=False,
              on_epoch_end=stop)
    except Stop:
        pass
    path = tmp_path / "finetune-checkpoint.pt"
    saved = torch.load(path, weights_only=True)
    saved["key"] = keys.then(key)   # as an earlier release wrote it
    assert saved["key"]["data"] != key["data"]
    torch.save(saved, path)
    logs: list[str] = []
    resumed = copy.deepcopy(tiny_model)
    train(resumed, digits_data, cfg, checkpoint_dir=tmp_path, resume=True, resume_key=key, progress=False,
          log=logs.append)
    assert not any("afresh" in line for line in logs), logs
    x = tiny_example()
    assert torch.allclose(resumed(x), full(x), atol=1e-6)
    # another start is still another start, under either version's key, and the log names only what changed
    # (not the teacher, whose key moved with the version only)
    saved["key"] = keys.then(key)
    torch.save(saved, path)
    other = {**key, "data": keys.fingerprint({"data": "pairs"})}
    train(copy.deepcopy(tiny_model), digits_data, cfg, checkpoint_dir=tmp_path, resume=True, resume_key=other,
          progress=False, log=logs.append)
    assert any("made with another data; starting it afresh" in line for line in logs), logs


def test_a_kept_gate_state_stored_under_version_1_is_found(tmp_path):
    from hetprune_hetdpt.scorers import _shared_path

    prefix = {"start": keys.fingerprint({"weights": 1}), "removed": ["attn0"]}
    new = _shared_path(tmp_path, prefix)
    old = tmp_path / f"gate-{keys.fingerprint(prefix).before[:24]}.pt"
    assert new != old and not new.exists()
    old.write_bytes(b"kept")
    assert _shared_path(tmp_path, prefix) == old
    new.write_bytes(b"kept")   # once there is one under this release's key, that one
    assert _shared_path(tmp_path, prefix) == new


def test_a_module_that_moves_moves_no_key(monkeypatch):
    torch.manual_seed(0)
    model = build(TINY_SPEC)
    surgery.remove_attention(model, 0)
    surgery.remove_activation(model, 1)
    surgery.merge_all(model)
    ours = {type(m) for m in model.modules() if type(m).__module__.startswith("hetprune.")}
    assert ours, "surgery inserted none of hetprune's modules"
    key = structure_key(model)
    for cls in ours:
        monkeypatch.setattr(cls, "__module__", "hetprune.model.elsewhere")
    moved = structure_key(model)
    assert moved == key
    assert moved.before != key.before   # version 1 named a module by its path: there a move needed the MOVED table


def test_a_user_tasks_key_does_not_move_with_hetprunes_modules(monkeypatch):
    """A Task whose code closes over hetprune's data objects and functions names them in its key; moving their
    modules leaves it where it was (version 1 needed a table entry per move: `keys.SPLIT_FROM`)."""
    import inspect

    from test_data_modules import SPLIT, user_task

    key = user_task().key
    for module in SPLIT:
        for _, obj in inspect.getmembers(module):
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__module__ == module.__name__:
                monkeypatch.setattr(obj, "__module__", "hetprune.training.elsewhere")
    moved = user_task().key
    assert moved == key and moved.before != key.before
