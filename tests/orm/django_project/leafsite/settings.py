"""Settings of the test project. From the environment:

- ``SHOP_DATABASE_URL``: ``sqlite:///PATH`` or ``mysql+pymysql://USER:PW@HOST:PORT/NAME``
  (MariaDB through PyMySQL); the test runner makes its own ``test_`` database beside it;
- ``SHOP_REDIS_URL``: the Redis of the pools, given to leafpool through the Django
  setting ``LEAFPOOL`` (which wins over the ``LEAFPOOL_*`` environment variables).
"""

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "leafpool-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "leafsite.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast, tests only


def database(url: str) -> dict[str, object]:
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = url.removeprefix("sqlite:///")
        # a file for the test database too (Django's default is one in memory)
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": path,
                "TEST": {"NAME": f"{path}.test"}}
    if parts.scheme in ("mysql", "mysql+pymysql"):
        import pymysql

        pymysql.install_as_MySQLdb()
        return {"ENGINE": "django.db.backends.mysql", "NAME": parts.path.lstrip("/"),
                "USER": unquote(parts.username or ""), "PASSWORD": unquote(parts.password or ""),
                "HOST": parts.hostname, "PORT": str(parts.port or 3306),
                "OPTIONS": {"charset": "utf8mb4"}}
    raise ValueError(f"SHOP_DATABASE_URL: not sqlite:/// nor mysql+pymysql://: {url}")


DATABASES = {"default": database(
    os.environ.get("SHOP_DATABASE_URL", f"sqlite:///{BASE_DIR / 'shop.sqlite3'}"))}

LEAFPOOL = {
    "REDIS_URL": os.environ.get("SHOP_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "EMPTY_POLICY": "raise",
}
