"""The scaling ladder: per-action accuracy on hand-made policies, and a smoke ladder whose top
rung resumes from the one below."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from spice_ray.config import ConfigError
from spice_ray.envs import darkroom
from spice_ray.evaluate.accuracy import grid_accuracy
from spice_ray.model import checkpoint as ckpt
from spice_ray.results.tables import load
from spice_ray.study.ladder import TABLE, plan_ladder

ROOT = Path(__file__).resolve().parents[1]


class FixedAction:
    """An agent that takes one action everywhere, whatever its context."""

    def __init__(self, action: int) -> None:
        self.action = action

    def act(self, t: int, states: torch.Tensor) -> torch.Tensor:
        return torch.full((len(states),), self.action)


def test_action_accuracy_of_hand_made_agents() -> None:
    goals = np.array([[3, 7], [0, 0], [9, 2]])
    accuracy, stay = grid_accuracy(FixedAction(4), goals, 10, 5, np.dtype(np.int64))
    # "stay" is right on the goal cell only: 1 cell in 100
    assert stay.tolist() == [1.0, 1.0, 1.0] and accuracy.tolist() == [0.01] * 3
    accuracy, stay = grid_accuracy(FixedAction(0), goals, 10, 5, np.dtype(np.int64))
    # "+x" is right wherever the goal lies further along x: gx columns of 10 cells each
    assert accuracy.tolist() == pytest.approx([0.3, 0.0, 0.9]) and stay.tolist() == [0, 0, 0]


def test_optimal_actions_are_the_shortest_path_moves() -> None:
    best = darkroom.optimal_actions(np.array([[2, 2]] * 3), np.array([[0, 0], [2, 2], [2, 5]]))
    assert best.tolist() == [[True, False, True, False, False],
                             [False, False, False, False, True],
                             [False, False, False, True, False]]
    tasks = SimpleNamespace(goals=np.array([[2, 2]] * 3))
    chosen = darkroom.optimal_action(tasks, np.array([[0, 0], [2, 2], [2, 5]]))
    assert best[np.arange(3), chosen].all()  # the single optimal action is one of them


def test_ladder_refuses_bad_rungs_and_a_cosine_schedule(tmp_path) -> None:
    with pytest.raises(ConfigError, match="rungs"):
        plan_ladder(tmp_path, ["bandit_latent"], [3, 1], "smoke")
    with pytest.raises(ConfigError, match="family 'bandit'"):
        plan_ladder(tmp_path, ["bandit"], [1], "smoke")
    with pytest.raises(ConfigError, match="train.cosine_schedule"):
        plan_ladder(tmp_path, ["bandit_latent"], [1, 3], "smoke",
                    overrides=["train.cosine_schedule=true"])
    rungs = plan_ladder(tmp_path, ["darkroom_dpt_star"], [1, 4], "smoke", seeds=(0, 1))
    assert [r.steps for r in rungs] == [12, 48]
    assert "train.epochs=4" in rungs[1].overrides and "seeds=[0,1]" in rungs[1].overrides


@pytest.mark.ray
def test_smoke_ladder_trains_each_model_once_and_tabulates_every_rung(tmp_path) -> None:
    out = tmp_path / "ladder"
    proc = subprocess.run([sys.executable, str(ROOT / "pipelines" / "scaling.py"), "--out",
                           str(out), "--preset", "smoke", "--families", "darkroom_dpt_star",
                           "--rungs", "1,2"], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumes 1 model(s) from rung-1x" in proc.stdout
    # rung 2 reads rung 1's datasets, copied and checked, instead of generating them again
    assert "reads the datasets of rung-1x (copied)" in proc.stdout
    assert proc.stdout.count("shards written") == 1 and "shards current" in proc.stdout
    finals = sorted(out.glob("darkroom_dpt_star/rung-*/checkpoints/*/*/final"))
    assert [ckpt.read_meta(f)["epoch"] for f in finals] == [0, 1]
    assert finals[0].parent.name == finals[1].parent.name  # one identity across rungs
    seeded = finals[1].parent / "local" / "epoch-0000" / ckpt.WEIGHTS
    assert seeded.read_bytes() == (finals[0] / ckpt.WEIGHTS).read_bytes()
    table = pd.read_parquet(out / TABLE)
    assert sorted(table["multiple"].unique()) == [1, 2]
    assert set(table["steps"]) == {12, 24}
    for q in ("return", "accuracy", "stay_accuracy", "val_loss"):
        assert table[table["quantity"] == q]["value"].notna().all(), q
    # the table's return and accuracy are the rung's own study table's
    rung2 = load(out / "darkroom_dpt_star" / "rung-2x", "darkroom_dpt_star")
    acc = rung2[(rung2["method"] == "DPT") & (rung2["metric"] == "action_accuracy")]
    got = table[(table["quantity"] == "accuracy") & (table["multiple"] == 2)]["value"].item()
    assert 0 <= got <= 1 and got == pytest.approx(acc.groupby("task_id")["value"].mean().mean())
    final = rung2[(rung2["method"] == "DPT") & (rung2["metric"] == "cumulative_return")]
    final = final[final["x"] == final["x"].max()]
    got = table[(table["quantity"] == "return") & (table["multiple"] == 2)]["value"].item()
    assert got == pytest.approx(final.groupby("task_id")["value"].mean().mean())
    assert "| 1x: 12 steps, 1 seed | 2x: 24 steps, 1 seed |" in (out / "scaling.md").read_text()
    assert (out / "scaling.png").stat().st_size > 0
