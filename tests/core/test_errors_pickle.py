"""Every leafpool exception survives pickle: Celery's worker pool sends a task's exception
from the child process to the parent by pickle, and Celery puts an exception it cannot
pickle back together in its place as the nearest base class that it can (the worker log
and Flower then show ``LeafpoolError``, its fields gone).

The classes are found, not listed: every module of leafpool is imported and every
subclass of :class:`LeafpoolError` defined in leafpool is checked, each built with
arguments derived from its constructor's signature. A new class whose arguments cannot be
derived fails the test, asking for an entry in ``SAMPLE_ARGUMENTS``."""

from __future__ import annotations

import importlib
import inspect
import itertools
import pickle
import pkgutil
import types
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.protocol.states import ZnodeStat

import leafpool
from leafpool.core.errors import ClockMovedBackwards, LeafpoolError
from leafpool.snowflake.registry.zk import IdentityHeld

# Arguments for a class whose constructor's parameters cannot be derived from their
# annotations (see sample()): {cls: (positional arguments, keyword arguments)}.
SAMPLE_ARGUMENTS: dict[type[LeafpoolError], tuple[tuple[Any, ...], dict[str, Any]]] = {
    IdentityHeld: (
        ("node-7", "/snowflake/leafpool/temporary/node-7", {"pid": 4242, "ip": "10.0.0.7"},
         ZnodeStat(*range(7), 0x1F2E3D, 0, 0, 8)),
        {},
    ),
}


def leafpool_exception_classes() -> list[type[LeafpoolError]]:
    """LeafpoolError and every subclass of it defined in leafpool, after importing every
    module of the package (so a subclass defined outside leafpool.core.errors counts)."""
    for module in pkgutil.walk_packages(leafpool.__path__, f"{leafpool.__name__}."):
        importlib.import_module(module.name)
    found: dict[str, type[LeafpoolError]] = {}
    pending: list[type[LeafpoolError]] = [LeafpoolError]
    while pending:
        cls = pending.pop()
        if cls.__module__.split(".")[0] == leafpool.__name__:
            found[f"{cls.__module__}.{cls.__qualname__}"] = cls
        pending.extend(cls.__subclasses__())
    return [found[name] for name in sorted(found)]


class NoSample(Exception):
    """No sample value can be derived from a parameter's annotation."""


def sample(annotation: Any, name: str, numbers: Iterator[int]) -> Any:
    """A value of the annotated type, distinct from the other parameters' values."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        return sample(options[0], name, numbers)
    if origin is list:
        (item,) = typing.get_args(annotation)
        return [sample(item, name, numbers) for _ in range(2)]
    if annotation is str:
        return f"sample-{name}"
    if annotation is bool:
        return True
    if annotation is int:
        return next(numbers)
    if annotation is float:
        return next(numbers) + 0.25
    if annotation is object:
        return {"sample": name}
    raise NoSample(f"parameter {name!r}: {annotation!r}")


def build(cls: type[LeafpoolError]) -> LeafpoolError:
    """``cls`` built with sample arguments: a value for every parameter, those with a
    default included (as a rule a value other than the default, so losing it shows)."""
    if cls in SAMPLE_ARGUMENTS:
        args, kwargs = SAMPLE_ARGUMENTS[cls]
        return cls(*args, **kwargs)
    init = cls.__init__
    if not any("__init__" in vars(c) for c in cls.__mro__[: cls.__mro__.index(LeafpoolError) + 1]):
        return cls("sample message")  # BaseException's constructor: the message
    hints = typing.get_type_hints(init)
    numbers = itertools.count(101, 17)
    positional: list[Any] = []
    keywords: dict[str, Any] = {}
    try:
        for name, parameter in list(inspect.signature(init).parameters.items())[1:]:
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                continue
            value = sample(hints.get(name, parameter.annotation), name, numbers)
            if parameter.kind is parameter.KEYWORD_ONLY:
                keywords[name] = value
            else:
                positional.append(value)
    except NoSample as exc:
        pytest.fail(
            f"{cls.__module__}.{cls.__qualname__}: no sample value for {exc}; add the "
            f"class's sample arguments to SAMPLE_ARGUMENTS in {__name__}"
        )
    return cls(*positional, **keywords)


def fields(exc: BaseException) -> dict[str, Any]:
    return {name: value for name, value in vars(exc).items() if not name.startswith("_")}


def test_the_search_finds_the_exception_tree() -> None:
    names = {cls.__name__ for cls in leafpool_exception_classes()}
    assert {"LeafpoolError", "CounterBehind", "InvalidTag", "ReplyLost"} <= names


@pytest.mark.parametrize("cls", leafpool_exception_classes(), ids=lambda cls: cls.__name__)
def test_every_leafpool_exception_pickles_to_the_same_class_message_and_fields(
    cls: type[LeafpoolError],
) -> None:
    exc = build(cls)
    exc.add_note("a note added on the way up")
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        copy = pickle.loads(pickle.dumps(exc, protocol=protocol))
        assert type(copy) is cls, f"pickle protocol {protocol}"
        assert str(copy) == str(exc), f"pickle protocol {protocol}"
        assert copy.args == exc.args, f"pickle protocol {protocol}"
        assert fields(copy) == fields(exc), f"pickle protocol {protocol}"
        assert copy.__notes__ == exc.__notes__, f"pickle protocol {protocol}"


def test_an_exception_whose_message_was_rewritten_pickles_with_the_rewritten_message() -> None:
    """The snowflake registry rewrites a ClockMovedBackwards' message after building it:
    the copy has that message, not the one its constructor would write."""
    exc = ClockMovedBackwards(3, 250)
    exc.args = ("worker 3: clock moved backwards by 250 ms: the local clock is behind",)
    copy = pickle.loads(pickle.dumps(exc))
    assert (type(copy), copy.args, copy.worker_id, copy.offset_ms) == (
        ClockMovedBackwards, exc.args, 3, 250)
