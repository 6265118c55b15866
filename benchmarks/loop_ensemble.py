"""The slow obvious value ensemble the vectorised one is checked against (tests) and timed
against (benchmarks): not library code."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from spice_ray.model.ensemble import HEAD_DEPTH, ValueEnsemble


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
                total = total + ((p - p0.to(p.device)) ** 2).sum()
        return total
