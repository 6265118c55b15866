"""K-head value ensemble with randomised priors and anchoring, as one vectorised layer stack.

Head k reads [h; onehot(a)] and returns Q_k(a) = f_k(.) + alpha * p_k(.) (paper app. "Randomised
priors and anchoring"): f_k is a trainable MLP, p_k a frozen random MLP of the same shape. Every
layer holds all K heads on the leading axis (weight [K, in, out], bias [K, 1, out], as in CORL's
EDAC), so a forward is a few batched matmuls, not a Python loop over heads.

All A actions are evaluated at once without building the [h; onehot(a)] inputs: the first layer
splits as [h; onehot(a)] @ W = h @ W[:D] + W[D + a], i.e. one matmul over the latents plus a
broadcast add of the action rows.

With one hidden layer (the default) and a working ``torch.compile``, large inputs take a fused
path (:class:`_DepthOneHeads`): per block of rows, one matmul gives the pre-activations of f and
p for every head, and one compiled loop evaluates relu and the output layer for every action
without writing the (rows, K, A, hidden) activations to memory; the backward pass is written out
by hand the same way. The loops are compiled from plain torch functions (:func:`heads_forward`,
:func:`heads_backward`). Everything else (small inputs, deeper heads, ``head_kernel="eager"``,
no compiler) runs the layer stack with ordinary autograd. ``ModelConfig.head_kernel`` chooses.

The frozen prior weights and the anchors phi0 (f's initial weights) are registered buffers, so
they travel with ``state_dict`` and ``.to()`` but are not parameters: no optimizer updates them.
The slow obvious reference (K separate ``nn.Sequential`` heads, one call per head and action)
that tests and benchmarks compare against is ``benchmarks/loop_ensemble.py``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from spice_ray.config import HEAD_KERNELS

log = logging.getLogger(__name__)

HEAD_DEPTH = 1
"""Default hidden layers of each value head's MLP (f_k and p_k): in -> hidden -> 1
(``ModelConfig.head_depth``). With one hidden layer the action split of the first layer saves
most of the work: per row, D*H + 2*A*H multiply-adds instead of A*((D + A)*H + H)."""


ROW_BLOCK = 2048
"""Rows of latents per block of the layer-stack path (see :meth:`ValueEnsemble.forward`)."""

FUSED_BLOCK = 1024
"""Rows per block of the fused depth-1 path's compiled kernels (their (rows, P, K, A, hidden)
intermediates stay in cache); 1024 was the fastest of 256 to 4096 rows in bench_train's setting
(2 threads)."""

KEEP_PREACTIVATIONS = True
"""The fused path keeps its pre-activations z = h @ W1[:D] (rows x 2K x hidden floats, 29 MB at
the small bandit's batch) for the backward pass. False recomputes them block by block there, as
the path first did: less memory, but the heads' forward + backward cost 1.5x as much at the small
darkroom config (``benchmarks/bench_throughput.py`` times both)."""

COMPILE_MIN_ROWS = 1024
"""``head_kernel="auto"`` takes the compiled path only for inputs of at least this many rows.
Smaller ones (online rollouts, unit tests) are cheap eagerly and would only pay the compile time
(seconds, once per process)."""


def heads_forward(z: Tensor, rows: Tensor, out: Tensor) -> Tensor:
    """Depth-1 heads on every action from split pre-activations (second-layer bias excluded).

    q[n, k, a] = sum_{p, j} out[p, k, j] * relu(z[n, p, k, j] + rows[p, k, a, j]), where part
    p = 0 is f and p = 1 the prior (absent when alpha = 0).

    Args:
        z: [n, P, K, H] latents times the first layer's latent rows, h @ W1[:D].
        rows: [P, K, A, H] the first layer's action rows plus its bias, W1[D + a] + b1.
        out: [P, K, H] second-layer weights (the prior's already scaled by alpha).

    Returns:
        [n, K, A].
    """
    hidden = torch.relu(z[:, :, :, None, :] + rows[None])  # (n, P, K, A, H)
    return (hidden * out[None, :, :, None, :]).sum((1, 4))  # (n, K, A)


def heads_backward(z: Tensor, rows: Tensor, out: Tensor, grad: Tensor) -> tuple[Tensor, ...]:
    """Backward of :func:`heads_forward` given grad = dL/dq [n, K, A].

    With s[n, p, k, a, j] = grad[n, k, a] * 1[z + rows > 0]:
      dL/dz = out * sum_a s;  dL/drows[0] = out[0] * sum_n s[:, 0];
      dL/dout[0] = sum_{n, a} grad * relu(z + rows)[:, 0]
                 = sum_n z[:, 0] * sum_a s[:, 0] + sum_a rows[0] * sum_n s[:, 0],
    so no reduction needs the relu activations themselves.

    Returns:
        (dL/dz [n, P, K, H], sum_n s[:, 0] [K, A, H], sum_n z[:, 0] * sum_a s[:, 0] [K, H]).
    """
    active = z[:, :, :, None, :] + rows[None] > 0  # (n, P, K, A, H)
    s = torch.where(active, grad[:, None, :, :, None], 0.0)  # (n, P, K, A, H)
    s_z = s.sum(3)  # (n, P, K, H)
    return s_z * out[None], s[:, 0].sum(0), (z[:, 0] * s_z[:, 0]).sum(0)


_EAGER: dict[str, Callable[..., Tensor | tuple[Tensor, ...]]] = {
    "forward": heads_forward, "backward": heads_backward}
_COMPILED: dict[str, Callable[..., Tensor | tuple[Tensor, ...]]] = {}
_compile_error: str | None = None


def _run_kernel(name: str, mode: str, *args: Tensor):
    """Run kernel ``name`` ("forward" or "backward") compiled.

    If compiling fails (no C++ compiler on CPU, no Triton on GPU), ``mode="auto"`` warns once,
    runs this call eagerly and records the failure, so later calls take the layer-stack path;
    ``mode="compiled"`` raises.
    """
    global _compile_error
    if name not in _COMPILED:  # one symbolic-shape graph serves every block size and batch
        _COMPILED[name] = torch.compile(_EAGER[name], dynamic=True)
    try:
        return _COMPILED[name](*args)
    except Exception as e:  # torch.compile's failures have no common base class
        if mode == "compiled":
            raise RuntimeError(f"model.head_kernel='compiled' but torch.compile failed here "
                               f"({type(e).__name__}: {e}); use model.head_kernel=auto or "
                               "eager") from e
        _compile_error = f"{type(e).__name__}: {e}"
        log.warning("torch.compile failed (%s); value heads run eagerly (same math, slower). "
                    "Set model.head_kernel=eager to skip the attempt.", _compile_error)
        return _EAGER[name](*args)


class _DepthOneHeads(torch.autograd.Function):
    """All K depth-1 heads (f + alpha * p) on all A actions, blocked and fused, by hand.

    Inputs: h [N, D]; for f and then the frozen prior p (whose three may be None when alpha = 0):
    the first layer's latent rows [K, D, H], its action rows plus bias [K, A, H] and the output
    weights [K, H] (the prior's times alpha). Output: [N, K, A] without the output bias. Only h
    and f's tensors get gradients. Nothing of size N x K x A x H is kept for backward: only the
    pre-activations z = h @ W1[:D] of f and p (N x P x K x H, A times smaller), made by one
    matmul over all rows (:data:`KEEP_PREACTIVATIONS`).
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, h: Tensor, first_f: Tensor, rows_f: Tensor, out_f: Tensor,
                first_p: Tensor | None, rows_p: Tensor | None, out_p: Tensor | None,
                mode: str) -> Tensor:
        N, D = h.shape
        K, _, H = first_f.shape
        A = rows_f.shape[1]
        parts = [(first_f, rows_f, out_f)] + ([(first_p, rows_p, out_p)] if first_p is not None
                                              else [])
        P = len(parts)
        weight = torch.stack([w.permute(1, 0, 2) for w, _, _ in parts], 1)  # (D, P, K, H)
        weight = weight.reshape(D, P * K * H)
        rows = torch.stack([r for _, r, _ in parts])  # (P, K, A, H)
        out = torch.stack([o for _, _, o in parts])  # (P, K, H)
        q = h.new_empty(N, K, A)
        kept = [h @ weight] if KEEP_PREACTIVATIONS else []  # (N, P*K*H) for backward
        for i in range(0, N, FUSED_BLOCK):
            z = kept[0][i:i + FUSED_BLOCK] if kept else h[i:i + FUSED_BLOCK] @ weight
            z = z.view(-1, P, K, H)  # (n, P, K, H)
            q[i:i + FUSED_BLOCK] = _run_kernel("forward", mode, z, rows, out)  # (n, K, A)
        ctx.save_for_backward(h, weight, rows, out, *kept)
        ctx.mode = mode
        return q

    @staticmethod
    @once_differentiable
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad: Tensor):
        h, weight, rows, out, *kept = ctx.saved_tensors
        N, D = h.shape
        P, K, A, H = rows.shape
        grad = grad.contiguous()  # (N, K, A)
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        grad_first = h.new_zeros(D, K * H, dtype=out.dtype)  # f's columns of weight
        sum_s = h.new_zeros(K, A, H, dtype=out.dtype)  # sum_n s[:, 0]
        grad_out = h.new_zeros(K, H, dtype=out.dtype)
        for i in range(0, N, FUSED_BLOCK):
            hb = h[i:i + FUSED_BLOCK]  # (n, D)
            z = kept[0][i:i + FUSED_BLOCK] if kept else hb @ weight  # as in forward
            z = z.view(-1, P, K, H)  # (n, P, K, H)
            grad_z, s_b, out_b = _run_kernel("backward", ctx.mode, z, rows, out,
                                             grad[i:i + FUSED_BLOCK])
            grad_z = grad_z.view(-1, P * K * H)  # (n, P*K*H)
            if grad_h is not None:
                grad_h[i:i + FUSED_BLOCK] = grad_z @ weight.T  # (n, D)
            grad_first += hb.T @ grad_z[:, :K * H]  # (D, K*H): f's part only
            sum_s += s_b
            grad_out += out_b
        grad_out += (rows[0] * sum_s).sum(1)  # (K, H)
        grad_first = grad_first.view(D, K, H).permute(1, 0, 2)  # (K, D, H)
        return (grad_h, grad_first, sum_s * out[0][:, None, :], grad_out,
                None, None, None, None)


def ensemble_mean_std(q: Tensor) -> tuple[Tensor, Tensor]:
    """(mean, unbiased std) over the heads axis of q [..., K, A]: each [..., A].

    The std is sqrt(sum_k (q_k - mean)^2 / (K - 1)), two passes over q: the same value as
    ``q.std(-2)`` up to rounding, and 6x faster on the CPU at the small bandit's size, where
    torch's reduction over a middle axis of length K = 7 cost 8% of a SPICE training step.
    """
    mean = q.mean(-2)  # (..., A)
    var = (q - mean.unsqueeze(-2)).square().sum(-2) / (q.shape[-2] - 1)  # (..., A)
    return mean, var.sqrt()


class EnsembleMLP(nn.Module):
    """K independent MLPs [D + A] -> hidden^depth -> 1 with K on the leading axis of every weight.

    Weights are ``weight_i`` [K, in, out] and ``bias_i`` [K, 1, out], initialised like
    ``nn.Linear`` (U(-1/sqrt(in), 1/sqrt(in))), independently per head. ``frozen`` stores them as
    buffers instead of parameters.
    """

    def __init__(
        self,
        ensemble_size: int,
        dims: tuple[int, ...],
        frozen: bool,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.ensemble_size = ensemble_size
        self.dims = dims
        for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            bound = 1.0 / math.sqrt(d_in)
            w = torch.empty(ensemble_size, d_in, d_out).uniform_(-bound, bound, generator=generator)
            b = torch.empty(ensemble_size, 1, d_out).uniform_(-bound, bound, generator=generator)
            if frozen:
                self.register_buffer(f"weight_{i}", w)
                self.register_buffer(f"bias_{i}", b)
            else:
                self.register_parameter(f"weight_{i}", nn.Parameter(w))
                self.register_parameter(f"bias_{i}", nn.Parameter(b))

    @property
    def num_layers(self) -> int:
        """Linear layers (depth + 1)."""
        return len(self.dims) - 1

    def layer(self, i: int) -> tuple[Tensor, Tensor]:
        """(weight [K, in, out], bias [K, 1, out]) of layer i."""
        return getattr(self, f"weight_{i}"), getattr(self, f"bias_{i}")

    def forward(self, h: Tensor, num_actions: int) -> Tensor:
        """All heads on every action.

        Args:
            h: [N, D] latents.
            num_actions: A; the first layer's input is [h; onehot(a)] of width D + A.

        Returns:
            [K, N, A] head outputs.
        """
        N, D = h.shape
        K, A = self.ensemble_size, num_actions
        w, b = self.layer(0)  # (K, D + A, H0), (K, 1, H0)
        x = torch.matmul(h, w[:, :D])  # (K, N, H0): broadcast (N, D) @ (K, D, H0)
        action_rows = w[:, D:] + b  # (K, A, H0): onehot(a) @ W[D:] plus the bias, small
        # The (K, N, A, H0) activations are the ensemble's largest tensors: one add and an
        # in-place ReLU keep it to two passes over them (add's backward needs no output).
        x = torch.add(x.unsqueeze(2), action_rows.unsqueeze(1)).relu_()  # (K, N, A, H0)
        x = x.view(K, N * A, -1)  # (K, N*A, H0); ReLU above, not on this view (no CopySlices)
        for i in range(1, self.num_layers):
            w, b = self.layer(i)
            x = torch.baddbmm(b, x, w)  # (K, N*A, H_i)
            if i < self.num_layers - 1:
                x.relu_()
        return x.view(K, N, A)  # (K, N, A): last width is 1


class ValueEnsemble(nn.Module):
    """Q_k(a | h) = f_k([h; onehot(a)]) + alpha * p_k([h; onehot(a)]) for k = 1..K.

    Args:
        in_dim: D, the latent width.
        num_actions: A.
        ensemble_size: K.
        hidden: hidden width of each head's MLP.
        prior_scale: alpha.
        depth: hidden layers per head.
        generator: optional RNG for f's and p's init (default: torch's global RNG).
        kernel: one of :data:`HEAD_KERNELS` (``ModelConfig.head_kernel``): "compiled" always
            takes the fused path (depth 1), "eager" never, "auto" for >= COMPILE_MIN_ROWS rows
            while torch.compile works. An attribute, so it can be switched after loading.
    """

    def __init__(
        self,
        in_dim: int,
        num_actions: int,
        ensemble_size: int,
        hidden: int,
        prior_scale: float,
        depth: int = HEAD_DEPTH,
        generator: torch.Generator | None = None,
        kernel: str = "auto",
    ) -> None:
        super().__init__()
        if kernel not in HEAD_KERNELS:
            raise ValueError(f"kernel={kernel!r} is invalid: one of {', '.join(HEAD_KERNELS)}")
        self.in_dim = in_dim
        self.num_actions = num_actions
        self.ensemble_size = ensemble_size
        self.prior_scale = prior_scale
        self.kernel = kernel
        dims = (in_dim + num_actions, *([hidden] * depth), 1)
        self.f = EnsembleMLP(ensemble_size, dims, frozen=False, generator=generator)
        self.prior = EnsembleMLP(ensemble_size, dims, frozen=True, generator=generator)
        for name, p in self.f.named_parameters():  # anchors phi0 = f's initial weights
            self.register_buffer(f"anchor_{name}", p.detach().clone())

    def forward(self, h: Tensor) -> Tensor:
        """Q of every head and action: [..., D] -> [..., K, A].

        Depth-1 heads take the fused path (:class:`_DepthOneHeads`) as ``kernel`` says. The
        layer stack runs in blocks of :data:`ROW_BLOCK` rows: its (K, rows, A, hidden)
        activations are the largest tensors of a SPICE step, hundreds of MB at B x T = 32k rows
        unblocked. Neither path loops over heads or actions.
        """
        lead = h.shape[:-1]
        flat = h.reshape(-1, self.in_dim)  # (N, D)
        fused = self.kernel == "compiled" or (
            self.kernel == "auto" and flat.shape[0] >= COMPILE_MIN_ROWS and not _compile_error)
        if fused and self.f.num_layers == 2:
            q = self._fused(flat)  # (N, K, A)
        else:
            blocks = [self._rows(flat[i:i + ROW_BLOCK])
                      for i in range(0, flat.shape[0], ROW_BLOCK)]
            q = blocks[0] if len(blocks) == 1 else torch.cat(blocks, 1)  # (K, N, A)
            q = q.permute(1, 0, 2)  # (N, K, A)
        return q.reshape(*lead, self.ensemble_size, self.num_actions)

    def _fused(self, flat: Tensor) -> Tensor:
        """[N, D] -> [N, K, A] for depth-1 heads, f plus the scaled frozen prior."""
        D = self.in_dim
        w1, b1 = self.f.layer(0)  # (K, D + A, H), (K, 1, H)
        w2, b2 = self.f.layer(1)  # (K, H, 1), (K, 1, 1)
        args: list[Tensor | None] = [w1[:, :D], w1[:, D:] + b1, w2[..., 0]]
        bias = b2.view(-1, 1)  # (K, 1)
        if self.prior_scale != 0.0:
            pw1, pb1 = self.prior.layer(0)
            pw2, pb2 = self.prior.layer(1)
            args += [pw1[:, :D], pw1[:, D:] + pb1, self.prior_scale * pw2[..., 0]]
            bias = bias + self.prior_scale * pb2.view(-1, 1)
        else:
            args += [None, None, None]
        return _DepthOneHeads.apply(flat, *args, self.kernel) + bias  # (N, K, A)

    def _rows(self, flat: Tensor) -> Tensor:
        """[N, D] -> [K, N, A]: f plus the scaled frozen prior (generic path)."""
        q = self.f(flat, self.num_actions)  # (K, N, A)
        if self.prior_scale != 0.0:
            q = q + self.prior_scale * self.prior(flat, self.num_actions)  # (K, N, A)
        return q

    def anchor_loss(self) -> Tensor:
        """L_anchor = sum_k sum_j ||phi_kj - phi0_kj||^2 over all of f's weights and biases."""
        terms = [((p - getattr(self, f"anchor_{name}")) ** 2).sum()
                 for name, p in self.f.named_parameters()]
        return torch.stack(terms).sum()
