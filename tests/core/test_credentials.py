"""The shared services' logins and the database's TLS, checked when the settings load
(leafpool/core/credentials.py, leafpool/core/tls.py, leafpool/core/backend_settings.py):
each mistake refused naming the variable, a password never shown, and what they become
for redis-py, kombu and PyMySQL. The services themselves refusing clients without them:
tests/redis/test_sentinel_auth.py, tests/snowflake/registry/test_zk_acl.py,
tests/database/test_tls.py."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from leafpool.core.config import load_settings
from leafpool.core.errors import ConfigurationError
from tests.support.tls import Pki

SENTINELS = "127.0.0.1:26379,127.0.0.1:26380"
MYSQL = "mysql+pymysql://leaf:pw@db.internal:3306/leaf"


def _refused(**settings: object) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(**settings)
    return caught.value


# -- the sentinels' login ------------------------------------------------------------------

def test_the_sentinel_login_goes_to_the_sentinels_of_the_pools_and_of_the_broker() -> None:
    settings = load_settings(redis_sentinels=SENTINELS,
                             redis_sentinel_username="leafpool-sentinel-client",
                             redis_sentinel_password="s3cret")
    login = {"username": "leafpool-sentinel-client", "password": "s3cret"}
    assert settings.sentinel_login.redis_options() == login
    assert settings.broker_url.startswith("sentinel://")
    assert settings.broker_options == {"master_name": "leafpool", "sentinel_kwargs": {
        "socket_timeout": 5.0, "socket_connect_timeout": 5.0, **login}}
    assert "s3cret" not in repr(settings) and "s3cret" not in repr(settings.sentinel_login)


def test_a_password_alone_is_a_requirepass_login_and_joins_tls_to_the_sentinels(
        pki: Pki) -> None:
    settings = load_settings(redis_url="rediss://ignored/0", redis_tls_ca_file=pki.ca,
                             redis_sentinels=SENTINELS, redis_sentinel_password="s3cret")
    kwargs = settings.broker_options["sentinel_kwargs"]
    assert isinstance(kwargs, dict)
    assert kwargs["password"] == "s3cret" and "username" not in kwargs
    assert kwargs["ssl"] is True and kwargs["ssl_ca_certs"] == pki.ca


def test_without_the_settings_nothing_changes() -> None:
    settings = load_settings(redis_sentinels=SENTINELS)
    assert settings.broker_options == {"master_name": "leafpool"}
    assert settings.sentinel_login.redis_options() == {}
    assert not settings.zk_login.configured and settings.database_tls_used is None


def test_a_sentinel_user_without_a_password_is_refused() -> None:
    err = _refused(redis_sentinels=SENTINELS, redis_sentinel_username="someone")
    assert err.field == "LEAFPOOL_REDIS_SENTINEL_PASSWORD"
    assert "LEAFPOOL_REDIS_SENTINEL_USERNAME" in str(err)


def test_a_sentinel_password_without_sentinel_is_refused_and_not_shown() -> None:
    err = _refused(redis_sentinel_password="s3cret")
    assert err.field == "LEAFPOOL_REDIS_SENTINEL_PASSWORD" and "s3cret" not in str(err)
    assert "LEAFPOOL_REDIS_SENTINELS" in str(err)
    # a sentinel:// broker of its own is Sentinel too
    load_settings(broker_url="sentinel://127.0.0.1:26379/1", redis_sentinel_password="s3cret")


def test_a_sentinel_user_name_with_a_space_is_refused() -> None:
    err = _refused(redis_sentinels=SENTINELS, redis_sentinel_username="two words",
                   redis_sentinel_password="s3cret")
    assert err.field == "LEAFPOOL_REDIS_SENTINEL_USERNAME" and "spaces" in str(err)


def test_a_password_setting_pydantic_refuses_is_not_shown() -> None:
    err = _refused(redis_sentinels=SENTINELS, redis_sentinel_password=["s3cret"])
    assert err.field == "LEAFPOOL_REDIS_SENTINEL_PASSWORD" and "s3cret" not in str(err)


# -- ZooKeeper's login ---------------------------------------------------------------------

def test_the_zookeeper_login_is_a_digest_identity() -> None:
    settings = load_settings(zk_hosts="zk:2181", zk_username="leafpool", zk_password="p:w")
    assert settings.zk_login.digest() == "leafpool:p:w"
    assert "p:w" not in repr(settings)


@pytest.mark.parametrize(("given", "field"), [
    ({"zk_username": "leafpool"}, "LEAFPOOL_ZK_PASSWORD"),
    ({"zk_password": "secret"}, "LEAFPOOL_ZK_USERNAME"),
])
def test_a_zookeeper_user_or_password_alone_is_refused(given: dict[str, str],
                                                      field: str) -> None:
    err = _refused(zk_hosts="zk:2181", **given)
    assert err.field == field and "secret" not in str(err)


def test_a_zookeeper_user_with_a_colon_or_without_hosts_is_refused() -> None:
    err = _refused(zk_hosts="zk:2181", zk_username="a:b", zk_password="secret")
    assert err.field == "LEAFPOOL_ZK_USERNAME" and "':'" in str(err)
    err = _refused(zk_username="leafpool", zk_password="secret")
    assert err.field == "LEAFPOOL_ZK_USERNAME" and "LEAFPOOL_ZK_HOSTS" in str(err)


# -- the database's TLS --------------------------------------------------------------------

def test_database_tls_becomes_a_verifying_context(pki: Pki) -> None:
    settings = load_settings(database_url=MYSQL, database_tls=True,
                             database_tls_ca_file=pki.ca,
                             database_tls_cert_file=pki.client_cert,
                             database_tls_key_file=pki.client_key)
    tls = settings.database_tls_used
    assert tls is not None
    context = tls.context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert len(context.get_ca_certs()) == 1  # the CA file's, not the system's
    unchecked = load_settings(database_url=MYSQL, database_tls=True,
                              database_tls_check_hostname=False).database_tls_used
    assert unchecked is not None
    context = unchecked.context()
    assert context.verify_mode == ssl.CERT_REQUIRED and not context.check_hostname


def test_database_tls_files_without_tls_on_are_refused(pki: Pki) -> None:
    err = _refused(database_url=MYSQL, database_tls_ca_file=pki.ca)
    assert err.field == "LEAFPOOL_DATABASE_TLS_CA_FILE" and "LEAFPOOL_DATABASE_TLS=true" in str(err)


def test_database_tls_with_sqlite_or_beside_the_url_s_own_is_refused(pki: Pki) -> None:
    err = _refused(database_url="sqlite:///x.db", database_tls=True)
    assert err.field == "LEAFPOOL_DATABASE_TLS" and "MySQL" in str(err)
    err = _refused(database_url=f"{MYSQL}?ssl_ca={pki.ca}", database_tls=True)
    assert err.field == "LEAFPOOL_DATABASE_TLS" and "query" in str(err)


def test_database_tls_files_are_checked_as_redis_s_are(pki: Pki, tmp_path: Path) -> None:
    err = _refused(database_url=MYSQL, database_tls=True,
                   database_tls_cert_file=pki.client_cert)
    assert err.field == "LEAFPOOL_DATABASE_TLS_KEY_FILE"
    err = _refused(database_url=MYSQL, database_tls=True,
                   database_tls_ca_file=str(tmp_path / "nope.crt"))
    assert err.field == "LEAFPOOL_DATABASE_TLS_CA_FILE" and "no such file" in str(err)
    err = _refused(database_url=MYSQL, database_tls=True,
                   database_tls_cert_file=pki.client_cert,
                   database_tls_key_file=pki.file("server.key"))
    assert err.field == "LEAFPOOL_DATABASE_TLS_KEY_FILE" and pki.client_cert in str(err)
