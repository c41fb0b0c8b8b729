"""The YAML a spec may be written in: plain data only, bounded before it is built.

A spec holds strings, numbers, booleans, null, lists and mappings, and nothing else. PyYAML's
safe loader also builds bytes (`!!binary`), dates (`!!timestamp`, and any unquoted 2024-01-01),
sets, ordered pairs and omaps: none is a spec value, and bytes were once turned into a model
name by pydantic's lax string coercion. Those tags are refused in one line naming them, as is a
key given twice in one mapping (PyYAML keeps the last one silently, and a spec would then train
with a setting its reader never saw).

Before anything is composed, the document's event stream is walked once without recursion: it
may be nested at most `max_depth` levels (PyYAML's composer recurses, so 1,000 levels ended in a
RecursionError) and expand to at most `max_nodes` nodes once its aliases are counted (a
"billion laughs" document of a few hundred bytes names hundreds of millions).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.error import MarkedYAMLError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_DEPTH = 64  # a real spec nests about 5 levels (sweep.random.space.x.choice)
MAX_NODES = 1_000_000  # after expanding aliases; a real spec has a few hundred
MAX_NUMBER_CHARS = 100  # Python refuses longer integers (4,300 digits) with a ValueError

_TAG = "tag:yaml.org,2002:"
_MERGE = _TAG + "merge"
ALLOWED_TAGS = {_TAG + kind for kind in ("str", "int", "float", "bool", "null", "seq", "map")}


class StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader restricted to plain data: see the module docstring."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:  # `<<: *base` then `lr: 0.5` overrides, as YAML intends
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                seen = key in first_line
            except TypeError:  # an unhashable key: SafeLoader's own error names it below
                continue
            if seen:
                raise ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {key!r} (first at line {first_line[key] + 1})",
                    key_node.start_mark,
                )
            first_line[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        _check_length(node)
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node: ScalarNode) -> float:
        _check_length(node)
        return super().construct_yaml_float(node)


# An unquoted date is text in a spec, never a datetime: drop the timestamp resolver.
StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _TAG + "timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
StrictLoader.add_constructor(_TAG + "int", StrictLoader.construct_yaml_int)
StrictLoader.add_constructor(_TAG + "float", StrictLoader.construct_yaml_float)


def _check_length(node: ScalarNode) -> None:
    if len(node.value) > MAX_NUMBER_CHARS:
        raise ConstructorError(
            None, None, f"a number of {len(node.value)} characters", node.start_mark
        )


def check_shape(text: str, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> None:
    """Refuse a document nested deeper than `max_depth` or expanding to more than `max_nodes`
    nodes (aliases counted as often as they are used), walking its events without recursion.
    Raises a MarkedYAMLError, whose problem and mark say what and where."""
    sizes: list[int] = []  # the open collections' node counts so far, innermost last
    anchored: dict[str, int] = {}  # anchor -> the node count its node expands to
    anchors: list[str | None] = []  # the open collections' anchors
    total = 0
    for event in yaml.parse(text, Loader=StrictLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            if len(sizes) >= max_depth:
                raise MarkedYAMLError(
                    problem=f"nested deeper than {max_depth} levels", problem_mark=event.start_mark
                )
            sizes.append(1)
            anchors.append(event.anchor)
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            size, anchor = sizes.pop(), anchors.pop()
        elif isinstance(event, yaml.ScalarEvent):
            size, anchor = 1, event.anchor
        elif isinstance(event, yaml.AliasEvent):
            size, anchor = anchored.get(event.anchor, 1), None  # unknown: the composer says so
        else:
            continue
        if anchor is not None:
            anchored[anchor] = size
        if sizes:
            sizes[-1] += size
        else:
            total += size
        if total + sum(sizes) > max_nodes:
            raise MarkedYAMLError(
                problem=f"expands to more than {max_nodes} YAML nodes (aliases repeated into a "
                "bomb?)"
            )


def _check_tags(root: Node) -> None:
    """Every node a plain-data type (aliases share node objects: each is looked at once)."""
    seen: set[int] = set()
    pending = [root]
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.tag not in ALLOWED_TAGS and node.tag != _MERGE:
            shown = node.tag.replace(_TAG, "!!")
            raise ConstructorError(
                None,
                None,
                f"tag {shown} is not allowed (a spec holds strings, numbers, booleans, null, "
                "lists and mappings)",
                node.start_mark,
            )
        if isinstance(node, MappingNode):
            pending += [part for pair in node.value for part in pair]
        elif isinstance(node, SequenceNode):
            pending += node.value


def load_yaml(text: str, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> Any:
    """The document's plain data; yaml.YAMLError (with a problem and a mark) for anything else:
    a tag other than plain data, a duplicate key, a document too deep or too large."""
    check_shape(text, max_depth, max_nodes)
    loader = StrictLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_tags(root)
        return loader.construct_document(root)
    finally:
        loader.dispose()
