"""A leafpool exception a task raises reaches the worker's parent process, its log and
Flower as itself: Celery's own path (celery.app.trace, on a task's failure) keeps an
exception it can pickle and sends it to the parent inside a pickled ExceptionInfo; one it
cannot pickle it replaces by the nearest base class it can (``LeafpoolError``). The
exception classes and their sample arguments come from tests/core/test_errors_pickle.py
(the library's tests do not import Celery)."""

from __future__ import annotations

import pickle
import sys

import pytest
from billiard.einfo import ExceptionInfo
from celery.utils.serialization import get_pickleable_etype, get_pickleable_exception

from leafpool.core.errors import LeafpoolError
from tests.core.test_errors_pickle import build, fields, leafpool_exception_classes


@pytest.mark.parametrize("cls", leafpool_exception_classes(), ids=lambda cls: cls.__name__)
def test_celery_keeps_every_leafpool_exception_as_itself(cls: type[LeafpoolError]) -> None:
    try:
        raise build(cls)
    except LeafpoolError as raised:
        exc = get_pickleable_exception(raised)
        assert exc is raised
        assert get_pickleable_etype(cls) is cls
        einfo = ExceptionInfo(exc_info=(cls, exc, sys.exc_info()[2]))
    copy = pickle.loads(pickle.dumps(einfo)).exception
    assert (type(copy), str(copy), copy.args, fields(copy)) == (
        cls, str(exc), exc.args, fields(exc))
