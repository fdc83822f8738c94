"""docker-compose.yml's MySQL TLS, run for real outside a container (as
tests/system/test_compose_redis.py runs its Redis): the ``db-tls`` service's own command
makes the files (with the venv's Python, which has ``cryptography`` as the image does),
a MariaDB starts with the ``mysql`` service's arguments (container paths mapped to the
test's directories), and the ``migrate`` service's own environment runs ``leafpool db
init`` over TLS, verifying the server's certificate and its name. The compose host name
``mysql`` is mapped to ``localhost`` on both sides (the certificate's name and the URL's
host), so the name check stays on.

- The files: the server's key readable by its owner alone, the CA volume holding the CA's
  certificate and nothing else, the CA's private key nowhere; a second run keeps them.
- A client without TLS is refused whatever its user (``require_secure_transport``); a
  client trusting another CA is refused; the services' settings get in, encrypted."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest

from leafpool.core.config import load_settings
from leafpool.core.errors import BackendUnavailable
from leafpool.runtime import Runtime
from tests.support import services
from tests.support.tls import Pki
from tests.system.test_compose import SECRETS, compose_config

pytestmark = pytest.mark.timeout(300)

CA_FILE = "/etc/leafpool/db-tls/ca.crt"


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    found: dict[str, Any] = compose_config(tmp_path_factory.mktemp("compose"),
                                           SECRETS)["services"]
    return found


def _make_tls(config: dict[str, Any], server_dir: Path, ca_dir: Path) -> str:
    """The db-tls service's command, its paths mapped, the host name ``localhost``."""
    command = list(config["db-tls"]["command"])
    assert command[:2] == ["python", "/opt/leafpool/make-tls.py"]
    assert command[2:] == ["/tls/server", "/tls/ca", "mysql", "999"]
    script = services.ROOT / "ops" / "mysql" / "make-tls.py"
    done = subprocess.run([sys.executable, str(script), str(server_dir), str(ca_dir),
                           "localhost", str(os.geteuid())],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def tls_dirs(config: dict[str, Any],
             tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("db-tls")
    server_dir, ca_dir = base / "server", base / "ca"
    assert _make_tls(config, server_dir, ca_dir).startswith("made")
    return server_dir, ca_dir


@pytest.fixture(scope="module")
def mysql(config: dict[str, Any], tls_dirs: tuple[Path, Path]) -> Iterator[services.Server]:
    server_dir, _ = tls_dirs
    args = [arg.replace("/etc/mysql/tls", str(server_dir))
            for arg in config["mysql"]["command"]]
    server = services.mariadb_server(args)
    env = config["mysql"]["environment"]
    subprocess.run([server.extra["client"], f"--socket={server.extra['socket']}", "-uroot",
                    "-e", f"CREATE DATABASE {env['MYSQL_DATABASE']}; CREATE USER "
                    f"{env['MYSQL_USER']}@'%' IDENTIFIED BY '{env['MYSQL_PASSWORD']}'; "
                    f"GRANT ALL ON {env['MYSQL_DATABASE']}.* TO {env['MYSQL_USER']}@'%'"],
                   check=True, capture_output=True, timeout=60)
    yield server
    server.stop()


def _service_env(config: dict[str, Any], name: str, mysql: services.Server,
                 ca_dir: Path, home: Path) -> dict[str, str]:
    """The service's LEAFPOOL_* environment with the CA's path and MySQL's address mapped."""
    env = {k: v for k, v in config[name]["environment"].items() if k.startswith("LEAFPOOL_")}
    assert env["LEAFPOOL_DATABASE_TLS_CA_FILE"] == CA_FILE
    assert "@mysql:3306/" in env["LEAFPOOL_DATABASE_URL"]
    env["LEAFPOOL_DATABASE_TLS_CA_FILE"] = str(ca_dir / "ca.crt")
    env["LEAFPOOL_DATABASE_URL"] = env["LEAFPOOL_DATABASE_URL"].replace(
        "@mysql:3306/", f"@localhost:{mysql.port}/")
    env["LEAFPOOL_HOME"] = str(home)
    return env


def test_db_tls_makes_the_files_once_and_keeps_the_ca_key_nowhere(
    config: dict[str, Any], tls_dirs: tuple[Path, Path]
) -> None:
    server_dir, ca_dir = tls_dirs
    assert sorted(p.name for p in server_dir.iterdir()) == ["ca.crt", "server.crt",
                                                            "server.key"]
    assert sorted(p.name for p in ca_dir.iterdir()) == ["ca.crt"]
    assert stat.S_IMODE((server_dir / "server.key").stat().st_mode) == 0o600
    assert (ca_dir / "ca.crt").read_bytes() == (server_dir / "ca.crt").read_bytes()
    for path in [*server_dir.iterdir(), *ca_dir.iterdir()]:
        if path.name != "server.key":
            assert b"PRIVATE KEY" not in path.read_bytes(), path
    before = (server_dir / "server.crt").read_bytes()
    assert _make_tls(config, server_dir, ca_dir).startswith("kept")
    assert (server_dir / "server.crt").read_bytes() == before


def test_a_client_without_tls_is_refused_whatever_its_user(
    config: dict[str, Any], mysql: services.Server
) -> None:
    env = config["mysql"]["environment"]
    with pytest.raises(pymysql.err.OperationalError) as refused:
        pymysql.connect(host="127.0.0.1", port=mysql.port, user=env["MYSQL_USER"],
                        password=env["MYSQL_PASSWORD"], ssl_disabled=True)
    # MariaDB says Access denied (1045), MySQL "insecure transport" (3159); the same user
    # and password get in over TLS (below)
    assert refused.value.args[0] in (1045, 3159), refused.value


def test_the_services_settings_reach_mysql_over_verified_tls(
    config: dict[str, Any], mysql: services.Server, tls_dirs: tuple[Path, Path],
    tmp_path: Path, pki: Pki,
) -> None:
    _, ca_dir = tls_dirs
    env = _service_env(config, "migrate", mysql, ca_dir, tmp_path / "home")
    done = subprocess.run([sys.executable, "-m", "leafpool.cli", "db", "init"],
                          env={k: v for k, v in os.environ.items()
                               if not k.startswith("LEAFPOOL_")} | env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for name in ("segment-worker", "http"):
        settings = load_settings(**{k.removeprefix("LEAFPOOL_").lower(): v for k, v in
                                    _service_env(config, name, mysql, ca_dir,
                                                 tmp_path / "home").items()})
        assert settings.database_tls_used is not None
        Runtime(settings).store.ping()
    # a client trusting another CA (a server it cannot verify) is refused
    wrong = {k.removeprefix("LEAFPOOL_").lower(): v for k, v in env.items()}
    wrong["database_tls_ca_file"] = pki.wrong_ca
    with pytest.raises(BackendUnavailable) as refused:
        Runtime(load_settings(**wrong)).store.ping()
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
