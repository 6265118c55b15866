"""Batched, pure environments (numpy): Gaussian bandits and the Darkroom gridworld."""

from spice_ray.envs import bandit, darkroom

__all__ = ["bandit", "darkroom"]
