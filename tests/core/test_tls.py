"""LEAFPOOL_REDIS_TLS_* checked when the settings load (leafpool/core/tls.py): each file
read with ``ssl`` itself, a mistake refused naming the variable, and what the files
become for redis-py and for Celery's broker."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pytest

from leafpool.core.config import load_settings
from leafpool.core.errors import ConfigurationError
from tests.support.tls import Pki

TLS_URL = "rediss://127.0.0.1:6380/0"


def _refused(**settings: object) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(**settings)
    return caught.value


def test_the_files_become_redis_py_and_celery_options(pki: Pki) -> None:
    settings = load_settings(redis_url=TLS_URL, redis_tls_ca_file=pki.ca,
                             redis_tls_cert_file=pki.client_cert,
                             redis_tls_key_file=pki.client_key)
    assert settings.redis_tls.redis_options() == {
        "ssl_cert_reqs": "required", "ssl_check_hostname": True, "ssl_ca_certs": pki.ca,
        "ssl_certfile": pki.client_cert, "ssl_keyfile": pki.client_key}
    assert settings.broker_tls  # the broker defaults to the pools' Redis
    assert settings.broker_use_ssl == {**settings.redis_tls.redis_options(),
                                       "ssl_cert_reqs": ssl.CERT_REQUIRED}


def test_a_plain_broker_beside_tls_pools_gets_no_tls_options(pki: Pki) -> None:
    settings = load_settings(redis_url=TLS_URL, broker_url="redis://127.0.0.1:6379/1",
                             redis_tls_ca_file=pki.ca)
    assert settings.broker_use_ssl is None


def test_sentinel_over_tls_gives_the_broker_tls_to_the_sentinels_too(pki: Pki) -> None:
    settings = load_settings(redis_url="rediss://ignored/0", redis_tls_ca_file=pki.ca,
                             redis_sentinels="127.0.0.1:26379,127.0.0.1:26380")
    assert settings.broker_url.startswith("sentinel://") and settings.broker_tls
    sentinel_kwargs = settings.broker_options["sentinel_kwargs"]
    assert isinstance(sentinel_kwargs, dict) and sentinel_kwargs["ssl"] is True
    assert sentinel_kwargs["ssl_ca_certs"] == pki.ca


def test_files_without_a_tls_url_are_refused(pki: Pki) -> None:
    err = _refused(redis_url="redis://127.0.0.1:6379/0", redis_tls_ca_file=pki.ca)
    assert err.field == "LEAFPOOL_REDIS_TLS_CA_FILE" and "rediss://" in str(err)


def test_a_certificate_without_its_key_is_refused(pki: Pki) -> None:
    err = _refused(redis_url=TLS_URL, redis_tls_cert_file=pki.client_cert)
    assert err.field == "LEAFPOOL_REDIS_TLS_KEY_FILE"
    assert "LEAFPOOL_REDIS_TLS_CERT_FILE" in str(err)


def test_a_missing_ca_file_is_refused(tmp_path: Path) -> None:
    err = _refused(redis_url=TLS_URL, redis_tls_ca_file=str(tmp_path / "nope.crt"))
    assert err.field == "LEAFPOOL_REDIS_TLS_CA_FILE" and "no such file" in str(err)


def test_a_ca_file_without_a_certificate_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.crt"
    junk.write_text("not a certificate\n")
    err = _refused(redis_url=TLS_URL, redis_tls_ca_file=str(junk))
    assert err.field == "LEAFPOOL_REDIS_TLS_CA_FILE" and "PEM" in str(err)


def test_a_key_that_does_not_match_the_certificate_is_refused(pki: Pki) -> None:
    err = _refused(redis_url=TLS_URL, redis_tls_cert_file=pki.client_cert,
                   redis_tls_key_file=pki.file("server.key"))
    assert err.field == "LEAFPOOL_REDIS_TLS_KEY_FILE"
    assert pki.client_cert in str(err)


def test_an_encrypted_key_is_refused_not_prompted_for(pki: Pki, tmp_path: Path) -> None:
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(["openssl", "pkey", "-in", pki.client_key, "-aes256", "-passout",
                    "pass:secret", "-out", str(encrypted)], check=True, capture_output=True,
                   timeout=30)
    err = _refused(redis_url=TLS_URL, redis_tls_cert_file=pki.client_cert,
                   redis_tls_key_file=str(encrypted))
    assert err.field == "LEAFPOOL_REDIS_TLS_KEY_FILE" and "unencrypted" in str(err)
