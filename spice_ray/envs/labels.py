"""Label rules a* of pretraining tasks, shared by the environments (pure numpy).

Rules (``data.label``): ``optimal`` (the optimal action at the query: DPT's setting),
``weak`` (a weak, environment-given action, e.g. the bandit's favoured arm), ``weak-last``
(the last context action), ``mix:q`` (the optimal action with probability q, else a behaviour
draw) and ``weakmix80`` (= ``mix:0.8``). An environment lists the kinds it supports.
"""

from __future__ import annotations

import re

import numpy as np

from spice_ray.common.rng import TaskStreams

KINDS = ("optimal", "weak", "weak-last", "mix")
_MIX_RE = re.compile(r"^mix:(?P<q>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)$")


def parse_label(label: str) -> tuple[str, float]:
    """Split a label rule into (kind, q); ``weakmix80`` is ``mix`` with q = 0.8.

    Raises:
        ValueError: naming ``data.label`` and the allowed rules.
    """
    if label == "weakmix80":
        return "mix", 0.8
    if label in ("optimal", "weak", "weak-last"):
        return label, 0.0
    m = _MIX_RE.match(label)
    if m:
        return "mix", float(m.group("q"))
    raise ValueError(f"data.label={label!r} is invalid: one of optimal, weak, weakmix80, "
                     "weak-last, mix:q with q in [0, 1]")


def make_labels(
    label: str,
    streams: TaskStreams,
    optimal: np.ndarray,
    actions: np.ndarray,
    num_actions: int,
    weak: np.ndarray | None = None,
    behaviour_probs: np.ndarray | None = None,
) -> np.ndarray:
    """Apply a label rule to B tasks.

    Args:
        label: a rule (see the module docstring).
        streams: the tasks' random streams (``mix`` draws from them).
        optimal: int [B] optimal action at the query.
        actions: int [B, H] context actions.
        num_actions: A.
        weak: int [B] the environment's weak label (needed by ``weak``).
        behaviour_probs: [B, A] behaviour distribution; ``mix`` draws its non-optimal labels
            from it, or uniformly over the actions without it.

    Returns:
        int64 [B] labels.
    """
    kind, q = parse_label(label)
    if kind == "optimal":
        return optimal.astype(np.int64)
    if kind == "weak-last":
        return actions[:, -1].astype(np.int64)
    if kind == "weak":
        if weak is None:
            raise ValueError("label 'weak' needs the environment's weak action")
        return weak.astype(np.int64)
    if behaviour_probs is not None:
        other = streams.categorical("label/other", behaviour_probs, 1)[:, 0]
    else:
        other = streams.integers("label/other", num_actions)
    use_opt = streams.uniform("label/coin") < q
    return np.where(use_opt, optimal, other).astype(np.int64)
