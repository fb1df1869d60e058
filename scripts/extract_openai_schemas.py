"""Extract the OpenAI response schemas the tests validate against from OpenAI's published OpenAPI
document (github.com/openai/openai-openapi), with everything they reference, into a small JSON file.

    python scripts/extract_openai_schemas.py path/to/openapi.yaml > tests/openapi/openai-schemas.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml

ROOTS = [
    "ErrorResponse", "ListModelsResponse", "Model", "CreateEmbeddingResponse", "CreateCompletionResponse",
    "CreateChatCompletionResponse", "CreateChatCompletionStreamResponse", "Response", "ResponseStreamEvent",
]


def refs(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            found.add(ref.rsplit("/", 1)[1])
        for value in node.values():
            found |= refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= refs(value)
    return found


def main() -> None:
    with open(sys.argv[1]) as file:
        document = yaml.load(file, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    schemas = document["components"]["schemas"]
    keep: dict[str, Any] = {}
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        if name not in keep:
            keep[name] = schemas[name]
            todo.extend(refs(schemas[name]))
    json.dump({"source": "openai/openai-openapi commit f85dbe223d40e1a31cba812ab2d755c7e98a92a3 (MIT)",
               "components": {"schemas": dict(sorted(keep.items()))}}, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
