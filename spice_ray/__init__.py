"""spice-ray: SPICE (Shaping Policies In-Context with Ensemble prior) on Ray."""

__version__ = "0.1.0"
