"""Test-time controllers: SPICE (Bayesian fusion), DPT / AD-BC (policy head), oracles.

Every controller follows one small protocol, :class:`Controller`, which extends the classical
bandit baselines' (``spice_ray.baselines.bandits.BanditController``) with optional states:

    reset(num_tasks, num_actions, generator)    start B empty contexts (generator: RandomSource)
    act(t, states=None) -> long [B]             t = transitions observed so far
    observe(actions, rewards, states=None, next_states=None)   append one transition per task

Bandit rollouts call ``act(t)`` and ``observe(actions, rewards)`` (no states: the state is the
constant zero), so the baselines and the learned controllers run under the same driver
(:func:`spice_ray.baselines.run_online_bandit`). Darkroom rollouts pass the current states.

Model outputs over the growing context come from :class:`ContextRunner`:

* Bandits (the query token never changes): with ``use_cache`` the KV cache is primed with one
  ``step_query`` and extended by one ``step_transition`` per observed transition, so a step
  costs O(T D) instead of a full forward; without it the full forward over [query; context] is
  recomputed every step (the reference the cache is tested and benchmarked against).
* Darkroom: the query is the *current* state and sits at position 0, so every position's
  output changes when the agent moves and nothing can be cached; each step re-runs the trunk
  on [current state; context so far] (transition features are built once, when observed). The
  heads run only where needed: the last position for the prior and the policy, every position
  when the n-step targets need the prior mean's bootstrap values.

SPICE fuses the ensemble prior at the current position (paper sec. 3.3) with kernel-weighted
evidence from the context, entirely through ``spice_ray.fusion`` (kernels, counts, n-step
targets, posterior, action rules): this module restates none of those formulas. With the
uniform kernel and reward targets (the bandit setting) the evidence is kept in
:class:`~spice_ray.fusion.RunningStats`, O(A) per step; otherwise it is recomputed from the whole
context every step, because kernel weights and bootstrap values move with the query.

Randomness (Thompson draws, DPT policy samples) comes from the source handed to ``reset``: a
``torch.Generator`` or, in rollouts, per-task :class:`~spice_ray.rng.StepDraws`, so that a task's
actions do not depend on which tasks share its shard. Action selection runs on the CPU in float64
so that the draws, and hence the actions, do not depend on the model's device.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from spice_ray.baselines.bandits import make_baseline
from spice_ray.config import EvalConfig, FusionConfig
from spice_ray.envs import bandit, darkroom
from spice_ray.fusion import (
    Posterior,
    RandomSource,
    RunningStats,
    argmax_lowest,
    beta_at,
    bootstrap_values,
    gaussian_posterior,
    kernel_weights,
    nstep_targets,
    sample_categorical,
    select_action,
    weighted_action_stats,
)
from spice_ray.model.tokens import query_features, token_dim, transition_features
from spice_ray.model.trunk import TrunkModel

EnvName = Literal["bandit", "darkroom"]
STATS_DTYPE = torch.float64
"""Evidence, posteriors and action scores are float64 on the CPU (as in the baselines)."""

METHODS = ("spice", "dpt", "ad-bc", "emp", "ucb", "lcb", "ts", "optimal")
MODEL_METHODS = ("spice", "dpt", "ad-bc")
ONLINE_METHODS = ("spice", "dpt", "ad-bc", "emp", "ucb", "ts", "optimal")
OFFLINE_METHODS = ("spice", "dpt", "ad-bc", "emp", "lcb", "ts")
METHOD_LABELS = {"spice": "SPICE", "dpt": "DPT", "ad-bc": "AD-BC", "emp": "Emp", "ucb": "UCB",
                 "lcb": "LCB", "ts": "TS", "optimal": "Optimal"}
"""The ``method`` column of the result rows (the display names of ``spice_ray.results``)."""


# ---- protocol and specs ------------------------------------------------------------------


@runtime_checkable
class Controller(Protocol):
    """An online controller acting in B tasks at once (a superset of ``BanditController``)."""

    name: str

    def reset(
        self, num_tasks: int, num_actions: int, generator: RandomSource | None = None
    ) -> None:
        """Start B = ``num_tasks`` fresh runs with an empty context."""
        ...

    def act(self, t: int, states: Tensor | None = None) -> Tensor:
        """Actions long [B] for step t (t transitions observed); states [B, S] (darkroom)."""
        ...

    def observe(
        self,
        actions: Tensor,
        rewards: Tensor,
        states: Tensor | None = None,
        next_states: Tensor | None = None,
    ) -> None:
        """Append one transition per task: actions [B], rewards [B], states [B, S] or None."""
        ...


@dataclass(frozen=True)
class ControllerSpec:
    """What to evaluate: a method and its test-time settings (picklable, shipped to actors)."""

    method: str
    """One of spice, dpt, ad-bc (model-based), emp, ucb, lcb, ts (bandit baselines), optimal."""
    fusion: FusionConfig = field(default_factory=FusionConfig)
    """SPICE only: kernel, targets, noise variance, v_min, beta and the action rule."""
    sample: bool = True
    """DPT / AD-BC online: sample from the policy (True) or act greedily (False)."""
    use_cache: bool = True
    """Model controllers on bandits: KV-cache decoding (True) or a full forward every step.

    An execution detail (the actions are the same), so it is not part of :meth:`config_json`.
    Darkroom always recomputes: its query, the current state, changes every step."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} is invalid: one of {', '.join(METHODS)}")

    @classmethod
    def dpt(cls, eval_cfg: EvalConfig, name: str = "dpt", use_cache: bool = True
            ) -> ControllerSpec:
        """A DPT (or ``name="ad-bc"``) spec acting as ``EvalConfig.dpt_sample`` says."""
        return cls(name, sample=eval_cfg.dpt_sample, use_cache=use_cache)

    @property
    def label(self) -> str:
        """The method's name in the result rows (:data:`METHOD_LABELS`)."""
        return METHOD_LABELS[self.method]

    @property
    def uses_model(self) -> bool:
        """True for the learned controllers (spice, dpt, ad-bc)."""
        return self.method in MODEL_METHODS

    def rule(self, online: bool = True) -> str:
        """The action rule named in the results' ``controller`` column.

        SPICE online: ``fusion.controller`` (greedy / ucb / thompson); DPT online: sample or
        greedy; both are greedy offline (the paper's offline pick). Baselines: their own name.
        """
        if self.method == "spice":
            return self.fusion.controller if online else "greedy"
        if self.method in ("dpt", "ad-bc"):
            return "sample" if (online and self.sample) else "greedy"
        return self.method

    def config_dict(self, eval_cfg: EvalConfig, online: bool = True) -> dict[str, Any]:
        """The settings that change this controller's results, as plain values.

        Offline, SPICE's online-only settings (beta, its schedule, the rule) are left out, so
        specs that differ only there share one offline curve.
        """
        if self.method == "spice":
            out = {k: v for k, v in dataclasses.asdict(self.fusion).items() if k != "controller"}
            if not online:
                out.pop("beta")
                out.pop("beta_schedule")
            return out
        if self.method == "ucb":
            return {"c": eval_cfg.ucb_c}
        if self.method == "lcb":
            return {"c": eval_cfg.lcb_c}
        if self.method == "ts":
            return {"prior_mean": eval_cfg.ts_prior_mean, "prior_var": eval_cfg.ts_prior_var}
        return {}

    def config_json(self, eval_cfg: EvalConfig, online: bool = True, **extra: Any) -> str:
        """:meth:`config_dict` plus ``extra`` (e.g. the test-time sigma) as compact JSON."""
        return json.dumps({**self.config_dict(eval_cfg, online), **extra}, sort_keys=True,
                          separators=(",", ":"))


# ---- model outputs over a growing context ------------------------------------------------


class _Growing:
    """A [B, capacity, *shape] buffer that doubles its capacity when full."""

    def __init__(self, batch: int, shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device, capacity: int = 64) -> None:
        self.data = torch.zeros((batch, capacity, *shape), dtype=dtype, device=device)
        self.length = 0

    def append(self, x: Tensor) -> None:
        """Append x [B, *shape] at index ``length``."""
        if self.length == self.data.shape[1]:
            B, cap, *shape = self.data.shape
            grown = self.data.new_zeros((B, 2 * cap, *shape))  # (B, 2 cap, ...)
            grown[:, :cap] = self.data
            self.data = grown
        self.data[:, self.length] = x.to(self.data.dtype)
        self.length += 1

    def view(self, lo: int = 0, hi: int | None = None) -> Tensor:
        """Entries [lo, hi) (default: all appended), [B, hi - lo, *shape]."""
        return self.data[:, lo:self.length if hi is None else hi]


def _select(out: Any, index: int) -> Any:
    """The same output dataclass with every field indexed at position ``index`` ([:, index])."""
    return type(out)(**{f.name: getattr(out, f.name)[:, index] for f in dataclasses.fields(out)})


@dataclass(frozen=True)
class ContextView:
    """The model's view of the current step: outputs at the current position and the context.

    The context is the last T transitions (all of them unless the rollout outgrew the model's
    positions, see :class:`ContextRunner`). Positions: 0 is the query, t has seen transitions
    1..t, so the current position is T.

    Attributes:
        head: ``model.heads`` at position T (a SpiceOutput or DptOutput), fields [B, ...].
        actions: long [B, T] context actions a_t.
        rewards: float64 [B, T] context rewards r_t.
        states: [B, T, S] context states s_t.
        latents: [B, T+1, D] trunk latents of positions 0..T, or None when not kept.
        prior_means: [B, T, A] prior mean Q-bar at positions 1..T (the values at s_{t+1} given
            transitions <= t), or None when not kept.
    """

    head: Any
    actions: Tensor
    rewards: Tensor
    states: Tensor
    latents: Tensor | None = None
    prior_means: Tensor | None = None


class ContextRunner:
    """The growing context of B online rollouts and the model's outputs over it.

    Args:
        model: a SpiceModel or DptModel (put in eval mode by the caller).
        env_name: "bandit" (constant zero query, cache allowed) or "darkroom" (query = the
            current state, full forward every step).
        use_cache: bandits only: incremental decoding with the KV cache.
        keep_latents: also return the latents of every position (latent-space kernels).
        keep_prior_means: also return the prior mean at every position (n-step bootstraps).

    Context window: the trunk has ``model.max_len`` positions, so at most ``max_len - 1``
    transitions fit after the query. Without the cache, a longer rollout (darkroom with several
    ``episodes``) conditions on the most recent ``max_len - 1`` transitions; with the cache it
    raises instead.
    """

    def __init__(self, model: TrunkModel, env_name: EnvName, use_cache: bool = True,
                 keep_latents: bool = False, keep_prior_means: bool = False) -> None:
        if env_name not in ("bandit", "darkroom"):
            raise ValueError(f"env_name={env_name!r} is invalid: bandit or darkroom")
        self.model = model
        self.env_name = env_name
        self.cached = bool(use_cache) and env_name == "bandit"
        self.keep_latents = keep_latents
        self.keep_prior_means = keep_prior_means
        ref = model.trunk.embed.weight
        self.device, self.dtype = ref.device, ref.dtype
        self.window = model.max_len - 1
        self.t = 0

    def reset(self, num_tasks: int) -> None:
        """Empty contexts for ``num_tasks`` tasks (and, cached, the query token appended)."""
        B, S, dev = num_tasks, self.model.state_dim, self.device
        self.num_tasks = B
        self.t = 0
        self._actions = _Growing(B, (), torch.long, dev)
        self._rewards = _Growing(B, (), STATS_DTYPE, dev)
        self._states = _Growing(B, (S,), self.dtype, dev)
        self._pending: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        if self.cached:
            self._cache = self.model.init_cache(B)
            self._latents = _Growing(B, (self.model.trunk.n_embd,), self.dtype, dev)
            self._pms = _Growing(B, (self.model.num_actions,), self.dtype, dev)
            with torch.no_grad():
                self._head = self.model.step_query(self._zero_states(), self._cache)
            self._keep(self._head, first=True)
        else:
            feat = token_dim(S, self.model.num_actions)
            self._feats = _Growing(B, (feat,), self.dtype, dev)

    def _zero_states(self) -> Tensor:
        return torch.zeros(self.num_tasks, self.model.state_dim, dtype=self.dtype,
                           device=self.device)

    def _keep(self, out: Any, first: bool = False) -> None:
        """Cached mode: remember the new position's latent / prior mean if asked to."""
        if self.keep_latents:
            self._latents.append(out.latent)
        if self.keep_prior_means and not first:  # prior means are kept for positions 1..T
            self._pms.append(out.prior_mean)

    def append(self, states: Tensor | None, actions: Tensor, rewards: Tensor,
               next_states: Tensor | None) -> None:
        """Add one transition per task ([B, S] or None for the bandit zero state, [B], [B])."""
        s = self._zero_states() if states is None else states.to(self.device, self.dtype)
        s2 = self._zero_states() if next_states is None else next_states.to(self.device,
                                                                             self.dtype)
        a = actions.to(self.device, torch.long)
        r = rewards.to(self.device, STATS_DTYPE)
        self._actions.append(a)
        self._rewards.append(r)
        self._states.append(s)
        if self.cached:
            self._pending.append((s, a, r, s2))  # the model steps lazily, when next asked
        else:
            self._feats.append(transition_features(s, a, r.to(self.dtype), s2,
                                                   self.model.num_actions))
        self.t += 1

    @torch.no_grad()
    def view(self, query_states: Tensor | None = None) -> ContextView:
        """Outputs at the current position for the query ([B, S]; None = the zero state)."""
        lo = max(0, self.t - self.window)
        latents = prior_means = None
        if self.cached:
            for s, a, r, s2 in self._pending:
                self._head = self.model.step_transition(s, a, r.to(self.dtype), s2, self._cache)
                self._keep(self._head)
            self._pending.clear()
            head = self._head
            if self.keep_latents:
                latents = self._latents.view()  # (B, T+1, D)
            if self.keep_prior_means:
                prior_means = self._pms.view()  # (B, T, A)
        else:
            q = self._zero_states() if query_states is None else query_states.to(
                self.device, self.dtype)
            x = torch.cat([query_features(q, self.model.num_actions).unsqueeze(1),
                           self._feats.view(lo)], dim=1)  # (B, T+1, F)
            latent = self.model.trunk(x)  # (B, T+1, D)
            if self.keep_prior_means and latent.shape[1] > 1:
                seq = self.model.heads(latent[:, 1:])  # positions 1..T
                prior_means = seq.prior_mean  # (B, T, A)
                head = _select(seq, -1)
            else:
                head = self.model.heads(latent[:, -1])
                if self.keep_prior_means:  # empty context: no positions 1..T
                    prior_means = head.prior_mean.new_zeros(self.num_tasks, 0,
                                                            self.model.num_actions)
            if self.keep_latents:
                latents = latent
        return ContextView(head=head, actions=self._actions.view(lo),
                           rewards=self._rewards.view(lo), states=self._states.view(lo),
                           latents=latents, prior_means=prior_means)


# ---- SPICE fusion pieces (shared by the online controller and the offline curve) ---------


def needs_nstep(fusion: FusionConfig) -> bool:
    """True when the targets differ from the immediate rewards (n > 1 or gamma > 0)."""
    return fusion.target == "nstep" and (fusion.td_n > 1 or fusion.gamma > 0)


def needs_bootstrap(fusion: FusionConfig) -> bool:
    """True when the targets read max_a' Q-bar(s_{t+n}, a') (n-step with gamma > 0)."""
    return fusion.target == "nstep" and fusion.gamma > 0


@torch.no_grad()
def state_features(model: TrunkModel, states: Tensor) -> Tensor:
    """The trunk's latent of a state alone: the output of the query token [s, 0, 0, 0].

    The kernel's h_qry and h_t (paper sec. 3.3) must describe the query state and the context
    state s_t. The query position's output is a learned function of the state only (a
    length-1 sequence, no context), so it serves both, at the cost of one token per state.

    Args:
        states: [..., S].

    Returns:
        [..., D] in the model's dtype.
    """
    lead = states.shape[:-1]
    dtype = model.trunk.embed.weight.dtype
    flat = states.reshape(-1, states.shape[-1]).to(dtype)  # (N, S)
    # Contexts repeat states (bandits: one; darkroom: at most 100 cells), so run the trunk on
    # the distinct states only: an online step then costs O(#states), not O(B * T) tokens.
    uniq, inverse = torch.unique(flat, dim=0, return_inverse=True)  # (U, S), (N,)
    x = query_features(uniq, model.num_actions)  # (U, F)
    h = model.trunk(x[:, None, :])[:, 0]  # (U, D): position 0 of a 1-token sequence
    return h[inverse].reshape(*lead, h.shape[-1])


def context_evidence(
    fusion: FusionConfig,
    actions: Tensor,
    rewards: Tensor,
    num_actions: int,
    query_features: Tensor | None = None,
    context_features: Tensor | None = None,
    next_values: Tensor | None = None,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Kernel-weighted counts c_a and mean targets y~_a of a context (paper sec. 3.3).

    Args:
        fusion: kernel, tau, target, td_n, gamma.
        actions: long [..., T].
        rewards: [..., T] r_t.
        num_actions: A.
        query_features: [..., D] h_qry (latent or state); unused by the uniform kernel.
        context_features: [..., T, D] h_t of each transition's state s_t.
        next_values: [..., T] max_a' Q-bar at s_{t+1}; needed when gamma > 0.
        mask: optional bool [..., T] valid prefix.

    Returns:
        (counts [..., A], weighted_mean [..., A]), float64.
    """
    rewards = rewards.to(STATS_DTYPE)
    weights = None
    if fusion.kernel != "uniform":
        if query_features is None or context_features is None:
            raise ValueError(f"kernel={fusion.kernel!r} needs query and context features")
        weights = kernel_weights(query_features.to(STATS_DTYPE),
                                 context_features.to(STATS_DTYPE), fusion.kernel, fusion.tau,
                                 mask)
    targets = rewards
    if needs_nstep(fusion):
        if next_values is None:
            if fusion.gamma > 0:
                raise ValueError("n-step targets with gamma > 0 need next_values")
            next_values = torch.zeros_like(rewards)
        targets = nstep_targets(rewards, next_values.to(STATS_DTYPE), fusion.td_n,
                                fusion.gamma, mask)
    return weighted_action_stats(weights, actions, targets, num_actions, mask)


def fused_posterior(fusion: FusionConfig, prior_mean: Tensor, prior_std: Tensor,
                    counts: Tensor, weighted_mean: Tensor) -> Posterior:
    """The ensemble prior N(Q-bar, max(sigma_Q^2, v_min)) fused with the evidence, [..., A].

    All inputs broadcast to [..., A]; computed in float64 on the CPU.
    """
    cpu = torch.device("cpu")
    return gaussian_posterior(
        prior_mean.to(cpu, STATS_DTYPE),
        prior_std.to(cpu, STATS_DTYPE).square(),
        counts.to(cpu, STATS_DTYPE),
        weighted_mean.to(cpu, STATS_DTYPE),
        fusion.noise_var,
        fusion.v_min,
    )


# ---- learned controllers -----------------------------------------------------------------


class _ModelController:
    """Shared plumbing: a :class:`ContextRunner`, the generator and observe()."""

    name = "model"

    def __init__(self, model: TrunkModel, env_name: EnvName, use_cache: bool,
                 keep_latents: bool = False, keep_prior_means: bool = False) -> None:
        model.eval()  # dropout off; the paper's models have none, but a checkpoint might
        self.model = model
        self.env_name = env_name
        self.runner = ContextRunner(model, env_name, use_cache, keep_latents, keep_prior_means)
        self._generator: RandomSource | None = None

    def reset(self, num_tasks: int, num_actions: int,
              generator: RandomSource | None = None) -> None:
        """Empty contexts for B = ``num_tasks`` tasks; ``generator`` drives any sampling."""
        if num_actions != self.model.num_actions:
            raise ValueError(f"num_actions={num_actions} but the model has "
                             f"{self.model.num_actions} actions")
        self.runner.reset(num_tasks)
        self._generator = generator

    def observe(self, actions: Tensor, rewards: Tensor, states: Tensor | None = None,
                next_states: Tensor | None = None) -> None:
        """Append one transition per task; the model is stepped lazily at the next act()."""
        self.runner.append(states, actions, rewards, next_states)

    def _query(self, states: Tensor | None) -> Tensor | None:
        if self.env_name == "darkroom" and states is None:
            raise ValueError("darkroom controllers need the current states in act()")
        return states


class SpiceController(_ModelController):
    """SPICE: ensemble prior at the current position fused with kernel-weighted evidence.

    Args:
        model: a SpiceModel (anything whose heads return prior_mean / prior_std / latent).
        fusion: kernel, targets, noise_var, v_min, beta (+ schedule) and the action rule.
        env_name: "bandit" or "darkroom".
        use_cache: bandits: KV-cache decoding (see :class:`ContextRunner`).
        name: the method name in results.
    """

    def __init__(self, model: TrunkModel, fusion: FusionConfig, env_name: EnvName = "bandit",
                 use_cache: bool = True, name: str = "spice") -> None:
        super().__init__(model, env_name, use_cache,
                         keep_latents=fusion.kernel != "uniform"
                         and fusion.kernel_space == "context",
                         keep_prior_means=needs_bootstrap(fusion))
        self.fusion = fusion
        self.name = name
        # Uniform weights and reward targets never change once observed: keep running sums.
        self.incremental = fusion.kernel == "uniform" and not needs_nstep(fusion)
        self._stats: RunningStats | None = None

    def reset(self, num_tasks: int, num_actions: int,
              generator: RandomSource | None = None) -> None:
        super().reset(num_tasks, num_actions, generator)
        self._stats = RunningStats.zeros(num_tasks, num_actions, dtype=STATS_DTYPE)

    def observe(self, actions: Tensor, rewards: Tensor, states: Tensor | None = None,
                next_states: Tensor | None = None) -> None:
        super().observe(actions, rewards, states, next_states)
        if self.incremental:
            assert self._stats is not None
            self._stats.update(actions.cpu(), rewards.cpu())  # O(A) per task

    def evidence(self, view: ContextView, query_states: Tensor | None) -> tuple[Tensor, Tensor]:
        """(counts [B, A], weighted mean [B, A]) from the context of ``view``.

        Latent kernel: h_qry and h_t are :func:`state_features` of the query state and of each
        context state s_t; state kernel: the raw states.
        """
        if self.incremental:
            assert self._stats is not None
            return self._stats.counts, self._stats.mean
        f = self.fusion
        query = context = None
        if f.kernel != "uniform":
            B, _, S = view.states.shape
            query = (view.states.new_zeros(B, S) if query_states is None
                     else query_states.to(view.states))
            context = view.states
            if f.kernel_space == "latent":
                query = state_features(self.model, query)  # (B, D)
                context = state_features(self.model, context)  # (B, T, D)
            elif f.kernel_space == "context":
                assert view.latents is not None
                query = view.latents[:, -1]  # (B, D): position T, the current state
                context = view.latents[:, :-1]  # (B, T, D): position t-1 for s_t
        next_values = None
        if needs_bootstrap(f):
            assert view.prior_means is not None
            next_values = bootstrap_values(view.prior_means, f.bootstrap)  # (B, T): V(s_{t+1})
        return context_evidence(f, view.actions, view.rewards, self.model.num_actions,
                                query, context, next_values)

    def posterior(self, states: Tensor | None = None) -> Posterior:
        """The fused posterior at the current step, (mean [B, A], var [B, A]) on the CPU."""
        query = self._query(states)
        view = self.runner.view(query)
        counts, mean = self.evidence(view, query)
        return fused_posterior(self.fusion, view.head.prior_mean, view.head.prior_std, counts,
                               mean)

    def act(self, t: int, states: Tensor | None = None) -> Tensor:
        """The fusion rule's actions, long [B] on the CPU."""
        post = self.posterior(states)
        beta = beta_at(t, self.fusion.beta, self.fusion.beta_schedule)
        return select_action(post, self.fusion.controller, beta, self._generator)


class PolicyController(_ModelController):
    """DPT / AD-BC: act from the policy head's logits at the current position.

    Args:
        model: a DptModel (or any model whose heads return logits).
        env_name: "bandit" or "darkroom".
        sample: draw from softmax(logits) (DPT's bandit protocol) or take the argmax.
        use_cache: bandits: KV-cache decoding.
        name: "dpt" or "ad-bc" (the same controller on a model trained on weak labels).
    """

    def __init__(self, model: TrunkModel, env_name: EnvName = "bandit", sample: bool = True,
                 use_cache: bool = True, name: str = "dpt") -> None:
        super().__init__(model, env_name, use_cache)
        self.sample = sample
        self.name = name

    def act(self, t: int, states: Tensor | None = None) -> Tensor:
        """Sampled or greedy actions, long [B] on the CPU."""
        logits = self.runner.view(self._query(states)).head.logits.to("cpu", STATS_DTYPE)
        if not self.sample:
            return argmax_lowest(logits)
        if self._generator is None:
            raise ValueError("a sampling policy controller needs a torch.Generator or StepDraws "
                             "in reset()")
        return sample_categorical(torch.softmax(logits, dim=-1), self._generator)  # (B,)


# ---- oracles -----------------------------------------------------------------------------


class _Oracle:
    """Base of the oracles: nothing to learn."""

    name = "optimal"

    def reset(self, num_tasks: int, num_actions: int,
              generator: RandomSource | None = None) -> None:
        """Nothing to reset."""

    def observe(self, actions: Tensor, rewards: Tensor, states: Tensor | None = None,
                next_states: Tensor | None = None) -> None:
        """Ignores the transition."""


class DarkroomOracle(_Oracle):
    """Plays :func:`spice_ray.envs.darkroom.optimal_action` (zero regret by construction)."""

    def __init__(self, tasks: darkroom.DarkroomTasks) -> None:
        self.tasks = tasks

    def act(self, t: int, states: Tensor | None = None) -> Tensor:
        """Shortest-path actions for states [B, 2], long [B]."""
        if states is None:
            raise ValueError("the darkroom oracle needs the current states")
        return torch.from_numpy(darkroom.optimal_action(self.tasks, states.cpu().numpy()))


class BanditOracle(_Oracle):
    """Always pulls argmax_a mu_a."""

    def __init__(self, means: np.ndarray) -> None:
        self.best = torch.from_numpy(bandit.optimal_action(bandit.BanditTasks(means, 0.0)))

    def act(self, t: int, states: Tensor | None = None) -> Tensor:
        """The best arm of every task, long [B]."""
        return self.best.clone()


# ---- factory -----------------------------------------------------------------------------


def make_controller(
    spec: ControllerSpec,
    env_name: EnvName,
    model: TrunkModel | None = None,
    eval_cfg: EvalConfig | None = None,
    sigma: float = 0.3,
    tasks: darkroom.DarkroomTasks | bandit.BanditTasks | None = None,
) -> Controller:
    """Build the controller a spec describes.

    Args:
        spec: the method and its settings.
        env_name: "bandit" or "darkroom".
        model: required by spice / dpt / ad-bc.
        eval_cfg: baseline constants (UCB/LCB c, TS prior); default EvalConfig().
        sigma: test-time reward noise std (TS uses sigma^2).
        tasks: required by "optimal" (goals for darkroom, means for bandits).
    """
    eval_cfg = eval_cfg or EvalConfig()
    if spec.uses_model:
        if model is None:
            raise ValueError(f"method {spec.method!r} needs a model")
        if spec.method == "spice":
            if not hasattr(model, "ensemble"):
                raise ValueError("method 'spice' needs a SpiceModel (a value ensemble)")
            return SpiceController(model, spec.fusion, env_name, spec.use_cache)
        return PolicyController(model, env_name, spec.sample, spec.use_cache, spec.method)
    if spec.method == "optimal":
        if isinstance(tasks, darkroom.DarkroomTasks):
            return DarkroomOracle(tasks)
        if isinstance(tasks, bandit.BanditTasks):
            return BanditOracle(tasks.means)
        raise ValueError("method 'optimal' needs the tasks")
    if env_name != "bandit":
        raise ValueError(f"baseline {spec.method!r} exists only for bandits")
    return make_baseline(spec.method, eval_cfg, sigma)
