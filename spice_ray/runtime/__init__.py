"""How a run starts and what it reports: the entry points' shared start-up (``cli``: lock, sizes,
log routing, Ray), the resource checks and estimates (``resources``), the experiment
trackers (``tracking``) and how Ray Tune is run (``tune_engine``: the tuning stage's grid and
the sweeps build and fit their Tuner there). Above ``config``, ``envs``, ``data`` and
``model`` (the size estimates build a model); below ``train``, ``study`` and ``sweep``. This
``__init__`` imports nothing.
"""
