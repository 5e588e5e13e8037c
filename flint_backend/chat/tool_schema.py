"""Which JSON types a tool's arguments may take, and how a raw `<arg_value>` text becomes one.

GLM-4.7 writes string values raw and every other value as JSON text, so the type of
an argument can only be read off the tool's JSON schema:
- a property whose only type is "string" keeps the raw text (`"123"` stays "123");
- a property whose types exclude "string" is JSON-decoded, falling back to the raw text
  when the text is not JSON;
- a property that allows "string" among others (`anyOf`, `oneOf`, type lists) keeps the
  raw text unless it decodes to one of the other allowed types (`null` -> None);
- a property the schema does not declare is a string; a declared property with no type
  information at all (`{}`, a `$ref`) may be anything, so it follows the rule above
  with every type allowed.

`check_schema` refuses, before anything runs, a tool schema that breaks the JSON Schema
basics the parser reads (`type`, `properties`, `anyOf`/`oneOf`, `enum`) or that a JSON
Schema validator (OpenAI's among them) refuses (`allOf`, `items`); other keywords pass
unread, as do `$ref` and boolean schemas.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from flint_backend.chat.request_error import ChatRequestError, describe

STRING = "string"
JSON_TYPES = frozenset({"string", "integer", "number", "boolean", "null", "object", "array"})
ONLY_STRING = frozenset({STRING})


def json_type_of(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def schema_types(schema: object) -> frozenset[str]:
    """JSON types a (sub)schema allows; every type when it says nothing about types."""
    if not isinstance(schema, dict):
        return JSON_TYPES
    types: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        types.add(declared)
    elif isinstance(declared, list):
        types.update(t for t in declared if isinstance(t, str))
    for combinator in ("anyOf", "oneOf"):
        for sub in schema.get(combinator) or ():
            types |= schema_types(sub)
    if isinstance(schema.get("enum"), list):
        types.update(json_type_of(v) for v in schema["enum"])
    if "const" in schema:
        types.add(json_type_of(schema["const"]))
    return frozenset(types) & JSON_TYPES or JSON_TYPES


_TYPE_NAMES = "one of string, integer, number, boolean, null, object, array (or a non-empty array of them)"
_SCHEMA = "a JSON Schema (an object or true/false)"


def check_schema(path: str, schema: object) -> None:
    """Raises ChatRequestError naming the first malformed keyword at `path` or below (a keyword
    that is null counts as absent, as elsewhere in a request)."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise ChatRequestError(path, _SCHEMA, describe(schema))
    given = {key: value for key, value in schema.items() if value is not None}
    if "type" in given and not _known_types(given["type"]):
        raise ChatRequestError(f"{path}.type", _TYPE_NAMES, describe(given["type"]))
    if "properties" in given:
        if not isinstance(given["properties"], dict):
            raise ChatRequestError(f"{path}.properties", "an object of property schemas", describe(given["properties"]))
        for key, sub in given["properties"].items():
            check_schema(f"{path}.properties.{key}", sub)
    for combinator in ("anyOf", "oneOf", "allOf"):
        subs = given.get(combinator, [True])
        if not isinstance(subs, list) or not subs:
            raise ChatRequestError(f"{path}.{combinator}", "a non-empty array of schemas", describe(subs))
        for i, sub in enumerate(subs):
            check_schema(f"{path}.{combinator}[{i}]", sub)
    if "enum" in given and not isinstance(given["enum"], list):
        raise ChatRequestError(f"{path}.enum", "an array of values", describe(given["enum"]))
    items = given.get("items", True)  # a schema, or (drafts before 2020-12) an array of them, one a position
    for i, sub in enumerate(items) if isinstance(items, list) else [(None, items)]:
        check_schema(f"{path}.items" if i is None else f"{path}.items[{i}]", sub)


def _known_types(declared: object) -> bool:
    names = declared if isinstance(declared, list) else [declared]
    return bool(names) and all(isinstance(t, str) and t in JSON_TYPES for t in names)


def _matches(value: object, types: frozenset[str]) -> bool:
    kind = json_type_of(value)
    return kind in types or (kind == "integer" and "number" in types)


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")  # NaN/Infinity would not survive json.dumps as JSON


def decode_value(raw: str, types: frozenset[str]) -> object:
    if types == ONLY_STRING:
        return raw
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except ValueError:
        return raw
    if STRING not in types:
        return value
    return value if not isinstance(value, str) and _matches(value, types) else raw


@dataclass(frozen=True)
class ToolSchema:
    name: str
    property_types: dict[str, frozenset[str]]

    @classmethod
    def from_openai(cls, tool: dict) -> ToolSchema:
        """From `{"type": "function", "function": {"name", "description", "parameters"}}`."""
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(f"tool.function.name: expected a string name in an OpenAI tool, got {tool!r}")
        parameters = function.get("parameters") or {}
        properties = (parameters.get("properties") or {}) if isinstance(parameters, dict) else {}
        return cls(function["name"], {key: schema_types(sub) for key, sub in properties.items()})

    def types_of(self, key: str) -> frozenset[str]:
        return self.property_types.get(key, ONLY_STRING)
