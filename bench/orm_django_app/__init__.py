"""A Django app for ``python -m bench --only orm`` (bench/orm_bench.py): Django configured
in-process against the bench's MariaDB, its two tables made with a schema editor (no
migrations). Django is imported only by :func:`setup`."""

from __future__ import annotations

from types import ModuleType


def setup(db_url: str, redis_url: str) -> ModuleType:
    """Configure Django for the bench's MariaDB (PyMySQL standing in for mysqlclient) and
    the fields for the bench's Redis (the ``LEAFPOOL`` setting), create the two tables;
    the models module."""
    import pymysql
    from sqlalchemy.engine import make_url

    pymysql.install_as_MySQLdb()
    import django
    from django.conf import settings

    url = make_url(db_url)
    settings.configure(
        DATABASES={"default": {
            "ENGINE": "django.db.backends.mysql", "NAME": url.database, "USER": url.username,
            "PASSWORD": url.password, "HOST": url.host, "PORT": str(url.port),
            "OPTIONS": {"charset": "utf8mb4"}}},
        INSTALLED_APPS=["bench.orm_django_app"],
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        LEAFPOOL={"REDIS_URL": redis_url, "EMPTY_POLICY": "raise", "ORM_PREFETCH": 0},
        USE_TZ=True,
    )
    django.setup()
    from django.db import connection

    from bench.orm_django_app import models

    with connection.schema_editor() as editor:
        editor.create_model(models.AutoRow)
        editor.create_model(models.LeafpoolRow)
    return models
