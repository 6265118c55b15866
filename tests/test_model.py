"""Model kernels: tokens, cached == uncached trunk, causality, no target leakage, ensemble."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from benchmarks.loop_ensemble import LoopEnsemble
from spice_ray.config import ModelConfig, TrainConfig, make_config
from spice_ray.model import (
    DptModel,
    SpiceModel,
    Tokens,
    Trunk,
    ValueEnsemble,
    align_to_transitions,
    make_tokens,
)
from spice_ray.model import ensemble as ensemble_module
from spice_ray.model.tokens import token_dim
from spice_ray.train.losses import dpt_loss, spice_loss


def _env(name: str, arms: int = 5):
    """The environment of a smoke config (bandits with ``arms`` arms)."""
    sets = [f"env.num_arms={arms}"] if name == "bandit" else []
    return make_config("smoke", name, overrides=sets).env


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny ops: one thread is fastest


TINY = ModelConfig(n_layer=2, n_embd=16, n_head=2, ensemble_size=3, head_hidden=8)


def bandit_batch(B: int, T: int, A: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(A), size=B).astype(np.float32)
    return {
        "actions": rng.integers(0, A, (B, T)).astype(np.uint8),
        "rewards": rng.normal(0.5, 0.3, (B, T)).astype(np.float32),
        "behaviour_probs": probs,
        "label": rng.integers(0, A, B).astype(np.uint8),
        "means": rng.random((B, A)).astype(np.float32),
        "optimal_action": np.zeros(B, np.uint8),
    }


def darkroom_batch(B: int, T: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "states": rng.integers(0, 10, (B, T + 1, 2)).astype(np.uint8),
        "actions": rng.integers(0, 5, (B, T)).astype(np.uint8),
        "rewards": rng.integers(0, 2, (B, T)).astype(np.uint8),
        "query_state": rng.integers(0, 10, (B, 2)).astype(np.uint8),
        "label": rng.integers(0, 5, B).astype(np.uint8),
    }


def spice(A: int = 4, S: int = 1, T: int = 8, seed: int = 0) -> SpiceModel:
    return SpiceModel(TINY, A, S, T + 1, generator=torch.Generator().manual_seed(seed)).eval()


def replace(tokens: Tokens, **changes: torch.Tensor) -> Tokens:
    return dataclasses.replace(tokens, **changes)


# ---- tokens ---------------------------------------------------------------------------------


def test_make_tokens_bandit_and_darkroom() -> None:
    bt = make_tokens(bandit_batch(3, 6, 4, seed=0), _env("bandit", 4))
    assert bt.query_state.shape == (3, 1) and not bt.query_state.any()
    assert bt.states.shape == bt.next_states.shape == (3, 6, 1) and not bt.states.any()
    assert bt.actions.dtype == torch.long and bt.label.dtype == torch.long
    assert bt.rewards.dtype == torch.float32 and bt.behaviour_probs.shape == (3, 4)

    raw = darkroom_batch(2, 5, seed=1)
    dt = make_tokens({k: torch.as_tensor(v) for k, v in raw.items()}, _env("darkroom"))
    assert dt.states.shape == dt.next_states.shape == (2, 5, 2)
    np.testing.assert_array_equal(dt.states.numpy(), raw["states"][:, :-1])
    np.testing.assert_array_equal(dt.next_states.numpy(), raw["states"][:, 1:])
    np.testing.assert_array_equal(dt.query_state.numpy(), raw["query_state"])
    torch.testing.assert_close(dt.behaviour_probs, torch.full((2, 5), 0.2))
    assert dt.prefix(2).actions.shape == (2, 2)
    with pytest.raises(ValueError, match="behaviour_probs of env.name=bandit has shape"):
        make_tokens(bandit_batch(3, 6, 4, seed=0), _env("bandit", 5))


# ---- trunk ----------------------------------------------------------------------------------


def test_cached_equals_uncached_trunk() -> None:
    g = torch.Generator().manual_seed(0)
    trunk = Trunk(2, 5, n_layer=3, n_embd=16, n_head=2, dropout=0.0, max_len=10, generator=g)
    trunk.eval()
    x = torch.randn(3, 10, token_dim(2, 5), generator=g)  # (B, L, F)
    with torch.no_grad():
        full = trunk(x)  # (B, L, D)
        cache = trunk.init_cache(3)
        stepped = torch.stack([trunk.step(x[:, i], cache) for i in range(10)], 1)
        chunks = trunk.init_cache(3)
        chunked = torch.cat([trunk(x[:, :4], chunks), trunk(x[:, 4:7], chunks),
                             trunk(x[:, 7:], chunks)], 1)  # prefill then chunks with a prefix
    assert cache.length == chunks.length == 10
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=0)
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=0)
    with pytest.raises(ValueError):
        trunk.step(x[:, 0], cache)  # past max_len


def test_model_step_api_matches_forward_darkroom() -> None:
    T = 6
    model = spice(A=5, S=2, T=T, seed=1)
    raw = darkroom_batch(2, T, seed=2)
    tokens = make_tokens(raw, _env("darkroom"))
    states = torch.as_tensor(raw["states"])  # uint8 straight from an environment
    with torch.no_grad():
        full = model(tokens)
        cache = model.init_cache(2)
        outs = [model.step_query(torch.as_tensor(raw["query_state"]), cache)]
        for t in range(T):
            outs.append(model.step_transition(states[:, t], torch.as_tensor(raw["actions"][:, t]),
                                              torch.as_tensor(raw["rewards"][:, t]),
                                              states[:, t + 1], cache))
    for name in ("logits", "q", "prior_mean", "prior_std", "latent"):
        stepped = torch.stack([getattr(o, name) for o in outs], 1)
        torch.testing.assert_close(stepped, getattr(full, name), atol=1e-5, rtol=1e-4)


def test_causality_later_transitions_never_change_earlier_outputs() -> None:
    T, t = 8, 5  # change transition t (token t) in every field
    model = spice(T=T, seed=2)
    tokens = make_tokens(bandit_batch(2, T, 4, seed=3), _env("bandit", 4))
    a, r = tokens.actions.clone(), tokens.rewards.clone()
    a[:, t - 1] = (a[:, t - 1] + 1) % 4
    r[:, t - 1] += 3.0
    s = tokens.next_states.clone()
    s[:, t - 1] += 1.0
    with torch.no_grad():
        base, other = model(tokens), model(replace(tokens, actions=a, rewards=r, next_states=s))
    torch.testing.assert_close(other.latent[:, :t], base.latent[:, :t], atol=0, rtol=0)
    torch.testing.assert_close(other.q[:, :t], base.q[:, :t], atol=0, rtol=0)
    assert (other.latent[:, t:] - base.latent[:, t:]).abs().amax(-1).min() > 1e-4


def test_no_target_leakage_q_prediction_ignores_own_reward() -> None:
    T = 8
    model = spice(T=T, seed=3)
    tokens = make_tokens(bandit_batch(2, T, 4, seed=4), _env("bandit", 4))
    for t in (1, 4, T):  # 1-indexed transition whose reward changes
        r = tokens.rewards.clone()
        r[:, t - 1] += 5.0
        with torch.no_grad():
            base, other = model(tokens), model(replace(tokens, rewards=r))
        pred_b, next_b = align_to_transitions(base.q)  # (B, T, K, A) x2
        pred_o, next_o = align_to_transitions(other.q)
        # the Q regressed on transition t (and on every earlier one) has not seen r_t ...
        torch.testing.assert_close(pred_o[:, :t], pred_b[:, :t], atol=0, rtol=0)
        # ... while the next-state value (targets only) has, so the check is not vacuous
        assert (next_o[:, t - 1] - next_b[:, t - 1]).abs().max() > 1e-4


def test_no_unused_parameters_and_spec_round_trip() -> None:
    T = 5
    tokens = make_tokens(bandit_batch(2, T, 4, seed=5), _env("bandit", 4))
    model = spice(T=T, seed=4).train()
    loss, _ = spice_loss(model(tokens), tokens, TrainConfig(detach_weights=False),
                         model.anchor_loss())
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert missing == []

    dpt = DptModel(TINY, 4, 1, T + 1, generator=torch.Generator().manual_seed(0))
    dpt_loss(dpt(tokens).logits, tokens.label)[0].backward()
    assert all(p.grad is not None for p in dpt.parameters())

    for m in (model, dpt):
        spec = m.spec()
        assert spec["kind"] in ("spice", "dpt") and spec["max_len"] == T + 1
        clone = type(m).from_spec(spec)
        clone.load_state_dict(m.state_dict())
        assert clone.config == m.config
        torch.testing.assert_close(clone.eval()(tokens).logits, m.eval()(tokens).logits)
    with pytest.raises(ValueError):
        DptModel.from_spec(model.spec())


# ---- ensemble -------------------------------------------------------------------------------


def _loop_grads(loop: LoopEnsemble) -> list[torch.Tensor]:
    """The loop ensemble's f gradients in the vectorised layout: weight_i [K, in, out] and
    bias_i [K, 1, out], in ``ValueEnsemble.f.parameters()`` order."""
    linears = [[m for m in head if isinstance(m, torch.nn.Linear)] for head in loop.f]
    grads = []
    for i in range(len(linears[0])):
        grads.append(torch.stack([lin[i].weight.grad.T for lin in linears]))
        grads.append(torch.stack([lin[i].bias.grad[None] for lin in linears]))
    return grads


@pytest.mark.parametrize(("kernel", "depth", "alpha"), [
    ("eager", 1, 0.7), ("eager", 1, 0.0), ("eager", 2, 0.7),
    ("compiled", 1, 0.7), ("compiled", 1, 0.0),
])
def test_vectorised_ensemble_equals_loop(monkeypatch, kernel, depth, alpha) -> None:
    """Values and every gradient (latents, f's weights and biases) match the per-head,
    per-action loop, for the layer stack ("eager") and the fused compiled path, the latter
    across partial row blocks."""
    monkeypatch.setattr(ensemble_module, "FUSED_BLOCK", 16)  # 2 x 19 rows: 3 blocks, last partial
    g = torch.Generator().manual_seed(5)
    ens = ValueEnsemble(6, 3, ensemble_size=4, hidden=5, prior_scale=alpha, depth=depth,
                        generator=g, kernel=kernel).double()
    with torch.no_grad():
        for p in ens.f.parameters():  # move off the anchors so anchor_loss is non-trivial
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    loop = LoopEnsemble.from_vectorised(ens)
    h = torch.randn(2, 19, 6, generator=g, dtype=torch.float64)  # (B, T, D)
    h_vec, h_loop = h.clone().requires_grad_(True), h.clone().requires_grad_(True)
    q = ens(h_vec)
    assert q.shape == (2, 19, 4, 3)
    q_loop = loop(h_loop)
    torch.testing.assert_close(q, q_loop, atol=1e-12, rtol=1e-10)
    weights = torch.randn(q.shape, generator=g, dtype=q.dtype)  # a generic dL/dq
    (q * weights).sum().backward()
    (q_loop * weights).sum().backward()
    torch.testing.assert_close(h_vec.grad, h_loop.grad, atol=1e-12, rtol=1e-10)
    for p, p_loop in zip(ens.f.parameters(), _loop_grads(loop), strict=True):
        torch.testing.assert_close(p.grad, p_loop, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(ens.anchor_loss(), loop.anchor_loss())
    assert ens.anchor_loss() > 0


@pytest.mark.parametrize("kernel", ["compiled", "eager"])
def test_fused_heads_keep_or_recompute_preactivations(monkeypatch, kernel) -> None:
    """The fused path's backward gives the same gradients whether it keeps the pre-activations
    from forward (the default, faster) or recomputes them block by block (the memory-lean
    baseline ``benchmarks/bench_throughput.py`` times)."""
    monkeypatch.setattr(ensemble_module, "FUSED_BLOCK", 16)  # 3 blocks, the last partial
    results = []
    for keep in (True, False):
        monkeypatch.setattr(ensemble_module, "KEEP_PREACTIVATIONS", keep)
        ens = ValueEnsemble(6, 3, ensemble_size=4, hidden=5, prior_scale=0.7,
                            generator=torch.Generator().manual_seed(2), kernel="compiled")
        ens = ens.double()
        if kernel == "eager":  # the fused Function with its kernels run eagerly
            monkeypatch.setattr(ensemble_module, "_run_kernel",
                                lambda name, mode, *a: ensemble_module._EAGER[name](*a))
        h = torch.randn(2, 19, 6, generator=torch.Generator().manual_seed(3),
                        dtype=torch.float64).requires_grad_(True)
        q = ens(h)
        (q * torch.linspace(-1, 1, q.numel(), dtype=q.dtype).view(q.shape)).sum().backward()
        results.append([q.detach(), h.grad, *(p.grad for p in ens.f.parameters())])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_compiled_heads_match_eager_in_float32() -> None:
    """The compiled kernels are the eager ones fused: same function at float32 precision,
    here above COMPILE_MIN_ROWS so ``auto`` compiles too."""
    g = torch.Generator().manual_seed(8)
    kw = {"ensemble_size": 3, "hidden": 8, "prior_scale": 1.0}
    eager = ValueEnsemble(8, 4, **kw, generator=torch.Generator().manual_seed(1), kernel="eager")
    auto = ValueEnsemble(8, 4, **kw, generator=torch.Generator().manual_seed(1))
    h = torch.randn(ensemble_module.COMPILE_MIN_ROWS + 5, 8, generator=g)
    outs = []
    for ens in (eager, auto):
        x = h.clone().requires_grad_(True)
        q = ens(x)
        q.square().sum().backward()
        outs.append((q.detach(), x.grad, ens.f.weight_0.grad, ens.f.weight_1.grad))
    assert ensemble_module._COMPILED, "auto should have compiled at this size"
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_auto_head_kernel_falls_back_when_compile_fails(monkeypatch, caplog) -> None:
    def no_compiler(fn, **kwargs):
        def call(*args):
            raise RuntimeError("no C++ compiler found")
        return call

    monkeypatch.setattr(torch, "compile", no_compiler)
    monkeypatch.setattr(ensemble_module, "_COMPILED", {})
    monkeypatch.setattr(ensemble_module, "_compile_error", None)
    monkeypatch.setattr(ensemble_module, "COMPILE_MIN_ROWS", 1)
    h = torch.randn(5, 6, generator=torch.Generator().manual_seed(2))
    make = lambda kernel: ValueEnsemble(6, 3, 2, 4, 1.0, kernel=kernel,  # noqa: E731
                                        generator=torch.Generator().manual_seed(0))
    with caplog.at_level("WARNING", logger=ensemble_module.__name__):
        q_first = make("auto")(h)  # fused path; its kernels run eagerly after the failure
        q_later = make("auto")(h)  # the failure is remembered: the layer stack, no retry
    assert sum("torch.compile failed" in r.getMessage() for r in caplog.records) == 1
    q_eager = make("eager")(h)
    torch.testing.assert_close(q_first, q_eager)
    torch.testing.assert_close(q_later, q_eager, atol=0, rtol=0)
    with pytest.raises(RuntimeError, match="model.head_kernel='compiled'.*no C\\+\\+ compiler"):
        make("compiled")(h)
    with pytest.raises(ValueError, match="kernel='fast'"):
        make("fast")


def test_priors_and_anchors_are_frozen_buffers() -> None:
    model = spice(seed=6).train()
    ens = model.ensemble
    params = {n for n, _ in model.named_parameters()}
    buffers = {n for n, _ in model.named_buffers()}
    assert {f"ensemble.prior.weight_{i}" for i in range(model.config.head_depth + 1)} <= buffers
    assert {f"ensemble.anchor_weight_{i}" for i in range(model.config.head_depth + 1)} <= buffers
    assert not any("prior" in n or "anchor" in n for n in params)
    frozen = {n: b.clone() for n, b in model.named_buffers()}
    f_before = ens.f.weight_0.detach().clone()
    assert model.anchor_loss().item() == 0.0

    tokens = make_tokens(bandit_batch(2, 8, 4, seed=7), _env("bandit", 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(tokens).q.square().mean().backward()
    opt.step()
    for n, b in model.named_buffers():
        torch.testing.assert_close(b, frozen[n], atol=0, rtol=0)
    assert not torch.equal(ens.f.weight_0, f_before) and model.anchor_loss() > 0

    fresh = spice(seed=99)  # different init: priors and anchors must come from the state_dict
    fresh.load_state_dict(model.state_dict())
    for n, b in fresh.named_buffers():
        torch.testing.assert_close(b, frozen[n], atol=0, rtol=0)
    torch.testing.assert_close(fresh.anchor_loss(), model.anchor_loss())

    model.to(torch.float64)
    for n, b in model.named_buffers():
        assert b.dtype == torch.float64
        torch.testing.assert_close(b, frozen[n].double(), atol=0, rtol=0)
    assert model(tokens).q.dtype == torch.float64


def test_prior_std_is_unbiased() -> None:
    model = spice(seed=7)
    tokens = make_tokens(bandit_batch(2, 8, 4, seed=8), _env("bandit", 4))
    with torch.no_grad():
        out = model(tokens)
    K = out.q.shape[-2]
    var = ((out.q - out.q.mean(-2, keepdim=True)) ** 2).sum(-2) / (K - 1)
    torch.testing.assert_close(out.prior_std, var.sqrt())
    torch.testing.assert_close(out.prior_std, out.q.std(-2, correction=1))  # torch's own
    torch.testing.assert_close(out.prior_mean, out.q.mean(-2))
