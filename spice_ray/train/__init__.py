"""Training: pure losses (``losses``); the step loop and Ray Train driver live beside them."""

from spice_ray.train.losses import dpt_loss, spice_loss

__all__ = ["dpt_loss", "spice_loss"]
