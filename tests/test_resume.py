"""Resume keys: a checkpoint is reused only when everything that shaped it is the same.

The fine-tune checkpoint and the gate-phase checkpoint carry what their stage
started from (weights, teacher, data, settings, sites). With ``--resume`` an
unchanged rerun reuses them (no epoch is trained again); a changed base model,
learning rate, seed or data set makes the stage start afresh, and the log says
what changed.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from hetprune import Budget, surgery
from hetprune.pipeline import finetune, select_sites
from hetprune.testing import tiny_job, tiny_model


def job_with(tmp_path, changes: dict | None = None, model=None, fingerprint: str | None = None, scorer="magnitude"):
    logs: list[str] = []
    settings = {"scorer": scorer, "finetune": {"epochs": 2, "subset": 32}, **(changes or {})}
    job = tiny_job(Budget(sites=2), tmp_path / "work", settings=settings, model=model)
    job.resume = True
    job.log = logs.append
    if fingerprint is not None:
        job.data = dataclasses.replace(job.data, fingerprint=fingerprint)
    epochs: list[int] = []
    real_event = job.event
    job.event = lambda name, **kw: (epochs.append(kw["epoch"]) if name == "on_epoch_end" else None,
                                    real_event(name, **kw))
    return job, logs, epochs


def same_state(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def resume_notes(logs: list[str]) -> list[str]:
    return [m for m in logs if m.startswith("--resume:")]


def pruned(job):
    model = copy.deepcopy(job.dense)
    surgery.remove_activation(model, 1)
    return model


def changes_for(section: dict) -> dict:
    """What each change does to a rerun, and the name the --resume note must give; ``section`` is the settings
    section (name: its values) whose learning rate the stage trains with."""
    (name, values), = section.items()
    return {
        "base": (dict(model_seed=1), "starting weights"),
        "lr": (dict(changes={name: {**values, "lr": 1e-4}}), "training settings"),
        "seed": (dict(changes={"seed": 3}), "training settings"),
        "data": (dict(fingerprint="another-data-set"), "data"),
    }


CHANGES = changes_for({"finetune": {"epochs": 2, "subset": 32}})
GATE_CHANGES = changes_for({"short_finetune": {"epochs": 1, "subset": 32}})


def run_finetune(tmp_path, model_seed=0, **kw):
    job, logs, epochs = job_with(tmp_path, model=tiny_model(model_seed), **kw)
    model = pruned(job)
    finetune(job, model)
    return model, logs, epochs


def test_unchanged_finetune_rerun_reuses_its_checkpoint(tmp_path):
    first, _, epochs = run_finetune(tmp_path)
    assert epochs == [1, 2]
    again, logs, epochs = run_finetune(tmp_path)
    assert epochs == [] and not resume_notes(logs)  # nothing trained again
    assert same_state(first, again)


@pytest.mark.parametrize("what", sorted(CHANGES))
def test_changed_finetune_input_starts_afresh_and_says_what_changed(tmp_path, what):
    run_finetune(tmp_path)
    kw, named = CHANGES[what]
    _, logs, epochs = run_finetune(tmp_path, **kw)
    assert epochs == [1, 2], f"a changed {what} reused the old checkpoint"
    said = resume_notes(logs)
    assert len(said) == 1 and named in said[0] and "starting it afresh" in said[0]


def run_gates(tmp_path, model_seed=0, **kw):
    job, logs, _ = job_with(tmp_path, model=tiny_model(model_seed), scorer="gate-taylor", **{
        **kw, "changes": {"scoring": {"subset": 32, "batches": 1, "batch_size": 16},
                          "scorer_options": {"gate-taylor": {"epochs_per_removal": 1, "warmup_epochs": 0}},
                          **(kw.get("changes") or {})}})
    model = copy.deepcopy(job.dense)
    chosen = select_sites(job, model, {"attn": 1, "act": 1})
    return model, chosen, logs


def test_unchanged_gate_phase_rerun_reuses_its_checkpoint(tmp_path):
    first, chosen, _ = run_gates(tmp_path)
    again, chosen_again, logs = run_gates(tmp_path)
    assert chosen_again == chosen and not resume_notes(logs)
    assert same_state(first, again)


@pytest.mark.parametrize("what", sorted(GATE_CHANGES))
def test_changed_gate_phase_input_starts_afresh_and_says_what_changed(tmp_path, what):
    run_gates(tmp_path)
    kw, named = GATE_CHANGES[what]
    _, _, logs = run_gates(tmp_path, **kw)
    said = [m for m in resume_notes(logs) if "gate checkpoint" in m]
    assert len(said) == 1 and named in said[0], logs


def test_a_finished_gate_phase_of_another_base_is_not_restored(tmp_path):
    """The v0.1 bug: the gate checkpoint was restored with no key check, bringing back the first run's weights."""
    first, _, _ = run_gates(tmp_path)
    other, _, _ = run_gates(tmp_path, model_seed=1)
    fresh, _, _ = run_gates(tmp_path / "clean", model_seed=1)
    assert same_state(other, fresh) and not same_state(other, first)
