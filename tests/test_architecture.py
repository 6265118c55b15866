"""The shape of the code: imports flow one way, kernels stay free of Ray, rooms stay small, and
nothing above ``envs/`` branches on an environment's name (it asks the registry)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from spice_ray import envs

PACKAGE = Path(__file__).resolve().parents[1] / "spice_ray"
MAX_LINES = 450
KERNELS = ("envs/", "fusion/", "model/", "train/losses.py", "agents/classical.py", "rng.py",
           "artifacts.py", "errors.py")
"""Numerical kernels and plain-file helpers: unit-testable without Ray."""
NAME_COMPARISONS_ALLOWED = ("envs/", "config/presets.py")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every module name imported anywhere in the file (top level or inside functions).

    ``from pkg import sub`` of a submodule counts as importing ``pkg.sub`` only: the package's
    own imports are its own edges (its lazy ``__getattr__`` imports run on first use)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = {f"{node.module}.{alias.name}" for alias in node.names}
            found |= names
            if not names <= modules:
                found.add(node.module)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        deps = set()
        for imp in _imports(path, set(mods)):
            while imp and imp not in mods:
                imp = imp.rpartition(".")[0]
            if imp and imp != name:
                deps.add(imp)
        graph[name] = deps
    return graph


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def test_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in graph[node]:
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node)


def test_kernels_do_not_import_ray() -> None:
    for path in _modules().values():
        if _rel(path).startswith(KERNELS):
            assert not any(i == "ray" or i.startswith("ray.") for i in _imports(path, set())), (
                f"{_rel(path)} is a numerical kernel but imports ray")


def test_no_module_over_the_line_limit() -> None:
    long = {_rel(p): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_environment_names_are_compared_only_in_envs_and_presets() -> None:
    names = set(envs.names())
    found = []
    for path in PACKAGE.rglob("*.py"):
        if _rel(path).startswith(NAME_COMPARISONS_ALLOWED):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            literals = {c.value for o in operands for c in ast.walk(o)
                        if isinstance(c, ast.Constant) and isinstance(c.value, str)}
            if literals & names:
                found.append(f"{_rel(path)}:{node.lineno}")
    assert not found, f"environment names compared outside envs/: {found}"


def test_every_registered_environment_is_complete() -> None:
    """Each registered environment runs the protocol end to end on a few tasks."""
    import numpy as np

    from spice_ray.config import make_config
    from spice_ray.data.tasks import generate_tasks
    from spice_ray.model.tokens import make_tokens

    for name in envs.names():
        cfg = make_config("smoke", name)
        env = cfg.environment()
        data = generate_tasks(cfg.env, cfg.data, "eval", np.arange(3))
        assert [c.name for c in env.columns()][0] == "task_id"
        assert set(data) == {c.name for c in env.columns()}
        tokens = make_tokens(data, env)
        assert tokens.states.shape == (3, env.horizon, env.state_dim)
        tasks = env.eval_tasks(data)
        states = env.reset(tasks)
        actions = env.optimal_action(tasks, states)
        nxt, rewards = env.step(tasks, states, actions, np.zeros(3))
        assert nxt.shape == states.shape and rewards.shape == (3,)
        for reading in env.regret_readings:
            regret = env.regret(tasks, states[:, None], actions[:, None], rewards[:, None], 1,
                                reading)
            assert regret.shape == (3, 1) and np.isfinite(regret).all()
