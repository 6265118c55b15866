"""The one base class of errors whose message is written for the user.

Entry points (``spice_ray.cli.run_main``) print such an error as one line, ``error: <message>``,
and exit with status 1, with no traceback: the message names the file, field or value at fault
and what to do. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class SpiceRayError(Exception):
    """A failure explained by its message (bad input, corrupt file, diverged training, ...)."""
