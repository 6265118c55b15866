"""Evaluation: one online loop and the offline curve over any environment and agent, the prior
calibration diagnostic, the label-free fit of the prior's width scale, tidy rows, and Ray actors
that shard tasks."""

from spice_ray.evaluate.actors import EvalActor, EvalPool, evaluate_parallel, evaluate_tasks
from spice_ray.evaluate.calibration import calibration_rows, calibration_stats
from spice_ray.evaluate.inprocess import evaluate
from spice_ray.evaluate.offline import offline_context_lengths, offline_rows, sequence_outputs
from spice_ray.evaluate.online import Rollout, agent_draws, online_noise, online_rows, run_online
from spice_ray.evaluate.rows import check_rows, concat_rows, tidy_rows
from spice_ray.evaluate.width import WidthFit, fit_model_width, transition_predictions

__all__ = ["EvalActor", "EvalPool", "Rollout", "WidthFit", "agent_draws", "calibration_rows",
           "calibration_stats", "check_rows", "concat_rows", "evaluate", "evaluate_parallel",
           "evaluate_tasks",
           "fit_model_width", "offline_context_lengths", "offline_rows", "online_noise",
           "online_rows", "run_online", "sequence_outputs", "tidy_rows",
           "transition_predictions"]
