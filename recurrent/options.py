"""Command-line options shared by the project's commands: argument types, and option files.

The argument types refuse a count given as 0 or a negative number in argparse (exit 2, naming the option) instead
of replacing it by a default or failing later with a traceback. Option files are YAML (or JSON) files whose keys
are a command's long flags, read with the line of every key so that an error names the file, the line and the
key: the one reader of the evaluation harness's ``--config`` and model table (``taskutils.memory_eval``) and the
server's ``--config`` and ``--agent-config`` (``python -m taskutils.endpoint``; an agent's config fields, checked
against its config class).
"""

from __future__ import annotations

import argparse
import difflib
import math
from pathlib import Path
from typing import Any

import yaml

from recurrent.interface import WorkflowRegistration, field_types, fits_type, type_name


def positive_int(text: str) -> int:
    """An integer >= 1 (a count or a size)."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (where 0 has a meaning of its own, such as 'no cap')."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def seconds(text: str) -> float:
    """A duration in seconds, finite and >= 0 (where 0 may mean 'no limit'; an infinite wait is no limit too, and
    would reach a timer as a value it cannot take)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {text}")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return value


def port(text: str) -> int:
    """A TCP port to listen on, 1-65535 (past that the server would stop at start-up, after loading its model)."""
    value = _int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port in 1-65535, got {text}")
    return value


def positive_seconds(text: str) -> float:
    """A time limit in seconds that has no 'no limit' value: finite and > 0 (a request timeout of 0 or NaN would
    fail every request, after the run had started)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


# A config file's values (keys, scalars, lists, mappings) with its aliases expanded: the largest of the project's
# model tables holds a few hundred.
MAX_YAML_VALUES = 100_000


class ConfigError(ValueError):
    """A config file that cannot be used as it is; the message names the file, the line and the field."""


def read_yaml(path: str | Path) -> tuple[Any, yaml.Node | None]:
    """The data of a YAML (or JSON) file and its node tree, whose marks give the line of every key and value.
    A syntax error raises :class:`ConfigError` at the parser's line and column."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_expansion(node, path)  # before anything is built from it
        data = loader.construct_document(node) if node is not None else None
    except RecursionError:  # the composer recurses once per level
        raise ConfigError(f"{path}: not read: its values nest too deep") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where_ = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where_}: not valid YAML ({err.problem or err.context})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from None
    finally:
        loader.dispose()
    return data, node


def check_yaml(path: str | Path) -> None:
    """Raise :class:`ConfigError` unless the YAML file ``path`` is one :func:`read_yaml` reads: a file that another
    library then loads (a run config that Hydra composes, a config OmegaConf reads) is checked here first, so that an
    alias bomb is one line, not a hang."""
    read_yaml(path)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_expansion(root: yaml.Node, path: Path) -> None:
    """Refuse a YAML document whose values, its aliases expanded, number over :data:`MAX_YAML_VALUES` (an alias
    bomb: nine aliases of nine aliases of ... grow to billions) or that holds itself through an alias. A node's
    expanded size is counted once, however many aliases name it: linear in the file's own nodes."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            if sizes[key] > MAX_YAML_VALUES:
                raise ConfigError(
                    f"{where(path, node)}: not read: with its aliases (*name) expanded it holds over "
                    f"{MAX_YAML_VALUES:,} values; write the values out"
                )
        elif key in open_nodes:
            raise ConfigError(f"{where(path, node)}: not read: an alias (*name) names a value that holds it")
        elif key not in sizes:
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in _children(node) if id(child) not in sizes)


def where(path: str | Path, node: yaml.Node | None) -> str:
    """``file:line`` of a node (the file alone without one)."""
    return f"{path}:{node.start_mark.line + 1}" if node is not None else str(path)


def key_nodes(node: yaml.Node | None) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    """``key -> (key node, value node)`` of a mapping node ({} for anything else)."""
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {str(k.value): (k, v) for k, v in node.value}


def option_value(action: argparse.Action, value: Any) -> Any:
    """A config-file value as its flag would give it: through the flag's type (a YAML list joined by commas for
    the list options), true/false for a switch, one of the flag's choices."""
    if value is None:
        return None  # the flag's own default
    if action.nargs == 0:  # --trace, --quiet, ...
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false, got {value!r}")
        return value
    if isinstance(value, dict):
        raise ValueError(f"must be a single value or a list, got a mapping {value!r}")
    text = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
    converted = action.type(text) if action.type is not None else text
    if action.choices is not None and converted not in action.choices:
        raise ValueError(f"must be one of {', '.join(map(str, action.choices))}, got {value!r}")
    return converted


def config_defaults(parser: argparse.ArgumentParser, path: Path) -> dict[str, Any]:
    """The defaults a ``--config`` file sets for ``parser`` (keys as the long flags, with - or _):
    :class:`ConfigError` names the file, the line and the key of the first one that is wrong."""
    data, node = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where(path, node)}: expected a mapping of options (limit: 16, ...), got {data!r}")
    nodes = key_nodes(node)
    flags = {a.dest: a for a in parser._actions if a.option_strings and a.dest not in ("help", "config")}
    defaults = {}
    for key, value in data.items():
        at = where(path, nodes.get(str(key), (node,))[0])
        action = flags.get(str(key).replace("-", "_"))
        if action is None:
            names = sorted(dest.replace("_", "-") for dest in flags)
            close = difflib.get_close_matches(str(key).replace("_", "-"), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{at}: unknown option {key!r}{hint}; options: {', '.join(names)}")
        try:
            defaults[action.dest] = option_value(action, value)
        except (ValueError, TypeError, argparse.ArgumentTypeError) as err:
            raise ConfigError(f"{at}: option {key!r}: {err}") from None
    return defaults


def parse_with_config(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args(argv)`` where a ``--config FILE`` option sets the defaults: flags on the command line
    still win. A bad file stops with the parser's usage error (exit 2) naming its file, line and key."""
    pre, _ = parser.parse_known_args(argv)
    if getattr(pre, "config", None):
        try:
            parser.set_defaults(**config_defaults(parser, pre.config))
        except (ConfigError, OSError) as err:
            parser.error(str(err))
    return parser.parse_args(argv)


def agent_config(register: WorkflowRegistration, path: str | Path) -> dict[str, Any]:
    """The fields of an agent's config in a YAML (or JSON) file, checked against its config class: an unknown key,
    a value of the wrong type, or one the class refuses raises :class:`ConfigError` naming the file, the line, the
    key and the value."""
    data, node = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where(path, node)}: expected a mapping of {register.config_cls.__name__} fields, got {data!r}"
        )
    nodes = key_nodes(node)
    hints = field_types(register.config_cls)
    known = sorted(f for f in register.config_cls.__dataclass_fields__)
    for key, value in data.items():
        at = where(path, nodes.get(str(key), (node,))[0])
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"{at}: agent {register.name!r} ({register.config_cls.__name__}) has no setting {key!r}{hint}; "
                f"its settings: {', '.join(known) or 'none'}"
            )
        if key in hints and not fits_type(value, hints[key]):
            raise ConfigError(f"{at}: {key}: {value!r} is not of type {type_name(hints[key])}")
    try:
        register.make_config(data)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{path}: {err}") from None
    return dict(data)
