"""``leafpool status --json``: each tag's :class:`~leafpool.status.TagStatus` as the
``json.dumps`` of its fields, a line a tag, written from a template of its keys."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import fields

from leafpool.status import TagStatus


def status_json(statuses: Sequence[TagStatus]) -> str:
    """A JSON array, one tag per line, each ``json.dumps`` of :meth:`TagStatus.as_dict`
    (``json.dumps`` with ``indent`` runs in pure Python: seconds for 10,000 tags), written
    by :func:`_status_json_line`."""
    if not statuses:
        return "[]\n"
    return "[\n" + ",\n".join(map(_status_json_line, statuses)) + "\n]\n"


def _status_json_line(st: TagStatus) -> str:
    """``json.dumps(st.as_dict())``, the same text: the keys written once in a template
    and each value by its field's type (an int as ``repr``, a finite float as
    ``float.__repr__``, a str by json's own escaping), ``json.dumps`` for a value of another
    type (and for the whole status when its fields are not the declared ones, in their
    order). ``json.dumps`` of each status encoded its 62 keys anew: 2.2-2.7 s of a
    100,000-tag ``--json``."""
    fields = st.__dict__
    if len(fields) == len(_JSON_FIELDS) and list(fields) == _JSON_FIELDS:
        try:
            return _json_template(*fields.values())
        except TypeError:  # a list holding something other than str
            pass
    return json.dumps(st.as_dict())


def _json_list(values: list[str]) -> str:
    """``json.dumps`` of a list of str (TypeError for anything else in it)."""
    return "[" + ", ".join(map(_json_str, values)) + "]"


_json_str: Callable[[str], str] = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]
_JSON_FIELDS = [f.name for f in fields(TagStatus)]
#: each declared type's value as ``json.dumps`` writes it (``@``: the value), falling back
#: to ``json.dumps`` of the value
_JSON_VALUE = {
    "str": '_text(@) if type(@) is str else _dumps(@)',
    "int": '@ if type(@) is int else _dumps(@)',
    "int | None": '"null" if @ is None else @ if type(@) is int else _dumps(@)',
    "float": '_float(@) if type(@) is float and @ - @ == 0.0 else _dumps(@)',
    "float | None": ('"null" if @ is None else _float(@) if type(@) is float and @ - @ == 0.0'
                     ' else _dumps(@)'),
    "bool": '"true" if @ is True else "false" if @ is False else _dumps(@)',
    "list[str]": '_list(@) if type(@) is list else _dumps(@)',
}


def _make_json_template() -> Callable[..., str]:
    """The function of :func:`_status_json_line`: one f-string of every field, given in
    declaration order."""
    pieces, names = [], []
    for f in fields(TagStatus):
        value = _JSON_VALUE.get(str(f.type), "_dumps(@)").replace("@", f"_{f.name}")
        pieces.append(f"{json.dumps(f.name)}: {{{value}}}")
        names.append(f"_{f.name}")
    body = ", ".join(pieces)
    source = f"def template({', '.join(names)}):\n    return f'{{{{{body}}}}}'\n"
    scope = {"_text": _json_str, "_dumps": json.dumps, "_float": float.__repr__,
             "_list": _json_list}
    exec(compile(source, "<leafpool.status json template>", "exec"), scope)
    template: Callable[..., str] = scope["template"]  # type: ignore[assignment]
    return template


_json_template = _make_json_template()
