"""Deploy a trained model in your own environment: act, observe, read the posterior.

::

    from spice_ray import SpicePolicy
    policy = SpicePolicy.from_checkpoint("runs/small/checkpoints/<dataset>/spice-<id>-seed0/final")
    policy.reset()                       # one environment (or reset(num_envs=8) for a batch)
    a = policy.act(state)                # an int (or an int64 array for a batch)
    policy.observe(state, a, reward, next_state)
    mean, var = policy.posterior()       # per-action posterior of the current step

The policy runs the evaluation's own agent (:class:`spice_ray.agents.SpiceAgent`: the same
KV-cached decoding in stateless environments, the same fusion and action rules), so it acts
exactly as the evaluation does on the same rewards. No gradient step is taken. The action rule
is chosen at construction: greedy, posterior-UCB with a fixed beta or the sqrt(2 log t)
schedule, or Thompson sampling. :class:`DptPolicy` does the same for DPT / AD-BC checkpoints.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spice_ray.agents import PolicyAgent, SpiceAgent
from spice_ray.common.errors import excerpt
from spice_ray.config import FusionConfig, from_dict
from spice_ray.fusion import RandomSource
from spice_ray.model import checkpoint as ckpt
from spice_ray.model.registry import load_checkpoint
from spice_ray.study.run_models import (
    MODEL_CARD,
    checkpoint_of,
    model_card,
    pretrained_dir,
    saved_options,
    tuned_fusion,
)


def excerpt_array(x: Any) -> str:
    """A user's array in an error message: its values, flattened, through the one excerpt
    rule of error messages (:func:`spice_ray.common.errors.excerpt`)."""
    return excerpt(np.asarray(x).reshape(-1).tolist())


class _Policy:
    """Shared plumbing: one agent, batch or single environment, numpy in and out."""

    def __init__(self, agent: Any, env: Any, device: torch.device) -> None:
        self.agent = agent
        self.env = env
        self.device = device
        self._single = True
        self.num_envs = 1
        self._t = 0
        self._started = False
        self._seed: int | None = None  # the checkpoint's training seed, when known
        self._source: tuple[Path, str, int] | None = None  # (run, experiment, seed) if tuned
        self._origin: dict[str, Any] = {}  # what its checkpoint's meta.json says it came from

    checkpoint_of = staticmethod(checkpoint_of)
    tuned: dict[str, Any] | None = None
    """The setting chosen on validation tasks that this policy runs (:meth:`from_run`), or
    None: the settings passed in or trained with."""

    @staticmethod
    def _load(path: str | Path, kind: str, device: str | torch.device
              ) -> tuple[Any, Any, dict[str, Any]]:
        """(model, run config, meta.json) of a checkpoint."""
        model, meta = load_checkpoint(path, kind=kind)  # its own run config's env, checked
        return model.to(device), from_dict(meta["config"]), meta

    def _adopt(self, meta: dict[str, Any]) -> Any:
        """Remember where the model came from (its training seed, dataset, epoch, identity),
        which :meth:`save_pretrained` writes again; returns the policy."""
        seed = meta.get("seed")
        self._seed = seed if isinstance(seed, int) else None
        self._origin = {k: meta[k] for k in ("dataset_hash", "epoch", "identity") if k in meta}
        tuned = meta.get("tuned")  # the validation choice it was saved with, if any
        if isinstance(tuned, dict) and all(isinstance(k, str) and isinstance(
                v, str | int | float | bool) for k, v in tuned.items()):
            self.tuned = dict(tuned)
        return self

    _method = "SPICE"
    """The method's name in the study's tables (the model card's row)."""

    kind = "spice"
    """The model kind the policy runs."""

    def _options(self) -> dict[str, Any]:
        """The construction options beyond the model and its config (saved by
        :meth:`save_pretrained`)."""
        raise NotImplementedError

    @classmethod
    def _build(cls, model: Any, cfg: Any, device: str | torch.device, **options: Any) -> Any:
        raise NotImplementedError

    def save_pretrained(self, directory: str | Path) -> Path:
        """Everything this policy needs, in a self-contained folder: a checkpoint in the one
        format every model of the platform is saved in (``spice_ray.model.checkpoint``:
        ``model.safetensors`` with the weights and the frozen prior networks, no pickle;
        ``meta.json`` with the model kind and architecture, the run config it was trained
        with, where it came from and the policy's options) and a model card ``README.md``
        (what it is, what it was trained on, its row of the run's tuned table when it is the
        run's tuned policy), each with a SHA-256 sidecar; written beside ``directory`` and
        renamed into place."""
        options = {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
                   for k, v in self._options().items()}
        cfg = from_dict(self._config)
        card = model_card(self.kind, type(self).__name__, cfg, self._seed, self._source,
                          self._method)
        if self.tuned:
            card += ("\nIts fusion settings were chosen on the run's validation tasks: "
                     + ", ".join(f"{k}={v}" for k, v in self.tuned.items()) + ".\n")
        extra = {k: v for k, v in self._origin.items() if k not in ("dataset_hash", "epoch")}
        if self.tuned:
            extra["tuned"] = dict(self.tuned)  # the provenance a reloaded policy shows again
        return ckpt.save_checkpoint(
            directory, self.agent.model, cfg, self._origin.get("dataset_hash", ""),
            self._origin.get("epoch", -1),
            extra={**extra, "seed": self._seed, "options": options}, texts={MODEL_CARD: card})

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str | torch.device = "cpu", *,
                        revision: str | None = None, cache_dir: str | Path | None = None,
                        local_files_only: bool = False, **options: Any) -> Any:
        """A policy from :meth:`save_pretrained`'s folder, any checkpoint directory of a run
        (the same format), or a Hugging Face Hub model id ``owner/name`` such a folder was
        uploaded to (resolved through ``huggingface_hub``'s cache, at ``revision``); loaded
        by the one loader every checkpoint goes through
        (``spice_ray.model.registry.load_checkpoint``); ``options`` override the saved ones (e.g.
        ``rule="greedy"``).

        Raises:
            ValueError: naming the file or field: a file is missing or corrupt; it holds
                another model kind; its architecture is not the one its run config builds, or
                would not fit in this machine's memory; its weights have other names or
                shapes, or non-finite values; an option is unknown.
        """
        from spice_ray.runtime.resources import available_memory

        directory = pretrained_dir(directory, revision, cache_dir, local_files_only)
        try:
            model, meta = load_checkpoint(directory, kind=cls.kind, memory=available_memory())
        except ckpt.CheckpointError as exc:
            raise ValueError(str(exc)) from None
        saved = saved_options(meta, directory / ckpt.META)
        try:
            policy = cls._build(model.to(device), from_dict(meta["config"]), device,
                                **{**saved, **options})
        except TypeError as exc:
            raise ValueError(f"{directory / ckpt.META} or the call: an option is not "
                             f"one of {cls.__name__}'s ({exc})") from None
        return policy._adopt(meta)

    def to(self, device: str | torch.device) -> Any:
        """The same policy on ``device`` ("cpu", "cuda"), with an empty context (call
        ``reset()``)."""
        moved = type(self)._build(self.agent.model.to(device), from_dict(self._config),
                                  device, **self._options())
        moved.tuned, moved._seed, moved._source = self.tuned, self._seed, self._source
        moved._origin = self._origin
        return moved

    def reset(self, num_envs: int | None = None,
              draws: RandomSource | int | None = 0) -> None:
        """Start empty contexts for ``num_envs`` environments (None: one, with scalar
        actions).

        Args:
            draws: randomness of Thompson sampling / policy sampling and of tie-breaking: a
                seed (default 0: ties broken at random, as in the study's evaluation, and the
                same calls give the same actions), a ``torch.Generator`` or per-task
                ``StepDraws`` (what the evaluation uses); None: ties go to the lowest index,
                a fixed direction of search the evaluation avoids.
        """
        if num_envs is not None and (isinstance(num_envs, bool) or not isinstance(num_envs, int)
                                     or num_envs < 1):
            raise ValueError(f"num_envs must be a positive int or None, not {num_envs!r}")
        self._single = num_envs is None
        self.num_envs = num_envs or 1
        if isinstance(draws, int):
            draws = torch.Generator().manual_seed(draws)
        self.agent.reset(num_envs or 1, self.env.num_actions, draws)
        self._t = 0
        self._started = True

    @property
    def context_limit(self) -> int:
        """Transitions the model sees at once (its trained horizon). Past it, the policy goes
        on with a sliding window over the most recent ``context_limit`` transitions for the
        model's prior; the fusion's evidence keeps every transition."""
        return int(self.agent.model.max_len) - 1

    def _check_started(self, call: str) -> None:
        if not self._started:
            raise RuntimeError(f"{call}() before reset(): call policy.reset() (or "
                               "reset(num_envs=B)) to start the context first")

    def _expected(self) -> str:
        S = self.env.state_dim
        return f"({S},)" if self._single else f"({self.num_envs}, {S})"

    def _states(self, state: Any, name: str = "state") -> torch.Tensor:
        """float64 [B, S] from the user's state(s), refusing a wrong shape or a non-finite
        value with a message that names the argument."""
        S = self.env.state_dim
        if state is None and self.env.stateless:
            return torch.zeros(self.num_envs, S, dtype=torch.float64)
        try:
            x = np.asarray(state, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name} must be numbers of shape {self._expected()}: "
                             f"{exc}") from None
        if x.size != self.num_envs * S or (not self._single and x.shape[0] != self.num_envs):
            raise ValueError(f"{name} has shape {x.shape}; the {self.env.name} policy takes "
                             f"shape {self._expected()}")
        if not np.isfinite(x).all():
            raise ValueError(f"{name} holds a NaN or infinite value: {excerpt_array(x)}")
        return torch.as_tensor(x.reshape(self.num_envs, S))

    def act(self, state: Any) -> Any:
        """The action(s) for the current state(s): an int, or int64 [B] for a batch."""
        self._check_started("act")
        a = self.agent.act(self._t, self._states(state)).cpu().numpy()
        return int(a[0]) if self._single else a

    samples = False
    """Whether the action rule draws at random (Thompson sampling, a sampled policy head)."""

    def predict(self, observation: Any, state: Any = None, episode_start: Any = None,
                deterministic: bool = True) -> tuple[Any, None]:
        """:meth:`act` in Stable-Baselines3's form: ``(action, None)``.

        The first call starts the context when :meth:`reset` was not called (one environment
        for one observation, a batch for a 2-d array of them). The recurrent state SB3 passes
        around is the context, kept inside the policy, so ``state`` must be None and the
        returned one is None; ``episode_start`` is accepted and leaves the context alone: in
        context the policy learns across the episodes of one task (``reset()`` starts a new
        task). Rewards reach the context only through :meth:`observe`.

        Args:
            deterministic: must say what the policy's rule does (True unless it samples:
                ``rule="thompson"``, ``DptPolicy(sample=True)``); the rule is chosen when the
                policy is built, so a contradicting value is refused, not ignored.
        """
        if state is not None:
            raise ValueError("state must be None: the policy keeps its context itself "
                             "(observe() adds to it, reset() empties it)")
        if bool(deterministic) == self.samples:
            raise ValueError(f"deterministic={deterministic}, but this policy "
                             f"{'samples' if self.samples else 'does not sample'}: "
                             f"{repr(self)}; build it with the rule you want")
        if not self._started:
            x = np.asarray(observation)
            self.reset(num_envs=int(x.shape[0]) if x.ndim == 2 else None)
        return self.act(observation), None

    def observe(self, state: Any, action: Any, reward: Any, next_state: Any) -> None:
        """Append the transition (state, action, reward, next state) to the context(s)."""
        self._check_started("observe")
        A, B = self.env.num_actions, self.num_envs
        a = np.atleast_1d(np.asarray(action))
        if a.shape != (B,) or not np.issubdtype(a.dtype, np.integer) or (
                (a < 0) | (a >= A)).any():
            raise ValueError(f"action must be {'an int' if self._single else f'{B} ints'} in "
                             f"[0, {A}), not {excerpt_array(a)}")
        r = np.atleast_1d(np.asarray(reward, dtype=np.float64))
        if r.shape != (B,):
            raise ValueError(f"reward has shape {r.shape}; expected "
                             f"{'a number' if self._single else f'({B},)'}")
        if not np.isfinite(r).all():
            raise ValueError(f"reward holds a NaN or infinite value: {excerpt_array(r)}; "
                             "nothing was added to the context")
        states = self._states(state)
        next_states = self._states(next_state, "next_state")
        self.agent.observe(torch.as_tensor(a.astype(np.int64)), torch.as_tensor(r), states,
                           next_states)
        self._t += 1


class SpicePolicy(_Policy):
    """SPICE from a checkpoint: the ensemble prior fused with the context, then an action rule.

    Args (of :meth:`from_checkpoint`):
        path: the checkpoint directory (``.../final``).
        rule: "greedy", "ucb" (posterior-UCB) or "thompson".
        beta: the UCB coefficient; ``beta_schedule="sqrt2logt"`` uses sqrt(2 log t) instead,
            ``"sqrt_log_sat"`` beta sqrt(log(S A t)) (the paper's MDP schedule).
        fusion: other fusion settings (default: those the checkpoint was trained with).
        device: "cpu" or "cuda".
    """

    @classmethod
    def from_checkpoint(cls, path: str | Path, rule: str = "ucb", beta: float | None = None,
                        beta_schedule: str | None = None, fusion: FusionConfig | None = None,
                        device: str | torch.device = "cpu") -> SpicePolicy:
        model, cfg, meta = cls._load(path, "spice", device)
        return cls._build(model, cfg, device, rule=rule, beta=beta,
                          beta_schedule=beta_schedule, fusion=fusion)._adopt(meta)

    @classmethod
    def _build(cls, model: Any, cfg: Any, device: str | torch.device, rule: str = "ucb",
               beta: float | None = None, beta_schedule: str | None = None,
               fusion: FusionConfig | None = None) -> SpicePolicy:
        fusion = fusion or cfg.fusion
        changes: dict[str, Any] = {"rule": rule}
        if beta is not None:
            changes["beta"] = float(beta)
        if beta_schedule is not None:
            changes["beta_schedule"] = beta_schedule
        fusion = dataclasses.replace(fusion, **changes)  # validated: bad values name the field
        env = cfg.environment()
        agent = SpiceAgent(fusion, model=model, stateless=env.stateless,
                           num_states=env.num_states)
        policy = cls(agent, env, torch.device(device))
        policy.fusion = fusion
        policy._config = cfg.to_dict()
        return policy

    def _options(self) -> dict[str, Any]:
        return {"rule": self.fusion.rule, "fusion": self.fusion}

    @property
    def samples(self) -> bool:  # type: ignore[override]
        return self.fusion.rule == "thompson"

    @classmethod
    def from_run(cls, run_dir: str | Path, experiment: str, seed: int = 0, variant: str = "",
                 tuned: bool = True, **options: Any) -> SpicePolicy:
        """SPICE of a study's run: ``from_run("runs/small", "darkroom", seed=1)``; ``variant``
        picks a weight ablation ("none", "iw", ...); ``options`` as :meth:`from_checkpoint`.

        With ``tuned`` (the default) and no ``options`` but ``device``, the policy is the
        one behind the run's ``<experiment>_tuned`` table: SPICE's fusion at the setting the
        tuning stage chose on validation tasks (``results/tuning.json``: beta or its schedule,
        tau, the fitted width and noise), said in its repr. Without a usable tuning record
        for it (a weight ablation, a run without the tuning stage), the checkpoint's own
        settings."""
        path = cls.checkpoint_of(run_dir, experiment, "spice", seed, variant)
        device = options.pop("device", "cpu")
        if not tuned or options or variant:
            return cls.from_checkpoint(path, device=device, **options)
        model, cfg, meta = cls._load(path, "spice", device)
        choice = tuned_fusion(Path(run_dir), experiment, cfg)
        if choice is None:
            policy = cls._build(model, cfg, device)
        else:
            setting, fusion = choice
            policy = cls._build(model, cfg, device, rule=fusion.rule, fusion=fusion)
            policy.tuned = setting
            policy._source = (Path(run_dir), experiment, seed)
        return policy._adopt(meta)

    def __repr__(self) -> str:
        f = self.fusion
        beta = "beta_t=sqrt(2 log t)" if f.beta_schedule == "sqrt2logt" else f"beta={f.beta}"
        tuned = "" if self.tuned is None else ", tuned on validation: " + ", ".join(
            f"{k}={v}" for k, v in self.tuned.items())
        return (f"SpicePolicy({self.env.name}, A={self.env.num_actions}, rule={f.rule}, {beta},"
                f" kernel={f.kernel}, context_limit={self.context_limit}, "
                f"device={self.device}{tuned})")

    def posterior(self, state: Any | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per-action posterior (mean, variance) at the current step, float64 [A] or [B, A].

        Args:
            state: the current state(s) (needed in environments with states; bandits: None).
        """
        self._check_started("posterior")
        post = self.agent.posterior(self._states(state))
        mean, var = post.mean.numpy(), post.var.numpy()
        return (mean[0], var[0]) if self._single else (mean, var)


class DptPolicy(_Policy):
    """DPT or AD-BC from a checkpoint: sample from the policy head, or act greedily."""

    kind = "dpt"

    @classmethod
    def from_checkpoint(cls, path: str | Path, sample: bool = False,
                        device: str | torch.device = "cpu") -> DptPolicy:
        model, cfg, meta = cls._load(path, "dpt", device)
        return cls._build(model, cfg, device, sample=sample)._adopt(meta)

    @classmethod
    def _build(cls, model: Any, cfg: Any, device: str | torch.device, sample: bool = False
               ) -> DptPolicy:
        env = cfg.environment()
        policy = cls(PolicyAgent(model, env.stateless, sample=sample), env, torch.device(device))
        policy._config = cfg.to_dict()
        return policy

    def _options(self) -> dict[str, Any]:
        return {"sample": self.agent.sample}

    @property
    def samples(self) -> bool:  # type: ignore[override]
        return bool(self.agent.sample)

    def __repr__(self) -> str:
        return (f"DptPolicy({self.env.name}, A={self.env.num_actions}, "
                f"{'samples from' if self.agent.sample else 'acts greedily on'} its policy, "
                f"context_limit={self.context_limit}, device={self.device})")

    @classmethod
    def from_run(cls, run_dir: str | Path, experiment: str, seed: int = 0,
                 **options: Any) -> DptPolicy:
        """DPT (or AD-BC) of a study's run; ``options`` as :meth:`from_checkpoint`."""
        return cls.from_checkpoint(cls.checkpoint_of(run_dir, experiment, "dpt", seed),
                                   **options)

