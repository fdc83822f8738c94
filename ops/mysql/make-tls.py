"""TLS for docker-compose.yml's MySQL (its one-shot ``db-tls`` service, in the leafpool image):
a throwaway CA and a server certificate for the host name the services connect to, made
once, on the first ``up``.

    python make-tls.py SERVER_DIR CA_DIR HOST [UID]

SERVER_DIR (the ``db-tls-server`` volume, MySQL's alone) gets ``ca.crt``, ``server.crt``
and ``server.key`` (owned by UID, MySQL's user: 999, readable by it alone); CA_DIR (the
``db-tls-ca`` volume, mounted read-only by the leafpool services) gets ``ca.crt`` only.
The CA's private key is never written: no one can sign another certificate with it. When
both directories already hold their files, nothing changes (delete the volumes to make new
ones). Needs the ``cryptography`` package (the leafpool image has it: PyMySQL[rsa]).

For a database of your own, use its certificates instead (README, "Security")."""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

DAYS = 3650


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def make(server_dir: Path, ca_dir: Path, host: str, uid: int) -> bool:
    """The files, unless they are there; True when made."""
    wanted = [server_dir / "ca.crt", server_dir / "server.crt", server_dir / "server.key",
              ca_dir / "ca.crt"]
    if all(path.exists() for path in wanted):
        return False
    now = datetime.datetime.now(datetime.timezone.utc)
    until = now + datetime.timedelta(days=DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("leafpool compose CA"))
          .issuer_name(_name("leafpool compose CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now)
          .not_valid_after(until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                       crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False,
                                       decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(host)).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(until)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    ca_pem = ca.public_bytes(pem)
    server_dir.mkdir(parents=True, exist_ok=True)
    ca_dir.mkdir(parents=True, exist_ok=True)
    key_file = server_dir / "server.key"
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    (server_dir / "server.crt").write_bytes(cert.public_bytes(pem))
    (server_dir / "ca.crt").write_bytes(ca_pem)
    (ca_dir / "ca.crt").write_bytes(ca_pem)
    for path in wanted:
        path.chmod(0o600 if path == key_file else 0o644)
    if os.geteuid() == 0:
        for path in wanted[:3]:
            os.chown(path, uid, uid)
    return True


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5):
        print(__doc__, file=sys.stderr)
        return 2
    made = make(Path(argv[1]), Path(argv[2]), argv[3], int(argv[4]) if len(argv) == 5 else 999)
    print(f"{'made' if made else 'kept'} the MySQL TLS files for {argv[3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
