"""The schemas of the OpenAPI description (:mod:`leafpool.http.openapi`): the bodies the
handlers answer, built from the code that answers them. A tag's rules come from
:mod:`leafpool.core.tags`, a snowflake ID's range from
:mod:`leafpool.core.snowflake_layout`, the status view's fields from
:class:`~leafpool.status.TagStatus` (and :mod:`~leafpool.http.ops`' reshaping of them),
the error bodies' kinds from :mod:`~leafpool.http.errors`."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from leafpool.core.snowflake_layout import MAX_ID
from leafpool.core.tags import MAX_TAG_LENGTH, TAG_CHARS
from leafpool.http.ops import SNOWFLAKE_FIELDS
from leafpool.http.service import MODES
from leafpool.status import TagStatus

Schema = dict[str, Any]

#: what validate_tag accepts (leafpool/core/tags.py's ``_TAG_RE``, anchored)
TAG_PATTERN = "^[A-Za-z0-9_.\\-]+$"
DIGITS = "^[0-9]+$"
#: the text of the ID endpoints: one ID bare, or one per line (``?count=``)
ID_LINES = "^([0-9]+\\n)*[0-9]+\\n?$"


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def tag_schema() -> Schema:
    return {"type": "string", "minLength": 1, "maxLength": MAX_TAG_LENGTH,
            "pattern": TAG_PATTERN,
            "description": f"a biz_tag: 1 to {MAX_TAG_LENGTH} characters from {TAG_CHARS}"}


def snowflake_id_schema() -> Schema:
    return {"type": "integer", "format": "int64", "minimum": 0, "maximum": MAX_ID,
            "description": "a decimal integer from 0 to 2**63 - 1"}


def count_schema(max_count: int) -> Schema:
    return {"type": "integer", "minimum": 1, "maximum": max_count,
            "description": f"how many IDs: 1 to {max_count} (LEAFPOOL_HTTP_MAX_COUNT, at most "
                           "100,000)"}


def _error(kind: Schema, description: str, **fields: Schema) -> Schema:
    """A JSON error body (:func:`leafpool.http.errors.json_error`): ``error`` (the kind),
    ``message`` (for a person) and the fields of its kind."""
    props: Schema = {"error": kind, "message": {"type": "string"}, **fields}
    return {"type": "object", "description": description, "required": list(props),
            "properties": props, "additionalProperties": False}


def _type_of(hint: object) -> Schema:
    """A JSON schema for one :class:`TagStatus` field's type."""
    if isinstance(hint, types.UnionType):
        kinds = [_type_of(arg) for arg in typing.get_args(hint)]
        return {"type": [k["type"] for k in kinds]}
    if typing.get_origin(hint) is list:
        return {"type": "array", "items": _type_of(typing.get_args(hint)[0])}
    names = {int: "integer", float: "number", str: "string", bool: "boolean",
             type(None): "null"}
    return {"type": names[hint]}  # type: ignore[index]


def tag_status_schema() -> Schema:
    """``/api/status``' entry for a tag (:func:`leafpool.http.ops.status_dict`): the
    fields of :class:`TagStatus`, ``max_id`` as a string, a snowflake tag's own fields
    under ``snowflake`` (absent for a segment tag)."""
    hints = typing.get_type_hints(TagStatus)
    props: Schema = {}
    snowflake: Schema = {}
    for f in dataclasses.fields(TagStatus):
        target = snowflake if f.name in SNOWFLAKE_FIELDS else props
        target[f.name] = _type_of(hints[f.name])
    props["max_id"] = {"type": ["string", "null"], "pattern": DIGITS,
                       "description": "the database's max_id (a 64-bit value: a string)"}
    required = list(props)
    props["snowflake"] = {"type": "object", "required": list(snowflake),
                          "properties": snowflake, "additionalProperties": False,
                          "description": "a snowflake tag's own fields (absent for a "
                                         "segment tag)"}
    return {"type": "object", "required": required, "properties": props,
            "additionalProperties": False}


def schemas(max_count: int) -> Schema:
    """``components.schemas``."""
    id_string = {"type": "string", "pattern": DIGITS, "description": "an ID (64-bit: a string)"}
    return {
        "Tag": tag_schema(),
        "IdText": {"type": "string", "pattern": ID_LINES,
                   "description": "the bare ID (no newline) without ``count``; with it, "
                                  "``count`` IDs, each followed by a newline"},
        "Ids": {
            "type": "object", "required": ["tag", "mode", "ids"],
            "additionalProperties": False,
            "properties": {"tag": ref("Tag"), "mode": {"enum": list(MODES)},
                           "ids": {"type": "array", "items": id_string, "minItems": 1,
                                   "maxItems": max_count}},
        },
        "Decoded": {
            "type": "object", "additionalProperties": False,
            "required": ["id", "timestamp_ms", "iso", "worker_id", "dc", "dc_count",
                         "sequence", "epoch_ms"],
            "properties": {
                "id": id_string,
                "timestamp_ms": {"type": "integer", "description": "Unix time, ms"},
                "iso": {"type": "string", "description": "the timestamp, ISO 8601 UTC"},
                "worker_id": {"type": "integer", "minimum": 0},
                "dc": {"type": "integer", "minimum": 0,
                       "description": "the DC whose range holds the worker ID: worker_id // "
                                      "(1024 / dc_count); the ID does not carry the count, "
                                      "this server's LEAFPOOL_DC_COUNT gives it"},
                "dc_count": {"type": "integer", "minimum": 1,
                             "description": "LEAFPOOL_DC_COUNT of this server"},
                "sequence": {"type": "integer", "minimum": 0},
                "epoch_ms": {"type": "integer", "description": "LEAFPOOL_SNOWFLAKE_EPOCH"},
            },
        },
        "LeafDecoded": {
            "type": "object", "additionalProperties": False,
            "required": ["timestamp", "workerId", "sequenceId"],
            "properties": {
                "timestamp": {"type": "string",
                              "pattern": "^[0-9]+\\([0-9]{4}-[0-9]{2}-[0-9]{2} "
                                         "[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}\\)$",
                              "description": "ms(yyyy-MM-dd HH:mm:ss.SSS), the server's "
                                             "local time"},
                "workerId": {"type": "string", "pattern": DIGITS},
                "sequenceId": {"type": "string", "pattern": DIGITS},
            },
        },
        "LeafDecodeError": {
            "type": "object", "required": ["errorMsg"], "additionalProperties": False,
            "properties": {"errorMsg": {"type": "string"}, "field": {"const": "snowflakeId"},
                           "allowed": {"type": "string"}},
            "description": "Leaf's errorMsg key (Leaf answered 200; leafpool 400); field and "
                           "allowed when a value was given",
        },
        "Status": {
            "type": "object", "required": ["generated_ms", "tags"],
            "additionalProperties": False,
            "properties": {"generated_ms": {"type": "integer"},
                           "tags": {"type": "array", "items": ref("TagStatus")}},
        },
        "TagStatus": tag_status_schema(),
        "LeafAlloc": {
            "type": "object", "required": ["rows"], "additionalProperties": False,
            "properties": {"rows": {"type": "array", "items": {
                "type": "object", "additionalProperties": False,
                "required": ["biz_tag", "max_id", "step", "description", "update_time"],
                "properties": {"biz_tag": {"type": "string"}, "max_id": id_string,
                               "step": {"type": "integer"},
                               "description": {"type": ["string", "null"]},
                               "update_time": {"type": ["string", "null"]}}}}},
        },
        "InvalidInput": _error(
            {"const": "invalid_input"}, "400: bad input; the message names the field, the "
            "value and what is allowed",
            field={"type": "string"}, value={"type": "string"}, allowed={"type": "string"}),
        "AuthError": _error(
            {"enum": ["unauthorized", "forbidden"]},
            "401 unauthorized: no token, or an unknown one; 403 forbidden: the token may "
            "not take IDs of this tag"),
        "UnknownTag": _error({"const": "unknown_tag"}, "404: no such tag", tag=ref("Tag")),
        "WrongMode": _error(
            {"const": "wrong_mode"}, "404: a tag of the other mode; the message names the "
            "endpoint to ask", tag=ref("Tag"), mode={"enum": list(MODES)}),
        "PoolEmpty": _error({"const": "pool_empty"}, "503: the pool was still empty after "
                            "LEAFPOOL_EMPTY_WAIT_SECONDS", tag=ref("Tag")),
        "Unavailable": _error(
            {"type": "string"}, "503: Redis or the database did not answer "
            "(backend_unavailable), or another failure of the library, named by its class"),
        "Configuration": _error(
            {"const": "configuration"}, "500: the server is misconfigured (the operator's "
            "fault, logged); field names the variable", field={"type": "string"},
            allowed={"type": "string"}),
    }
