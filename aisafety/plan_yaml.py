"""A YAML loader for plans: the YAML 1.2 core schema, duplicate keys refused, no blow-ups.

PyYAML implements YAML 1.1, where ``1e-3`` is a string, ``017`` is octal, ``no`` is
false and ``2024-01-01`` a date; a plan wants YAML 1.2's answers (a float, 17, the string
'no', a string). It also lets a later key silently replace an earlier one, and expands
aliases without limit when the result is walked (a 600-byte "billion laughs" file grows to
gigabytes). This loader keeps PyYAML's safe parser and changes the three things.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, SequenceNode

MAX_NODES = 100_000  # after alias expansion; a real plan has a few hundred


class PlanLoader(yaml.SafeLoader):
    """Safe loading with YAML 1.2 core-schema scalars and checks for duplicates and size."""


PlanLoader.yaml_implicit_resolvers = {}
for tag, pattern, first in (
    ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    (
        "float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+0123456789.",
    ),
):
    PlanLoader.add_implicit_resolver(f"tag:yaml.org,2002:{tag}", re.compile(pattern), list(first))


def _construct_int(loader: PlanLoader, node: Node) -> int:
    text = loader.construct_scalar(node)
    return int(text, 0) if text[:2] in ("0o", "0x") else int(text, 10)  # 017 is 17


def _construct_mapping(loader: PlanLoader, node: MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str | int | float | bool | None):
            raise ConstructorError(
                None, None, f"a key must be a plain value, got {type(key).__name__}",
                key_node.start_mark,
            )  # fmt: skip
        if key in mapping:
            raise ConstructorError(
                "while reading a mapping", node.start_mark,
                f"found the key {key!r} twice; keep one of them", key_node.start_mark,
            )  # fmt: skip
        mapping[key] = loader.construct_object(value_node, deep=True)
    return mapping


PlanLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
PlanLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


class TooLargeError(yaml.YAMLError):
    """The document expands (through aliases) to more nodes than a plan can need."""


def _expanded_size(node: Node, memo: dict[int, int]) -> int:
    """Nodes after alias expansion, counted without expanding (a shared node counts once
    per use, and its size is computed once)."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = MAX_NODES + 1  # a recursive alias expands without end
    if isinstance(node, SequenceNode):
        size = 1 + sum(_expanded_size(child, memo) for child in node.value)
    elif isinstance(node, MappingNode):
        size = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    else:
        size = 1
    memo[id(node)] = min(size, MAX_NODES + 1)
    return memo[id(node)]


def load_yaml(text: str) -> Any:
    """The one document in ``text``; YAMLError (or TooLargeError) when it is not a plan."""
    loader = PlanLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_NODES:
            raise TooLargeError(
                f"the document expands (through aliases) to more than {MAX_NODES:,} values; "
                "a plan needs a few hundred: remove the repeated aliases"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()
