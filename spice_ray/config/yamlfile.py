"""The one place a user's YAML is read (config files, ``--set`` values): parsed within limits
that make hostile input cheap to refuse: size, nesting, alias expansion (a "billion laughs"
bomb), string and number length, and no duplicate keys. A refusal is one line that shows at
most an excerpt of the value (``spice_ray.common.errors.excerpt``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from spice_ray.common.errors import EXCERPT_CHARS, excerpt
from spice_ray.config.sections import ConfigError

MAX_YAML_BYTES = 1 << 20
"""Largest YAML file (or ``--set`` value) read: a config is a few KB."""
MAX_DEPTH = 32
"""Deepest nesting of lists and mappings, aliases expanded (a config nests about 3 deep)."""
MAX_NODES = 10_000
"""Most values (scalars, lists, mappings) in one document with every alias expanded."""
MAX_ALIASES = 100
"""Most alias uses (``*name``) in one document."""
MAX_STRING_CHARS = 10_000
"""Longest string (a path, a label, a shell command in a cluster file)."""
MAX_NUMBER_CHARS = 50
"""Longest number, in characters (Python refuses ints over 4,300 digits with a traceback)."""
MAX_KEY_CHARS = 200
"""Longest ``--set`` key (``section.field``)."""

_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
_MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlLimitError(yaml.YAMLError):
    """A YAML document over one of the limits above, or with a duplicate key (one line)."""


class LimitedLoader(yaml.SafeLoader):
    """A SafeLoader for user input that refuses, while composing (before any value is built),
    documents that would be costly to build, walk or print: nesting deeper than
    :data:`MAX_DEPTH`, more than :data:`MAX_ALIASES` aliases or :data:`MAX_NODES` values once
    aliases are expanded, a recursive alias, a string or number over its length limit, and a
    key given twice in one mapping (YAML would keep the last silently). Merge keys (``<<``)
    still override."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._values = 0  # in the document so far, each alias counting its value's size
        # node -> (values, nesting depth) with aliases expanded; an alias reuses its node's
        self._sizes: dict[yaml.Node, tuple[int, int]] = {}

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        line = event.start_mark.line + 1
        alias = isinstance(event, yaml.AliasEvent)
        if alias:
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise YamlLimitError(f"more than {MAX_ALIASES} aliases (line {line})")
        if self._depth > MAX_DEPTH:
            raise YamlLimitError(f"nested more than {MAX_DEPTH} levels deep (line {line})")
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if alias:
            if node not in self._sizes:
                raise YamlLimitError(f"alias *{_clip(event.anchor, 40)} is used inside the "
                                     f"value it names (line {line}): a recursive value")
            self._values += self._sizes[node][0]
        else:
            self._measure(node, line)
            self._values += 1
        if self._values > MAX_NODES:  # counted as composed: a long list stops early
            raise YamlLimitError(f"more than {MAX_NODES} values with aliases expanded (line "
                                 f"{line}); a config has a few hundred")
        return node

    def _measure(self, node: yaml.Node, line: int) -> None:
        """Record ``node``'s size and depth (its children are measured), refusing it when over
        a limit."""
        if isinstance(node, yaml.ScalarNode):
            number = node.tag in _NUMBER_TAGS
            limit = MAX_NUMBER_CHARS if number else MAX_STRING_CHARS
            if len(node.value) > limit:
                what = "number" if number else "string"
                raise YamlLimitError(f"{excerpt(node.value, 40)} at line {line} is a {what} "
                                     f"over {limit} characters")
            self._sizes[node] = (1, 0)
            return
        children = (node.value if isinstance(node, yaml.SequenceNode)
                    else [n for pair in node.value for n in pair])
        sizes = [self._sizes[c] for c in children]
        values = 1 + sum(v for v, _ in sizes)
        depth = 1 + max((d for _, d in sizes), default=0)
        if depth > MAX_DEPTH:
            raise YamlLimitError(f"nested more than {MAX_DEPTH} levels deep once aliases are "
                                 f"expanded (line {line})")
        self._sizes[node] = (values, depth)

    def compose_mapping_node(self, anchor: str | None) -> yaml.MappingNode:
        node = super().compose_mapping_node(anchor)
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE_TAG:
                continue  # a list or mapping as a key is refused when the value is built
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in first:
                raise YamlLimitError(f"key {excerpt(key, 60)} is given twice (lines "
                                     f"{first[key]} and {line}); keep one")
            first[key] = line
        return node


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line for a PyYAML error (whose own message spans several lines and quotes the
    input)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        context = f"{exc.context}: " if exc.context else ""
        return _clip(f"{context}{exc.problem}") + where
    return _clip(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def _clip(text: str, limit: int = EXCERPT_CHARS + 40) -> str:
    """``text`` (which may quote the user's input) in at most ``limit`` characters."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def parse_yaml(text: str, where: str, error: type[Exception] = ConfigError) -> Any:
    """Parse one YAML document a user wrote, within the limits above: the one place user YAML
    (config files, ``--set`` values) is read.

    Args:
        where: what the text is, to start the message (``config file x.yaml``, ``--set a.b``).
        error: exception class raised.

    Raises:
        error: one line naming ``where``: over a limit, a duplicate key, not valid YAML.
    """
    if len(text) > MAX_YAML_BYTES:
        raise error(f"{where} is over {MAX_YAML_BYTES // 2**20} MiB; a config is a few KB")
    loader = LimitedLoader(text)
    try:
        return loader.get_single_data()
    except YamlLimitError as exc:
        raise error(f"{where} is refused: {exc}") from exc
    except yaml.YAMLError as exc:
        raise error(f"{where} is not valid YAML: {_yaml_problem(exc)}") from exc
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. a date with month 13
        raise error(f"{where} is not valid YAML: {_clip(str(exc))}") from exc
    finally:
        loader.dispose()


def load_yaml(path: str | Path, error: type[Exception] = ConfigError,
              allow_empty: bool = True) -> dict[str, Any]:
    """Read a YAML mapping, with a clear error naming the file.

    Args:
        error: exception class raised for a missing, unparsable, oversized or non-mapping
            file, or one over a limit of :func:`parse_yaml`.
        allow_empty: an empty file is ``{}`` (config overrides) rather than an error.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)  # never more: the path may be /dev/zero
        text = raw.decode("utf-8")
    except FileNotFoundError as exc:
        raise error(f"config file {path} does not exist") from exc
    except IsADirectoryError as exc:
        raise error(f"config file {path} is a directory, not a YAML file") from exc
    except UnicodeDecodeError as exc:
        raise error(f"config file {path} is not UTF-8 text ({exc.reason} at byte "
                    f"{exc.start})") from exc
    except OSError as exc:
        raise error(f"config file {path} cannot be read: {exc.strerror or exc}") from exc
    data = parse_yaml(text, f"config file {path}", error)
    if data is None and allow_empty:
        return {}
    if not isinstance(data, dict):
        raise error(f"config file {path} must hold a mapping, got {type(data).__name__}")
    return data
