"""The Celery app of leafpool: ``celery -A workers worker`` / ``celery -A workers beat``.

This package is the only Celery code; tasks are thin calls into :mod:`leafpool`.
"""

from workers.application import app

__all__ = ["app"]
