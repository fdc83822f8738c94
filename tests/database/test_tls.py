"""TLS to the database (issue 27 item 5): a real MariaDB with TLS on (the server
certificate of a throwaway CA made with ``openssl``, tests/support/tls.py) whose users must
connect over TLS (``REQUIRE SSL``) or with a client certificate (``REQUIRE X509``).

- A client without TLS is refused: a plain PyMySQL connection, and leafpool's segment
  store, mode ``mysql``'s registry and ``leafpool db init`` on one (``ssl_disabled``),
  each failing naming the setting. (PyMySQL 1.2 itself tries TLS when the server offers
  it, verifying nothing: a server with any certificate gets in, and a server without TLS
  gets the session in plain text. ``LEAFPOOL_DATABASE_TLS=true`` is what makes TLS
  required and verified.)
- With ``LEAFPOOL_DATABASE_TLS=true`` and the CA file, the same work (the CLI from the
  environment, the store's allocations, a worker ID of mode ``mysql``), each session
  encrypted (``Ssl_cipher``); a server certificate from another CA is refused naming
  ``LEAFPOOL_DATABASE_TLS_CA_FILE``; a ``REQUIRE X509`` user is refused without the
  client certificate and served with it.

Against the code before these settings the certificate tests fail: the settings are
ignored, PyMySQL verifies nothing (the other CA's server is accepted) and sends no client
certificate (the ``REQUIRE X509`` user is refused)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql
import pytest
from sqlalchemy import text

from leafpool.core.config import Settings, load_settings
from leafpool.core.errors import BackendUnavailable, WorkerIdUnavailable
from leafpool.runtime import Runtime
from leafpool.snowflake.registry import open_registry
from tests.support import services
from tests.support.processes import leafpool_env
from tests.support.tls import Pki

DB = "lp_tls"


@dataclass(frozen=True)
class TlsDatabase:
    server: services.Server
    pki: Pki

    def url(self, user: str) -> str:
        return f"mysql+pymysql://{user}:{user}-pw@127.0.0.1:{self.server.port}/{DB}"

    def sql(self, statement: str) -> None:
        subprocess.run([self.server.extra["client"], f"--socket={self.server.extra['socket']}",
                        "-uroot", "-e", statement], check=True, capture_output=True,
                       timeout=60)


@pytest.fixture(scope="module")
def db(pki: Pki) -> Iterator[TlsDatabase]:
    server = services.mariadb_server([f"--ssl-ca={pki.ca}",
                                      f"--ssl-cert={pki.file('server.crt')}",
                                      f"--ssl-key={pki.file('server.key')}"])
    found = TlsDatabase(server, pki)
    try:
        found.sql(f"CREATE DATABASE {DB};"
                  f"CREATE USER lp_ssl@'%' IDENTIFIED BY 'lp_ssl-pw' REQUIRE SSL;"
                  f"CREATE USER lp_x509@'%' IDENTIFIED BY 'lp_x509-pw' REQUIRE X509;"
                  f"GRANT ALL ON {DB}.* TO lp_ssl@'%'; GRANT ALL ON {DB}.* TO lp_x509@'%';")
        yield found
    finally:
        server.stop()


def _settings(url: str, tmp_path: Path, **tls: Any) -> Settings:
    return load_settings(database_url=url, snowflake_mode="mysql",
                         snowflake_cache_dir=str(tmp_path / "cache"), **tls)


def _with_tls(db: TlsDatabase, **more: Any) -> dict[str, Any]:
    return {"database_tls": True, "database_tls_ca_file": db.pki.ca, **more}


def _cipher(settings: Settings) -> str:
    store = Runtime(settings).store
    with store.engine.connect() as conn:
        row = conn.execute(text("SHOW STATUS LIKE 'Ssl_cipher'")).one()
    store.engine.dispose()
    return str(row[1])


def _db_init(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "leafpool.cli", "db", "init"], env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_client_without_tls_is_refused_naming_the_setting(db: TlsDatabase,
                                                            tmp_path: Path) -> None:
    # a plain client (PyMySQL with TLS off, as `mariadb --skip-ssl`)
    with pytest.raises(pymysql.err.OperationalError) as plain:
        pymysql.connect(host="127.0.0.1", port=db.server.port, user="lp_ssl",
                        password="lp_ssl-pw", database=DB, ssl_disabled=True)
    assert plain.value.args[0] == 1045  # Access denied
    # leafpool on such a connection: the store, mode mysql's registry, the CLI
    url = f"{db.url('lp_ssl')}?ssl_disabled=true"
    settings = _settings(url, tmp_path)
    with pytest.raises(BackendUnavailable) as caught:
        Runtime(settings).store.ping()
    assert "Access denied" in str(caught.value)
    assert "LEAFPOOL_DATABASE_TLS=true" in str(caught.value)
    assert "lp_ssl-pw" not in str(caught.value)
    registry = open_registry(settings, "host:tls:0", background=False)
    with pytest.raises(WorkerIdUnavailable) as refused:
        registry.claim()
    assert "Access denied" in str(refused.value)
    assert "LEAFPOOL_DATABASE_TLS=true" in str(refused.value)
    done = _db_init(leafpool_env(database_url=url, home=str(tmp_path / "home")))
    assert done.returncode != 0 and "LEAFPOOL_DATABASE_TLS=true" in done.stderr + done.stdout


def test_with_tls_leafpool_works_and_every_session_is_encrypted(db: TlsDatabase,
                                                                tmp_path: Path) -> None:
    env = leafpool_env(database_url=db.url("lp_ssl"), home=str(tmp_path / "home"),
                       database_tls="true", database_tls_ca_file=db.pki.ca)
    done = _db_init(env)
    assert done.returncode == 0, done.stderr
    settings = _settings(db.url("lp_ssl"), tmp_path, **_with_tls(db))
    assert _cipher(settings)  # not '': the session speaks TLS
    store = Runtime(settings).store
    store.add_tag("order", step=1000)
    first, second = store.allocate("order"), store.allocate("order")
    assert second.start > first.start
    registry = open_registry(settings, "host:tls:1", background=False)
    lease = registry.claim()
    assert 0 < lease.worker_id <= 1023
    registry.release()


def test_a_server_certificate_from_another_ca_is_refused_naming_the_ca_file(
    db: TlsDatabase, tmp_path: Path
) -> None:
    settings = _settings(db.url("lp_ssl"), tmp_path,
                         **_with_tls(db, database_tls_ca_file=db.pki.wrong_ca))
    with pytest.raises(BackendUnavailable) as caught:
        Runtime(settings).store.ping()
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)
    assert "LEAFPOOL_DATABASE_TLS_CA_FILE" in str(caught.value)


def test_a_user_that_requires_a_client_certificate_gets_in_with_it_only(
    db: TlsDatabase, tmp_path: Path
) -> None:
    without = _settings(db.url("lp_x509"), tmp_path, **_with_tls(db))
    with pytest.raises(BackendUnavailable) as caught:
        Runtime(without).store.ping()
    assert "Access denied" in str(caught.value)
    mutual = _settings(db.url("lp_x509"), tmp_path, **_with_tls(
        db, database_tls_cert_file=db.pki.client_cert,
        database_tls_key_file=db.pki.client_key))
    Runtime(mutual).store.ping()
    assert _cipher(mutual)

