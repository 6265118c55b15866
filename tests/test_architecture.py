"""The shape of the code: imports flow one way, kernels stay free of Ray, rooms stay small, and
nothing above ``envs/`` branches on an environment's name (it asks the registry)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from spice_ray import envs

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "spice_ray"
SCRIPTS = ("pipelines", "sweeps", "benchmarks", "examples")
"""Script folders held to the package's rule on environment names."""
MAX_LINES = 450
KERNELS = ("envs/", "fusion/", "model/", "train/losses.py", "train/value_losses.py",
           "agents/classical.py", "common/rng.py", "common/artifacts.py", "common/errors.py")
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
    """Every module name imported anywhere in the file (top level or inside functions), but
    not under ``if TYPE_CHECKING:`` (never run).

    ``from pkg import sub`` of a submodule counts as importing ``pkg.sub`` only: the package's
    own imports are its own edges (its lazy ``__getattr__`` imports run on first use)."""
    found = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(block.test)
                   for stmt in block.body for n in ast.walk(stmt)}  # never run
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = {f"{node.module}.{alias.name}" for alias in node.names}
            found |= names
            if not names <= modules:
                found.add(node.module)
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> the modules importing it runs: the imported module and, since importing
    ``pkg.sub`` first runs ``pkg/__init__``, every package above it that is not also above the
    importer (those are already being imported when it runs)."""
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        own = {name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1)}
        if path.name == "__init__.py":
            own.add(name)
        deps = set()
        for imp in _imports(path, set(mods)):
            while imp and imp not in mods:
                imp = imp.rpartition(".")[0]
            while imp and imp != name and imp not in own:
                deps.add(imp)
                imp = imp.rpartition(".")[0]
                if imp not in mods:
                    break
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


def test_the_shared_layer_imports_nothing_above_it() -> None:
    """``common`` (errors, randomness, artifacts, console, lock, placement) is the ground floor:
    it imports no other part of the package; ``runtime`` (start-up, resources, trackers) stands
    on ``config`` and ``envs`` and never on what runs inside a run."""
    modules = _modules()
    graph = _graph()
    above_runtime = ("spice_ray.train", "spice_ray.evaluate", "spice_ray.agents",
                     "spice_ray.study", "spice_ray.sweep", "spice_ray.results")
    for name in modules:
        ours = {m for m in graph.get(name, ()) if m.startswith("spice_ray")}
        if name.startswith("spice_ray.common"):
            assert ours <= {m for m in modules if m.startswith("spice_ray.common")} | {
                "spice_ray"}, f"{name} imports {sorted(ours)}"
        if name.startswith("spice_ray.runtime"):
            bad = sorted(m for m in ours if m.startswith(above_runtime))
            assert not bad, f"{name} imports {bad}"


def test_the_numerical_kernels_name_nothing_above_them() -> None:
    """``envs`` and ``fusion`` import only ``common`` and each other, type hints included
    (the fusion reads its settings through a protocol, not the config class)."""
    allowed = ("spice_ray.common", "spice_ray.envs", "spice_ray.fusion")
    for name, path in _modules().items():
        if not name.startswith(("spice_ray.envs", "spice_ray.fusion")):
            continue
        named = {node.module for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module}
        named |= {alias.name for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.Import) for alias in node.names}
        bad = sorted(m for m in named if m.startswith("spice_ray")
                     and not m.startswith(allowed))
        assert not bad, f"{_rel(path)} names {bad}"


def test_kernels_do_not_import_ray() -> None:
    for path in _modules().values():
        if _rel(path).startswith(KERNELS):
            assert not any(i == "ray" or i.startswith("ray.") for i in _imports(path, set())), (
                f"{_rel(path)} is a numerical kernel but imports ray")


def test_no_module_over_the_line_limit() -> None:
    long = {_rel(p): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def _branches_on_a_name(node: ast.AST, names: set[str]) -> bool:
    """A comparison, a subscript (a dict lookup) or a ``match`` case on an environment name."""
    if isinstance(node, ast.Compare):
        parts: list[ast.AST] = [node.left, *node.comparators]
    elif isinstance(node, ast.Subscript):
        parts = [node.slice]
    elif isinstance(node, ast.MatchValue):
        parts = [node.value]
    else:
        return False
    return any(isinstance(c, ast.Constant) and c.value in names
               for p in parts for c in ast.walk(p))


def test_environment_names_are_compared_only_in_envs_and_presets() -> None:
    names = set(envs.names())
    files = [p for p in PACKAGE.rglob("*.py") if not _rel(p).startswith(NAME_COMPARISONS_ALLOWED)]
    files += [p for folder in SCRIPTS for p in (ROOT / folder).rglob("*.py")]
    found = [f"{p.relative_to(ROOT).as_posix()}:{node.lineno}" for p in files
             for node in ast.walk(ast.parse(p.read_text())) if _branches_on_a_name(node, names)]
    assert not found, f"environment names branched on outside envs/: {found}"


def test_the_name_rule_sees_lookups_and_match() -> None:
    code = ast.parse("x = d['bandit']\nmatch e:\n    case 'darkroom': pass\ny = e == 'bandit'")
    hits = [n for n in ast.walk(code) if _branches_on_a_name(n, {"bandit", "darkroom"})]
    assert len(hits) == 3


def test_a_runtime_import_into_a_package_is_an_edge_to_its_init(tmp_path) -> None:
    """Importing ``spice_ray.config.run`` runs ``spice_ray.config/__init__``: the graph has
    the package as well as the module."""
    graph = _graph()
    assert "spice_ray.config" in graph["spice_ray.study.stages"]
    assert "spice_ray.fusion" not in graph["spice_ray.fusion.posterior"]


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


def _typed(values) -> tuple:
    """Values with their types, so (1, 2) threads are not the grid (1.0, 2.0)."""
    return tuple((type(v).__name__, v) for v in values)


def _literal_sequences(path: Path):
    """(line, typed values) of every tuple or list literal of two or more numbers."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) >= 2 and all(
                isinstance(e, ast.Constant) and isinstance(e.value, (int, float))
                and not isinstance(e.value, bool) for e in node.elts):
            yield node.lineno, _typed(e.value for e in node.elts)


def test_every_hyperparameter_grid_is_declared_once() -> None:
    """The tuning grids, the experiments' fixed betas and the sweeps' per-preset grids live in
    ``spice_ray/config/grids.py``; the same numbers written as a literal anywhere else in the
    package or its scripts would be a second home that can drift from the first."""
    from spice_ray.config.grids import FIXED_BETAS, GRIDS

    grids = [g.tuning for g in GRIDS.values()] + [
        v for g in GRIDS.values() for v in g.sweep.values()] + list(FIXED_BETAS.values())
    declared = {_typed(v) for v in grids if len(v) >= 2
                and all(isinstance(x, (int, float)) for x in v)}
    assert len(declared) >= 10  # the scan below has something to find
    home = PACKAGE / "config" / "grids.py"
    found = [f"{path.relative_to(ROOT)}:{line} {values}"
             for path in [*PACKAGE.rglob("*.py"), *(p for d in SCRIPTS
                                                    for p in (ROOT / d).rglob("*.py"))]
             if path != home for line, values in _literal_sequences(path)
             if values in declared]
    assert not found, "grid values written outside spice_ray/config/grids.py:\n" + "\n".join(
        found)
    assert _typed(GRIDS["beta"].tuning) in {v for _, v in _literal_sequences(home)}  # it scans


DEFAULTS = {"beta": "BETA_DEFAULT", "tau": "TAU_DEFAULT", "width_scale": "WIDTH_SCALE_DEFAULT",
            "width_decay": "WIDTH_DECAY_DEFAULT"}
"""The fusion settings whose defaults were restated across the package, and the constant of
``spice_ray.fusion`` that declares each (in rules.py, kernels.py and width.py)."""


def _written_defaults(path: Path, defaults: dict[str, float]) -> Iterator[tuple[int, str]]:
    """Where ``path``'s code writes one of ``defaults`` as a number: a parameter's default, a
    keyword argument, an assignment, a dict entry or a comparison (``beta=1.0``, ``tau: float =
    0.5``, ``"beta": 1.0``, ``width_scale != 1.0``); docstrings and comments are not code."""
    def number(node: ast.AST | None) -> float | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
                and not isinstance(node.value, bool):
            return float(node.value)
        return None

    def named(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            return node.attr
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return None

    for node in ast.walk(ast.parse(path.read_text())):
        pairs: list[tuple[str | None, ast.AST | None]] = []
        if isinstance(node, ast.arguments):
            plain = node.posonlyargs + node.args
            pairs += [(a.arg, d) for a, d in zip(plain[len(plain) - len(node.defaults):],
                                                 node.defaults, strict=True)]
            pairs += [(a.arg, d) for a, d in zip(node.kwonlyargs, node.kw_defaults, strict=True)]
        elif isinstance(node, ast.keyword):
            pairs.append((node.arg, node.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "get" and len(node.args) == 2:
            pairs.append((named(node.args[0]), node.args[1]))  # cfg.get("beta", 1.0)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            pairs += [(named(t), node.value) for t in targets]
        elif isinstance(node, ast.Dict):
            pairs += [(named(k), v) for k, v in zip(node.keys, node.values, strict=True)
                      if k is not None]
        elif isinstance(node, ast.Compare) and all(
                isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):  # not bounds (>= 0)
            sides = [node.left, *node.comparators]
            pairs += [(named(a), b) for a, b in zip(sides, sides[1:], strict=False)]
            pairs += [(named(b), a) for a, b in zip(sides, sides[1:], strict=False)]
        for name, value in pairs:
            if name in defaults and number(value) == defaults[name]:
                yield getattr(value, "lineno", 0), name


def test_every_fusion_default_is_written_once() -> None:
    """beta's, tau's, width_scale's and width_decay's defaults are declared once each, in the
    fusion layer (``BETA_DEFAULT``, ``TAU_DEFAULT``, ``WIDTH_SCALE_DEFAULT``,
    ``WIDTH_DECAY_DEFAULT``); the config and the agents name them. The same number written
    for the same setting anywhere else in the package or its scripts is a second home that can
    drift (the check finds a planted one); a bound (``>= 0``) is not a default."""
    import spice_ray.fusion as fusion
    from spice_ray.config import FusionConfig

    defaults = {name: float(getattr(fusion, const)) for name, const in DEFAULTS.items()}
    assert defaults == {name: float(getattr(FusionConfig, name)) for name in DEFAULTS}
    found = [f"{path.relative_to(ROOT)} {name}"
             for path in [*PACKAGE.rglob("*.py"), *(p for d in SCRIPTS
                                                    for p in (ROOT / d).rglob("*.py"))]
             for line, name in _written_defaults(path, defaults)]
    # the one reader that may not import the fusion layer: the results layer reads a row's
    # width back where the config left it out (at the default); its numbers are checked above
    assert sorted(found) == ["spice_ray/results/analysis.py width_decay",
                             "spice_ray/results/analysis.py width_scale"], \
        "a fusion default written again:\n" + "\n".join(found)
    planted = ROOT / "tests" / "test_architecture.py"  # this file's example below
    assert [name for _, name in _written_defaults(planted, defaults)] == ["beta", "tau"]


def _planted_for_the_check(beta: float = 1.0) -> bool:  # noqa: D401 -- what the scan must find
    return {"tau": 0.5}["tau"] > 0 and beta > 0


def test_settings_columns_are_parsed_only_by_the_schema() -> None:
    """A row's ``config`` (and a sweep row's ``params``) is read through
    ``results.schema.settings_of`` only: every other ``json.loads`` of the package parses a
    file it names (a manifest, an index, a record, a sidecar), listed here by module, so a new
    parser of the settings column shows up as a new module below."""
    parsers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "loads" and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id == "json":
                parsers.add(path.relative_to(PACKAGE).as_posix())
    assert parsers == {
        "results/schema.py",  # the settings column
        "common/artifacts.py", "common/runlock.py", "common/faults.py",  # records, a switch
        "data/store.py",  # dataset specs
        "train/together.py", "study/records.py", "study/run_models.py",  # run files
        "study/tuning.py", "sweep/driver.py",  # the tuning record, a search space
    }, sorted(parsers)
