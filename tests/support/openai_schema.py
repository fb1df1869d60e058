"""Validate responses against OpenAI's published schemas (tests/openapi/openai-schemas.json).

The document declares OpenAPI 3.1 but uses 3.0's `nullable: true` and boolean `exclusiveMinimum`;
they are converted to JSON Schema here, or every `finish_reason: null` chunk would fail.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

SCHEMAS = Path(__file__).resolve().parents[1] / "openapi" / "openai-schemas.json"


def _convert(node: Any) -> Any:
    if isinstance(node, list):
        return [_convert(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _convert(value) for key, value in node.items()}
    if node.pop("nullable", False):
        if "$ref" in node or "anyOf" in node or "oneOf" in node or "allOf" in node:
            node = {"anyOf": [node, {"type": "null"}]}
        elif "type" in node:
            types = node["type"] if isinstance(node["type"], list) else [node["type"]]
            node["type"] = [*types, "null"]
            if "enum" in node:
                node["enum"] = [*node["enum"], None]
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if node.get(exclusive) is True:
            node[exclusive] = node.pop(bound)
        elif node.get(exclusive) is False:
            node.pop(exclusive)
    return node


@cache
def _document() -> dict[str, Any]:
    document = json.loads(SCHEMAS.read_text())
    return {"components": _convert(copy.deepcopy(document["components"]))}


def validate(instance: Any, schema_name: str) -> None:
    """Raise jsonschema.ValidationError when `instance` does not match OpenAI's `schema_name`."""
    document = _document()
    schema = {"$ref": f"#/components/schemas/{schema_name}", **document}
    jsonschema.validate(instance, schema, cls=jsonschema.Draft202012Validator)
