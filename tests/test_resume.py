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

from hetprune import Budget
from hetprune.model import surgery
from hetprune.pruning.pipeline import finetune, select_sites
from hetprune.training.resume import weights_key
from hetprune.training.task import classification
from hetprune.harness.testing import tiny_job, tiny_model


def job_with(tmp_path, changes: dict | None = None, model=None, fingerprint: str | None = None, scorer="magnitude",
             in_code: bool = False):
    """A tiny job logging to a list and counting its fine-tune epochs; ``in_code``: made as code outside the CLI
    would make it, with no ``base_info`` (tiny_job names a fixed hash)."""
    logs: list[str] = []
    settings = {"scorer": scorer, "finetune": {"epochs": 2, "subset": 32}, **(changes or {})}
    job = tiny_job(Budget(sites=2), tmp_path / "work", settings=settings, model=model)
    if in_code:
        job = dataclasses.replace(job, base_info={})
    job.resume = True
    job.log = logs.append
    if fingerprint is not None:
        job.data = dataclasses.replace(job.data, fingerprint=fingerprint)
        job.task = classification(job.data)   # the job carries its task: another data set is another task
    epochs: list[int] = []
    real_event = job.event
    job.event = lambda name, **kw: (epochs.append(kw["epoch"]) if name == "on_epoch_end" else None,
                                    real_event(name, **kw))
    return job, logs, epochs


def same_state(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def resume_notes(logs: list[str]) -> list[str]:
    """What a rerun said about a stored result it could not reuse (it starts that stage afresh)."""
    return [m for m in logs if m.startswith("resume:") and "continues after" not in m]


def continued(logs: list[str]) -> list[str]:
    """What a rerun said about a stored result it reused: where it continues, and when that was saved."""
    return [m for m in logs if m.startswith("resume:") and "continues after" in m and " saved " in m]


def pruned(job, act: int = 1):
    """A copy of the dense model with activation site ``act`` removed."""
    model = copy.deepcopy(job.dense)
    surgery.remove_activation(model, act)
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


def run_finetune(tmp_path, model_seed=0, act=1, **kw):
    job, logs, epochs = job_with(tmp_path, model=tiny_model(model_seed), **kw)
    model = pruned(job, act)
    finetune(job, model)
    return model, logs, epochs


def test_unchanged_finetune_rerun_reuses_its_checkpoint(tmp_path):
    first, _, epochs = run_finetune(tmp_path)
    assert epochs == [1, 2]
    again, logs, epochs = run_finetune(tmp_path)
    assert epochs == [] and not resume_notes(logs)  # nothing trained again
    assert len(continued(logs)) == 1 and "after epoch 2 of 2" in continued(logs)[0]   # and it says so
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
    assert any("gate phase continues after removal" in m for m in continued(logs)), logs
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


# -- the key covers structure and every weight, and names the dense model in code too ---------------------------

def test_other_removed_sites_with_an_equal_state_dict_start_afresh(tmp_path):
    """A removed activation holds no weight: act1 and act2 removed have equal state dicts, yet are other models."""
    job, _, _ = job_with(tmp_path)
    assert same_state(pruned(job, 1), pruned(job, 2))   # what the old key, a state-dict hash, saw
    run_finetune(tmp_path, act=1)
    _, logs, epochs = run_finetune(tmp_path, act=2)
    assert epochs == [1, 2], "a checkpoint trained with act1 removed was resumed for act2 removed"
    said = resume_notes(logs)
    assert len(said) == 1 and "structure" in said[0] and "starting it afresh" in said[0]


def test_float64_weights_are_hashed_at_their_own_precision():
    model = tiny_model(0).double()
    other = copy.deepcopy(model)
    with torch.no_grad():
        weight = other.head.weight
        weight[0, 0] += weight[0, 0].abs().clamp_min(1e-3) * 1e-12   # below float32's resolution
    assert torch.equal(weight.float(), model.head.weight.float()) and not same_state(model, other)
    assert weights_key(model) != weights_key(other)


def test_a_job_made_in_code_keys_its_map_points_by_its_own_dense_model(tmp_path):
    from hetprune_hetdpt.strategy import HetDPT

    settings = {"scorer": "magnitude"}
    jobs = []
    for seed in (0, 1):
        job = tiny_job(Budget(sites=2), tmp_path / "work", strategy_defaults=HetDPT.defaults, settings=settings,
                       model=tiny_model(seed))
        jobs.append(dataclasses.replace(job, base_info={}))
    first, second = (HetDPT().points_key(job) for job in jobs)
    assert first != second, "two dense models in one work folder share MAP points"
    assert HetDPT().points_key(dataclasses.replace(jobs[0], base_info={})) == first   # and it is stable


def test_a_job_made_in_code_keys_the_fine_tune_teacher_by_its_dense_model(tmp_path):
    """Same student, another dense teacher: the distilled checkpoint is not the one to resume."""
    student = pruned(job_with(tmp_path)[0])
    for seed in (0, 1):
        job, logs, epochs = job_with(tmp_path, model=tiny_model(seed), in_code=True)
        finetune(job, copy.deepcopy(student))
        assert epochs == [1, 2], f"the checkpoint distilled from another teacher was resumed (teacher seed {seed})"
    said = resume_notes(logs)
    assert len(said) == 1 and "teacher" in said[0]
    job, logs, epochs = job_with(tmp_path, model=tiny_model(1), in_code=True)
    finetune(job, copy.deepcopy(student))
    assert epochs == [] and not resume_notes(logs) and continued(logs)   # the same teacher again: resumed
