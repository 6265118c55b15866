"""SPICE at test time: a per-action prior fused with kernel-weighted evidence from the context.

The agent is the fusion -- the kernel weights, the n-step targets, the Normal-Normal posterior
and the action rule (``spice_ray.fusion``) -- plus one prior strategy
(``spice_ray.agents.priors``): the learned ensemble's N(Q-bar, max((s sigma_Q)^2, v_min)) at
the current position (paper sec. 3.3), one constant N(mu_0, v_0) (the prior ablation and the
count-based explorer: no network), the exact task posterior (the oracle prior), or the learned
mean with the exact sd. Everything but the prior is the same code, so the difference between
the rows is the prior alone.

Kernel features (``fusion.kernel_space``): ``state`` compares raw states; ``latent`` the
trunk's output for a state alone (the query token [s, 0, 0, 0], the paper's reading); and
``context`` the latents the value heads read, position T for the current state and position
t-1 (which has seen s_t as the next state of its token) for context state s_t.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from spice_ray.agents.base import (
    AgentSpec,
    Build,
    Method,
    OfflineContexts,
    register_method,
)
from spice_ray.agents.priors import ContextFreePrior, FlatPrior, make_prior
from spice_ray.agents.runner import ContextRunner, ContextView, _Growing
from spice_ray.config import FusionConfig
from spice_ray.envs.bayes import TaskPosterior
from spice_ray.fusion import (
    STATS_DTYPE,
    Posterior,
    RandomSource,
    RunningStats,
    beta_at,
    bootstrap_values,
    context_evidence,
    fused_posterior,
    greedy_action,
    needs_bootstrap,
    needs_nstep,
    select_action,
)
from spice_ray.model.tokens import query_features
from spice_ray.model.trunk import TrunkModel


@torch.no_grad()
def state_features(model: TrunkModel, states: Tensor) -> Tensor:
    """The trunk's latent of a state alone: the output of the query token [s, 0, 0, 0].

    The query position's output is a learned function of the state only (a length-1 sequence,
    no context). Contexts repeat states (bandits: one; darkroom: at most 100 cells), so the
    trunk runs on the distinct states only: an online step costs O(#states), not O(B T).

    Args:
        states: [..., S].

    Returns:
        [..., D] in the model's dtype.
    """
    lead = states.shape[:-1]
    dtype = model.trunk.embed.weight.dtype
    flat = states.reshape(-1, states.shape[-1]).to(dtype)  # (N, S)
    uniq, inverse = torch.unique(flat, dim=0, return_inverse=True)  # (U, S), (N,)
    x = query_features(uniq, model.num_actions)  # (U, F)
    h = model.trunk(x[:, None, :])[:, 0]  # (U, D): position 0 of a 1-token sequence
    return h[inverse].reshape(*lead, h.shape[-1])


class _Context:
    """A model-free growing context: actions, rewards and states of B rollouts."""

    def __init__(self, num_tasks: int, state_dim: int) -> None:
        self.actions = _Growing(num_tasks, (), torch.long, torch.device("cpu"))
        self.rewards = _Growing(num_tasks, (), STATS_DTYPE, torch.device("cpu"))
        self.states = _Growing(num_tasks, (state_dim,), STATS_DTYPE, torch.device("cpu"))

    def view(self) -> ContextView:
        return ContextView(head=None, actions=self.actions.view(), rewards=self.rewards.view(),
                           states=self.states.view())


class SpiceAgent:
    """SPICE: the prior at the current step fused with kernel-weighted context evidence.

    Args:
        fusion: kernel, kernel space, targets, noise_var, v_min, beta (+ schedule), the rule.
        model: a SpiceModel for the learned prior (anything whose heads return prior_mean,
            prior_std and latent), or None with ``prior``.
        prior: instead of the model (kernels on raw states only): a :class:`FlatPrior`, a
            :class:`ContextFreePrior`, or the environment's exact task posterior
            (``envs.bayes.TaskPosterior``: the oracle prior, its mean and variance at the
            current state given the whole context).
        stateless: the environment has one constant state (KV cache allowed).
        use_cache: stateless environments: KV-cache decoding (see ``ContextRunner``).
        name: the method name.
        exact_width: a diagnostic: with a model, the learned prior's mean but the sd of this
            exact task posterior (does a calibrated width let the fusion use the mean?).
    """

    def __init__(self, fusion: FusionConfig, model: TrunkModel | None = None,
                 prior: FlatPrior | ContextFreePrior | TaskPosterior | None = None,
                 stateless: bool = False,
                 use_cache: bool = True, name: str = "spice",
                 exact_width: TaskPosterior | None = None, num_states: int = 1) -> None:
        if (model is None) == (prior is None):
            raise ValueError("SpiceAgent needs either a model or a flat prior")
        if model is None and fusion.kernel != "uniform" and fusion.kernel_space != "state":
            raise ValueError(f"fusion.kernel_space={fusion.kernel_space!r} needs a model; a "
                             "flat prior compares raw states (kernel_space=state)")
        if model is not None and not hasattr(model, "ensemble"):
            raise ValueError("SPICE needs a SpiceModel (a value ensemble)")
        if exact_width is not None and model is None:
            raise ValueError("exact_width replaces a learned prior's sd: it needs a model")
        self.fusion = fusion
        self.model = model
        self.prior = make_prior(fusion, model, prior, exact_width)
        self.name = name
        self.num_states = int(num_states)
        self.runner = None if model is None else ContextRunner(
            model.eval(), stateless, use_cache,
            keep_latents=fusion.kernel != "uniform" and fusion.kernel_space == "context",
            keep_prior_means=needs_bootstrap(fusion))
        # Uniform weights and reward targets never change once observed: keep running sums.
        self.incremental = fusion.kernel == "uniform" and not needs_nstep(fusion)
        self._stats: RunningStats | None = None
        self._context: _Context | None = None
        self._draws: RandomSource | None = None

    def reset(self, num_tasks: int, num_actions: int, draws: RandomSource | None = None
              ) -> None:
        if self.model is not None and num_actions != self.model.num_actions:
            raise ValueError(f"num_actions={num_actions} but the model has "
                             f"{self.model.num_actions} actions")
        self.num_actions = num_actions
        if self.runner is not None:
            self.runner.reset(num_tasks)
        self.prior.reset(num_tasks)
        self._stats = RunningStats.zeros(num_tasks, num_actions, dtype=STATS_DTYPE)
        self._context = None
        self._num_tasks = num_tasks
        self._draws = draws
        self._seen = 0
        """Transitions observed since reset: the context length h the prior is at."""

    def observe(self, actions: Tensor, rewards: Tensor, states: Tensor, next_states: Tensor
                ) -> None:
        self._seen += 1
        if self.runner is not None:
            self.runner.append(states, actions, rewards, next_states)
        else:
            if self._context is None:
                self._context = _Context(self._num_tasks, states.shape[-1])
            self._context.actions.append(actions.cpu())
            self._context.rewards.append(rewards.cpu())
            self._context.states.append(states.cpu())
        self.prior.observe(actions, rewards, states, next_states)
        if self.incremental:
            assert self._stats is not None
            self._stats.update(actions.cpu(), rewards.cpu())  # O(A) per task

    def _view(self, states: Tensor) -> ContextView:
        if self.runner is not None:
            return self.runner.view(states)
        if self._context is None:  # nothing observed yet
            empty = _Context(self._num_tasks, states.shape[-1])
            return empty.view()
        return self._context.view()

    def kernel_features(self, states: Tensor) -> Tensor:
        """What the kernel compares for states [..., S] alone: the raw states, or the trunk's
        output for the query token (``latent``). ``context`` features depend on the context
        and have no per-state value.

        Raises:
            ValueError: for ``kernel_space=context``.
        """
        if self.fusion.kernel_space == "state":
            return states
        if self.fusion.kernel_space == "latent":
            return state_features(self.model, states)
        raise ValueError("kernel_space=context features depend on the context, not on a state")

    def evidence(self, view: ContextView, query_states: Tensor) -> tuple[Tensor, Tensor]:
        """(counts [B, A], weighted mean [B, A]) from the context of ``view``."""
        if self.incremental:
            assert self._stats is not None
            return self._stats.counts, self._stats.mean
        f = self.fusion
        query = context = None
        if f.kernel != "uniform":
            context = view.states
            query = query_states.to(context)
            if f.kernel_space == "latent":
                query = self.kernel_features(query)  # (B, D)
                context = self.kernel_features(context)  # (B, T, D)
            elif f.kernel_space == "context":
                assert view.latents is not None
                query = view.latents[:, -1]  # (B, D): position T, the current state
                context = view.latents[:, :-1]  # (B, T, D): position t-1 for s_t
        next_values = self.prior.next_values(view, f) if needs_bootstrap(f) else None
        return context_evidence(f, view.actions, view.rewards, self.num_actions, query,
                                context, next_values)

    def posterior(self, states: Tensor) -> Posterior:
        """The fused posterior at the current step, (mean [B, A], var [B, A]) on the CPU."""
        view = self._view(states)
        counts, mean = self.evidence(view, states)
        h = self._seen if self.model is None else min(self._seen, self.model.max_len - 1)
        prior_mean, prior_std = self.prior.moments(view, states, h,
                                                   (self._num_tasks, self.num_actions))
        return fused_posterior(self.fusion, prior_mean, prior_std, counts, mean)

    def act(self, t: int, states: Tensor) -> Tensor:
        """The fusion rule's actions, long [B] on the CPU."""
        post = self.posterior(states)
        beta = beta_at(t, self.fusion.beta, self.fusion.beta_schedule,
                       self.num_states * self.num_actions)
        return select_action(post, self.fusion.rule, beta, self._draws)

    def offline_picks(self, contexts: OfflineContexts) -> Tensor:
        """The greedy pick argmax_a m_post after the first h transitions, for every h at once:
        long [B, P]. The learned prior is the model's heads at position h
        (``contexts.outputs``), its width as online (``fusion.width_source``, scale, decay);
        a flat prior is the same at every h. The uniform kernel's evidence for every prefix
        comes from prefix masks at once; other kernels take one vectorised step per h."""
        f, c = self.fusion, contexts
        if f.kernel != "uniform" and f.kernel_space == "context":
            raise ValueError("fusion.kernel_space=context has no offline curve: the offline "
                             "pick reads one position, not the latents of a moving query")
        outputs = c.outputs or {}
        if self.model is not None and "prior_mean" not in outputs:
            raise ValueError("method 'spice' needs a SpiceModel (a value ensemble)")
        B, T = c.actions.shape
        P = len(c.hs)
        next_values = None
        if needs_bootstrap(f):
            next_values = bootstrap_values(outputs["prior_mean_all"][:, 1:], f.bootstrap)
        if f.kernel == "uniform":
            # All prefixes at once: prefix masks [P, T] over the broadcast context [B, P, T].
            mask = torch.arange(T)[None, :] < torch.as_tensor(c.hs)[:, None]  # (P, T)
            expand = (B, P, T)
            counts, mean = context_evidence(
                f, c.actions[:, None].expand(expand), c.rewards[:, None].expand(expand),
                c.num_actions,
                next_values=None if next_values is None else next_values[:, None].expand(expand),
                mask=mask.expand(expand))  # (B, P, A) each
        else:  # the weights depend on the query at h: one vectorised step per h
            stats = []
            for h in (int(v) for v in c.hs):
                query, context = torch.zeros(B, c.state_dim), torch.zeros(B, h, c.state_dim)
                if f.kernel_space == "latent":
                    query, context = self.kernel_features(query), self.kernel_features(context)
                stats.append(context_evidence(
                    f, c.actions[:, :h], c.rewards[:, :h], c.num_actions, query, context,
                    None if next_values is None else next_values[:, :h]))
            counts = torch.stack([n for n, _ in stats], 1)  # (B, P, A)
            mean = torch.stack([m for _, m in stats], 1)  # (B, P, A)
        prior_mean, prior_std = self.prior.offline_moments(outputs, torch.as_tensor(c.hs),
                                                           counts.shape)
        post = fused_posterior(f, prior_mean, prior_std, counts, mean)
        return greedy_action(post.mean, c.ties)  # (B, P)


# ---- the methods this module's agent is -------------------------------------------------------


def _learned(spec: AgentSpec, env: Any, build: Build, exact_width: bool = False
             ) -> SpiceAgent:
    """SPICE: the ensemble's prior fused with the context (``exact_width``: the learned mean
    with the exact posterior's sd, a diagnostic)."""
    width = env.task_posterior(spec.fusion.gamma) if exact_width else None
    return SpiceAgent(spec.fusion, model=build.model, stateless=env.stateless,
                      use_cache=spec.use_cache, name=spec.method, exact_width=width,
                      num_states=env.num_states)


def _learned_exact_width(spec: AgentSpec, env: Any, build: Build) -> SpiceAgent:
    return _learned(spec, env, build, exact_width=True)


def _model_free(spec: AgentSpec, env: Any, build: Build) -> SpiceAgent:
    """SPICE's fusion and rule without a network: a constant prior (``AgentSpec.prior``) or
    the environment's exact task posterior (the oracle prior)."""
    if spec.info.prior == "oracle":
        prior = env.task_posterior(spec.fusion.gamma)
    elif spec.info.prior == "context-free":
        prior = ContextFreePrior(env.task_posterior(spec.fusion.gamma))
    else:
        prior = FlatPrior(*spec.prior)
    return SpiceAgent(spec.fusion, prior=prior, stateless=env.stateless, name=spec.method,
                      num_states=env.num_states)


register_method("spice", Method("SPICE", _learned, model="spice", offline=True, fused=True,
                                 scales_width=True, paper_width="spice-paper"))
register_method("spice-paper", Method("SPICE (paper)", _learned, model="spice", fused=True))
"""SPICE with the ensemble's width as the paper uses it (``fusion.width_scale`` not read): the
tuned tables' row beside SPICE, whose width scale is chosen on validation with beta."""
register_method("spice-flat", Method("SPICE (flat prior)", _model_free, offline=True,
                                     fused=True, prior="flat"))
"""The prior ablation: SPICE's fusion and action rule with one constant prior, no network."""
register_method("spice-exact-width", Method("SPICE (learned mean, exact sd)", _learned_exact_width,
                                            model="spice", fused=True,
                                            requires="task_posterior"))
register_method("spice-oracle", Method("SPICE (oracle prior)", _model_free, fused=True,
                                       prior="oracle", requires="task_posterior"))
"""SPICE's fusion and rule fed the exact task posterior as its prior: the best any learned
prior could give."""
register_method("spice-context-free", Method("SPICE (context-free prior)", _model_free,
                                             fused=True, prior="context-free",
                                             requires="task_posterior"))
"""SPICE's fusion and rule fed the family's exact prior before any context (its h = 0
marginal at the current state), never conditioned on the context: what knowing the population
gives without reading the context. SPICE below it is in-context inference, not population
knowledge."""
register_method("spice-data-prior", Method("SPICE (training-data prior)", _model_free,
                                           fused=True, prior="data", stateless_only=True))
"""SPICE's fusion and rule fed a per-arm prior estimated from the training tasks' rewards
(``spice_ray.train.prior.data_arm_prior``: what SPICE could know of a bandit family's arms
without reading a context; ``AgentSpec.prior`` holds its means and variances per arm, filled in
by the study from the dataset), beside the exact context-free prior."""
register_method("count", Method("Count-UCB", _model_free, fused=True, prior="flat"))
"""Tabular posterior-UCB over exact states with the constant prior (a count-based explorer)."""
