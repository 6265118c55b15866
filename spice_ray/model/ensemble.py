"""K-head value ensemble with randomised priors and anchoring, as one vectorised layer stack.

Head k reads [h; onehot(a)] and returns Q_k(a) = f_k(.) + alpha * p_k(.) (paper app. "Randomised
priors and anchoring"): f_k is a trainable MLP, p_k a frozen random MLP of the same shape. Every
layer holds all K heads on the leading axis (weight [K, in, out], bias [K, 1, out], as in CORL's
EDAC), so a forward is a few batched matmuls, not a Python loop over heads.

All A actions are evaluated at once without building the [h; onehot(a)] inputs: the first layer
splits as [h; onehot(a)] @ W = h @ W[:D] + W[D + a], i.e. one matmul over the latents plus a
broadcast add of the action rows.

The frozen prior weights and the anchors phi0 (f's initial weights) are registered buffers, so
they travel with ``state_dict`` and ``.to()`` but are not parameters: no optimizer updates them.
``LoopEnsemble`` is the slow obvious reference (K separate ``nn.Sequential`` heads, one call per
head and action), built from a vectorised ensemble for tests and benchmarks.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

HEAD_DEPTH = 1
"""Default hidden layers of each value head's MLP (f_k and p_k): in -> hidden -> 1
(``ModelConfig.head_depth``). With one hidden layer the action split of the first layer saves
most of the work: per row, D*H + 2*A*H multiply-adds instead of A*((D + A)*H + H)."""


ROW_BLOCK = 2048
"""Rows of latents per ensemble block (see :meth:`ValueEnsemble.forward`)."""


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
    ) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.num_actions = num_actions
        self.ensemble_size = ensemble_size
        self.prior_scale = prior_scale
        dims = (in_dim + num_actions, *([hidden] * depth), 1)
        self.f = EnsembleMLP(ensemble_size, dims, frozen=False, generator=generator)
        self.prior = EnsembleMLP(ensemble_size, dims, frozen=True, generator=generator)
        for name, p in self.f.named_parameters():  # anchors phi0 = f's initial weights
            self.register_buffer(f"anchor_{name}", p.detach().clone())

    def forward(self, h: Tensor) -> Tensor:
        """Q of every head and action: [..., D] -> [..., K, A].

        Rows are processed in blocks of :data:`ROW_BLOCK`: the (K, rows, A, hidden)
        activations are the largest tensors of a SPICE step, and at B x T = 32k rows they
        would be hundreds of MB; cache-sized blocks ran the paper-size ensemble 2.7x faster
        on CPU (fwd + bwd, 2 threads). Still no loop over heads or actions.
        """
        lead = h.shape[:-1]
        flat = h.reshape(-1, self.in_dim)  # (N, D)
        blocks = [self._rows(flat[i:i + ROW_BLOCK]) for i in range(0, flat.shape[0], ROW_BLOCK)]
        q = blocks[0] if len(blocks) == 1 else torch.cat(blocks, 1)  # (K, N, A)
        return q.permute(1, 0, 2).reshape(*lead, self.ensemble_size, self.num_actions)

    def _rows(self, flat: Tensor) -> Tensor:
        """[N, D] -> [K, N, A]: f plus the scaled frozen prior."""
        q = self.f(flat, self.num_actions)  # (K, N, A)
        if self.prior_scale != 0.0:
            q = q + self.prior_scale * self.prior(flat, self.num_actions)  # (K, N, A)
        return q

    def anchor_loss(self) -> Tensor:
        """L_anchor = sum_k sum_j ||phi_kj - phi0_kj||^2 over all of f's weights and biases."""
        terms = [((p - getattr(self, f"anchor_{name}")) ** 2).sum()
                 for name, p in self.f.named_parameters()]
        return torch.stack(terms).sum()


class LoopEnsemble(nn.Module):
    """Reference ensemble: K separate ``nn.Sequential`` heads, called once per head and action.

    Same function as :class:`ValueEnsemble`; build it with :meth:`from_vectorised`.
    """

    def __init__(
        self, in_dim: int, num_actions: int, ensemble_size: int, hidden: int, prior_scale: float,
        depth: int = HEAD_DEPTH,
    ) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.num_actions = num_actions
        self.ensemble_size = ensemble_size
        self.prior_scale = prior_scale
        dims = (in_dim + num_actions, *([hidden] * depth), 1)

        def mlp() -> nn.Sequential:
            layers: list[nn.Module] = []
            for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
                if i > 0:
                    layers.append(nn.ReLU())
                layers.append(nn.Linear(d_in, d_out))
            return nn.Sequential(*layers)

        self.f = nn.ModuleList(mlp() for _ in range(ensemble_size))
        self.prior = nn.ModuleList(mlp() for _ in range(ensemble_size))
        self.prior.requires_grad_(False)
        self.anchors: list[list[Tensor]] = [[p.detach().clone() for p in f.parameters()]
                                            for f in self.f]

    @classmethod
    def from_vectorised(cls, ens: ValueEnsemble) -> LoopEnsemble:
        """A loop ensemble with exactly ``ens``'s weights, priors and anchors."""
        depth = ens.f.num_layers - 1
        hidden = ens.f.dims[1]
        loop = cls(ens.in_dim, ens.num_actions, ens.ensemble_size, hidden, ens.prior_scale, depth)
        loop.to(ens.f.weight_0.device, ens.f.weight_0.dtype)
        with torch.no_grad():
            for src, dst in ((ens.f, loop.f), (ens.prior, loop.prior)):
                for k in range(ens.ensemble_size):
                    linears = [m for m in dst[k] if isinstance(m, nn.Linear)]
                    for i, lin in enumerate(linears):
                        w, b = src.layer(i)
                        lin.weight.copy_(w[k].T)  # nn.Linear stores (out, in)
                        lin.bias.copy_(b[k, 0])
            for k in range(ens.ensemble_size):
                loop.anchors[k] = []
                for i in range(ens.f.num_layers):
                    loop.anchors[k].append(getattr(ens, f"anchor_weight_{i}")[k].T.clone())
                    loop.anchors[k].append(getattr(ens, f"anchor_bias_{i}")[k, 0].clone())
        return loop

    def forward(self, h: Tensor) -> Tensor:
        """[..., D] -> [..., K, A], one head and one action at a time."""
        eye = torch.eye(self.num_actions, dtype=h.dtype, device=h.device)  # (A, A)
        per_head = []
        for k in range(self.ensemble_size):
            per_action = []
            for a in range(self.num_actions):
                x = torch.cat([h, eye[a].expand(*h.shape[:-1], -1)], -1)  # (..., D + A)
                q = self.f[k](x) + self.prior_scale * self.prior[k](x)  # (..., 1)
                per_action.append(q.squeeze(-1))
            per_head.append(torch.stack(per_action, -1))  # (..., A)
        return torch.stack(per_head, -2)  # (..., K, A)

    def anchor_loss(self) -> Tensor:
        """Same as :meth:`ValueEnsemble.anchor_loss`, one tensor at a time."""
        total = torch.zeros((), dtype=self.f[0][0].weight.dtype, device=self.f[0][0].weight.device)
        for f, anchors in zip(self.f, self.anchors, strict=True):
            for p, p0 in zip(f.parameters(), anchors, strict=True):
                total = total + ((p - p0) ** 2).sum()
        return total
