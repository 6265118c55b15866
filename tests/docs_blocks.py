"""The README's and docs/usage.md's commands and code, as the tests run them.

Each ``python -m spice_ray.results ...`` line of a ```bash block (continuations joined,
comments cut), each ```python block that reads a run's tables and each that loads a run's
policy and plays its Gymnasium environment is run against a smoke
study's directory by ``tests/test_full_run.py``'s end-to-end test, with the documents' run
names mapped to it: a command the docs show that stops working fails the suite. Each
``python pipelines/...`` and ``python sweeps/...`` command (:func:`script_commands`) is run by
``tests/test_docs_commands.py`` up to the point where its arguments and config have resolved
(the ``stop_before_run`` switch of ``spice_ray.common.faults``): its flags, presets, experiments
and ``--set`` keys exist, without the hours the command itself takes; each ``python -c "..."``
line (:func:`inline_code`) runs as written there too.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", ROOT / "docs" / "usage.md")
RUN_NAMES = ("runs/small_seeds345", "runs/small", "runs/other", "/tmp/smoke")
"""The run directories the documents name; each stands for the test's smoke run (a second
run in ``compare A B`` is the same run: A - B is then 0 everywhere)."""
SKIPPED = {"/tmp/s": "a --variant run of the usage page's variant example, made there"}
"""Run names whose commands need another run than the smoke study's, and why."""


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def results_commands(path: Path) -> list[list[str]]:
    """The argument lists (after ``python -m spice_ray.results``) of ``path``'s commands."""
    out = []
    for block in _blocks(path.read_text(), "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if not line.startswith("python -m spice_ray.results"):
                continue
            args = shlex.split(line, comments=True)[3:]
            if any(a in SKIPPED for a in args):
                continue
            out.append(args)
    return out


def inline_code(path: Path) -> list[str]:
    """The code of ``path``'s ``python -c "..."`` lines in its ```bash blocks."""
    out = []
    for block in _blocks(path.read_text(), "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:2] == ["python", "-c"] and len(words) >= 3:
                out.append(words[2])
    return out


def table_code(path: Path) -> list[str]:
    """``path``'s python blocks that read a run's tables (``load(`` / ``summarise(``)."""
    return [b for b in _blocks(path.read_text(), "python")
            if "from spice_ray.results import" in b]


def policy_code(path: Path) -> list[str]:
    """``path``'s python blocks that load a run's policy and play its environment."""
    return [b for b in _blocks(path.read_text(), "python") if "Policy." in b]


def on_run(text: str, run_dir: Path) -> str:
    """``text`` with every documented run name replaced by ``run_dir``."""
    for name in RUN_NAMES:
        text = text.replace(name, str(run_dir))
    return text


def script_commands(path: Path) -> list[list[str]]:
    """``path``'s commands of the repository's scripts (``python pipelines/X.py ...``,
    ``python sweeps/X.py ...``), each as [script, *args]: continuations joined, comments cut,
    and only the script's own part of a line (after ``&&`` or ``--``, before ``&&`` or ``&``)."""
    out = []
    for block in _blocks(path.read_text(), "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            for i, word in enumerate(words[:-1]):
                if word == "python" and re.fullmatch(r"(pipelines|sweeps)/\w+\.py", words[i + 1]):
                    args = []
                    for w in words[i + 2:]:
                        if w in ("&&", "&", "|", ";"):
                            break
                        args.append(w)
                    out.append([words[i + 1], *args])
    return out


PLUGIN_DIR = ROOT / "examples" / "epsilon_greedy"
PLUGIN_MODULE = "spice_ray_epsilon_greedy"


def example_plugin_env(site: Path) -> dict[str, str]:
    """The environment of a process with ``pip install examples/epsilon_greedy`` done, on a
    path of its own: the distribution's metadata with its entry point under ``site`` (the
    module comes from PYTHONPATH), as the README's plugin commands assume it."""
    import os

    from spice_ray.common import plugins

    info = site / "spice_ray_epsilon_greedy-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: spice-ray-epsilon-greedy\n"
                                   "Version: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{plugins.GROUP}]\nepsilon_greedy = {PLUGIN_MODULE}\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site), str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")])}
