"""How a run starts and what it reports: the entry points' shared start-up (``cli``: lock, sizes,
log routing, Ray), the resource checks and estimates (``resources``) and the experiment
trackers (``tracking``). Above ``config``, ``envs``, ``data`` and ``model`` (the size estimates
build a model); below ``train``, ``study`` and ``sweep``. This ``__init__`` imports nothing.
"""
