"""Test certificates for TLS and keys for SuperNode authentication (Flower 1.41).

For trying a deployment, not for production (use your organisation's CA there):

- `ca.crt` / `ca.key`: a self-signed certificate authority (RSA 2048, 1 year);
- `server.crt` / `server.key`: the SuperLink's certificate, signed by the CA, valid for the
  given host names / IP addresses (subject alternative names) — every name the SuperNodes
  and `flwr` use to reach the SuperLink must be listed;
- `node_<i>` / `node_<i>.pub`: one ECDSA P-384 key pair per SuperNode in OpenSSH format,
  which is what `flower-supernode --auth-supernode-private-key` loads and
  `flwr supernode register` accepts.

Written with the `cryptography` package (a Flower dependency), so no openssl is needed.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

VALID_DAYS = 365

TLS_FILES = {"ca": "ca.crt", "ca_key": "ca.key", "server_cert": "server.crt",
             "server_key": "server.key"}
"""The files of `make_tls`, by key of the dict it returns."""

_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_DNS = re.compile(rf"^(\*\.)?{_LABEL}(\.{_LABEL})*\.?$")


def host_problem(host: str) -> str | None:
    """Why `host` cannot be a name of the server certificate (None: it can): a TLS client
    matches the bare name or IP address it connects to, never a port, scheme or path."""
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    if _DNS.match(host) and len(host) <= 253:
        return None
    bare = re.sub(r"^[a-z]+://", "", host).split("/")[0]
    bare = re.sub(r":\d+$", "", bare).strip("[]")
    hint = f"; give {bare!r}" if bare != host and host_problem(bare) is None else ""
    return (f"{host!r} is not a host name or IP address (letters, digits, '-' and '.', "
            f"no port, scheme or path){hint}")


def files(nodes: int) -> list[str]:
    """The names of the files `make_tls` and `make_node_keys(..., nodes)` write."""
    return [*TLS_FILES.values(), *(f"node_{i}{ext}" for i in range(nodes)
                                   for ext in ("", ".pub"))]


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


def _write_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def make_tls(out: str | Path, hosts: list[str]) -> dict[str, Path]:
    """CA and SuperLink server certificate for `hosts` in `out`; returns the paths."""
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca = (x509.CertificateBuilder().subject_name(_name("clusterfl test CA"))
          .issuer_name(_name("clusterfl test CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now)
          .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (x509.CertificateBuilder().subject_name(_name(hosts[0]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
            .add_extension(_san(hosts), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    paths = {key: d / name for key, name in TLS_FILES.items()}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_key(paths["ca_key"], ca_key)
    paths["server_cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(paths["server_key"], key)
    return paths


def make_node_keys(out: str | Path, n: int) -> list[tuple[Path, Path]]:
    """`n` SuperNode key pairs `(private, public)` in OpenSSH format in `out`."""
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    pairs = []
    for i in range(n):
        key = ec.generate_private_key(ec.SECP384R1())
        priv, pub = d / f"node_{i}", d / f"node_{i}.pub"
        priv.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.OpenSSH,
                                           serialization.NoEncryption()))
        priv.chmod(0o600)
        pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                      serialization.PublicFormat.OpenSSH))
        pairs.append((priv, pub))
    return pairs
