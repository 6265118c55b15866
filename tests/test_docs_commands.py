"""Every command line of the repository's scripts that the README and docs/usage.md show runs as
written up to its first unit of work: its flags, presets, experiments and ``--set`` keys are
valid, and nothing is written (``stop_before_run`` of ``spice_ray.common.faults``; the query
commands and table code run on a real run in ``tests/test_full_run.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from docs_blocks import DOCS, ROOT, example_plugin_env, script_commands

from spice_ray.common.faults import FAULT_ENV, STOPPED, fault_switch

RUNNER = """
import contextlib, io, json, runpy, sys
results = []
for argv in json.loads(sys.argv[1]):
    sys.argv = list(argv)
    out = io.StringIO()
    code = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            runpy.run_path(argv[0], run_name="__main__")
        except SystemExit as exc:
            code = exc.code
    results.append({"argv": argv, "code": code, "out": out.getvalue()[-2000:]})
print(json.dumps(results))
"""


def _in(tmp: Path, args: list[str]) -> list[str]:
    """``args`` with every absolute path (a documented run directory) moved under ``tmp``, and
    the repository's files they name (``--config configs/...``) found from its root, where the
    documents' commands run."""
    return [str(tmp / a.lstrip("/")) if a.startswith("/") else
            str(ROOT / a) if "/" in a and (ROOT / a).is_file() else a for a in args]


def test_every_documented_script_command_resolves_and_writes_nothing(tmp_path,
                                                                      tmp_path_factory) -> None:
    commands = list(dict.fromkeys(tuple(c) for doc in DOCS for c in script_commands(doc)))
    assert len(commands) >= 12  # the scan finds them: full_run, sweeps, pipelines
    assert {Path(c[0]).name for c in commands} >= {
        "full_run.py", "confirm.py", "scaling.py", "generate_data.py", "pretrain.py",
        "kernel_beta.py", "fusion_noise.py", "ensemble_size.py", "weight_ablation.py"}
    argvs = [[str(ROOT / c[0]), *_in(tmp_path, list(c[1:]))] for c in commands]
    # with the README's example plugin installed, as its extending section has it
    plugin = example_plugin_env(tmp_path_factory.mktemp("plugin") / "site")
    env = {**plugin, FAULT_ENV: fault_switch(stop_before_run=True),
           "PYTHONPATH": os.pathsep.join([str(ROOT), plugin["PYTHONPATH"]])}
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(argvs)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    failed = [f"{' '.join(r['argv'][1:])} ({Path(r['argv'][0]).name}): exit {r['code']}\n"
              f"{r['out']}" for r in results
              if r["code"] not in (0, None) or STOPPED.format(Path(r["argv"][0]).name)
              not in r["out"]]
    assert not failed, "documented commands that do not run as written:\n" + "\n".join(failed)
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a stopped command wrote files"


def test_every_documented_python_one_liner_runs_as_written(tmp_path, tmp_path_factory) -> None:
    """The ``python -c "..."`` lines the README and docs/usage.md show (the plugin's
    epsilon-greedy beside UCB, in process), run as written with the example plugin installed,
    in an empty directory that they leave empty."""
    from docs_blocks import inline_code

    codes = [code for doc in DOCS for code in inline_code(doc)]
    assert any("epsilon-greedy" in code for code in codes), codes
    env = example_plugin_env(tmp_path_factory.mktemp("plugin") / "site")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env["PYTHONPATH"]])
    for code in codes:
        proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{code}\n{proc.stderr[-3000:]}"
        assert proc.stdout.strip(), code  # it printed what it shows
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a one-liner wrote files"
