"""Learning kernels: token featurisation, GPT-2 trunk with KV cache, value ensemble, models."""

from spice_ray.model.dpt import DptModel, DptOutput
from spice_ray.model.ensemble import ValueEnsemble
from spice_ray.model.spice import SpiceModel, SpiceOutput, align_to_transitions
from spice_ray.model.tokens import Tokens, make_tokens
from spice_ray.model.trunk import KVCache, Trunk, TrunkModel

__all__ = [
    "DptModel",
    "DptOutput",
    "KVCache",
    "SpiceModel",
    "SpiceOutput",
    "Tokens",
    "Trunk",
    "TrunkModel",
    "ValueEnsemble",
    "align_to_transitions",
    "make_tokens",
]
