"""YAML that refuses a key given twice in one mapping: PyYAML keeps the last one silently, and a
spec would then train with a setting its reader never saw."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode

_MERGE = "tag:yaml.org,2002:merge"


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader, except that a duplicate key is a ConstructorError at its line."""

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


def load_yaml(text: str) -> Any:
    """yaml.safe_load, refusing duplicate keys."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader: builds plain data only
