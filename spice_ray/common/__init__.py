"""What every layer shares and nothing research-specific: errors, keyed randomness, atomic
artifacts with checksums, the console, the run lock, Ray placement labels and a
package's lazily loaded exports (``lazy``).

Nothing here imports the rest of ``spice_ray``; this package's ``__init__`` imports nothing, so
``from spice_ray.common import rng`` loads that one module.
"""
