"""A throwaway PKI made with ``openssl`` for the TLS tests and the TLS benchmark: a CA, a
server certificate for 127.0.0.1 signed by it, a client certificate signed by it, and a
second CA that signed neither (the wrong CA). Certificates carry no extended key usage,
so a server certificate also serves as the client certificate Redis presents to its
master (replication) and Sentinel to the nodes it watches.

``tls_args`` gives a redis-server (or a sentinel) TLS only: no plain port.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.servers import NotInstalled


@dataclass(frozen=True)
class Pki:
    home: Path

    def file(self, name: str) -> str:
        return str(self.home / name)

    @property
    def ca(self) -> str:
        return self.file("ca.crt")

    @property
    def wrong_ca(self) -> str:
        return self.file("wrong-ca.crt")

    @property
    def client_cert(self) -> str:
        return self.file("client.crt")

    @property
    def client_key(self) -> str:
        return self.file("client.key")

    def tls_args(self, port: int, auth_clients: str = "yes") -> list[str]:
        """redis-server arguments: TLS on ``port``, no plain port; ``auth_clients``:
        Redis's ``tls-auth-clients`` (``yes``: a client certificate is required)."""
        return ["--port", "0", "--tls-port", str(port),
                "--tls-cert-file", self.file("server.crt"),
                "--tls-key-file", self.file("server.key"),
                "--tls-ca-cert-file", self.ca, "--tls-auth-clients", auth_clients]

    def tls_conf(self, port: int) -> str:
        """The same, as lines of a config file (Sentinel reads only its file)."""
        return (f"port 0\ntls-port {port}\ntls-cert-file {self.file('server.crt')}\n"
                f"tls-key-file {self.file('server.key')}\ntls-ca-cert-file {self.ca}\n"
                "tls-auth-clients yes\ntls-replication yes\n")

    def settings_env(self, mutual: bool = True) -> dict[str, str]:
        """LEAFPOOL_REDIS_TLS_* for this PKI (``mutual``: with the client certificate)."""
        env = {"LEAFPOOL_REDIS_TLS_CA_FILE": self.ca}
        if mutual:
            env |= {"LEAFPOOL_REDIS_TLS_CERT_FILE": self.client_cert,
                    "LEAFPOOL_REDIS_TLS_KEY_FILE": self.client_key}
        return env

    def client_options(self) -> dict[str, object]:
        """redis-py's options for a test's own admin client."""
        return {"ssl": True, "ssl_ca_certs": self.ca, "ssl_certfile": self.client_cert,
                "ssl_keyfile": self.client_key}


def _openssl(home: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=home, check=True, capture_output=True, timeout=60)


def _ca(home: Path, name: str) -> None:
    _openssl(home, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
             "-subj", f"/CN=leafpool test {name}")


def _signed(home: Path, name: str, ca: str, san: str) -> None:
    _openssl(home, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN=leafpool test {name}")
    (home / f"{name}.ext").write_text(f"subjectAltName={san}\n")
    _openssl(home, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey",
             f"{ca}.key", "-CAcreateserial", "-out", f"{name}.crt", "-days", "2",
             "-extfile", f"{name}.ext")


def make_pki(home: Path) -> Pki:
    """The CA, the server and client certificates and the wrong CA, under ``home``."""
    if shutil.which("openssl") is None:
        raise NotInstalled("openssl")
    home.mkdir(parents=True, exist_ok=True)
    _ca(home, "ca")
    _ca(home, "wrong-ca")
    _signed(home, "server", "ca", "IP:127.0.0.1,DNS:localhost")
    _signed(home, "client", "ca", "DNS:leafpool-client")
    return Pki(home)
