"""`fedistill deploy credentials`: everything an operator hands out for an authenticated deployment.

Given the site names (in partition order) and the SuperLink's host names, it writes under `--out`:

    ca/ca.key                      the CA's private key: keep it offline (needed only to renew the
                                   SuperLink's certificate)
    superlink/ca.crt, server.pem,  the SuperLink's TLS certificate (signed by the CA) and key
    superlink/server.key
    enrolment.toml                 each site's fixed partition and public key (for the SuperLink's
                                   FEDISTILL_ENROLMENT; enrolment.py)
    sites/<name>/<name>.key        the site's authentication private key (OpenSSH, ECDSA P-384, 0600)
    sites/<name>/<name>.pub        its public key, enrolled at the SuperLink with `flwr supernode register`
    sites/<name>/ca.crt            the CA certificate the site verifies the SuperLink with

Flower authenticates SuperNodes with ECDSA keys on a NIST curve; the TLS keys are ECDSA P-384 too.
Nothing is overwritten: any of these files already in `--out` stops the command before
anything is written.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedistill.engine.flower.enrolment import Enrolment, Site
from fedistill.errors import ConfigError

ENROLMENT_FILE = "enrolment.toml"
CA_NAME = "fedistill deployment CA"
#: A DNS name (labels of letters, digits, '-' and '_'; a leading '*.' for a wildcard).
DNS_NAME = re.compile(r"^(\*\.)?[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?$")


@dataclass(frozen=True)
class Credentials:
    """Where `make_credentials` wrote each file."""

    root: Path
    ca_key: Path
    ca_cert: Path
    server_cert: Path
    server_key: Path
    enrolment: Path
    site_keys: dict[str, Path]  # site name -> private key
    site_public_keys: dict[str, Path]


def make_credentials(sites: list[str], hosts: list[str], out: Path, *, days: int = 365) -> Credentials:
    """A CA, the SuperLink's TLS certificate for `hosts`, a key pair per site, and the enrolment that
    gives site i partition i."""
    if not sites:
        raise ConfigError("name at least one site")
    if not hosts:
        raise ConfigError("name the SuperLink's host (--superlink-host), as the sites will address it")
    for host in hosts:
        _check_host(host)
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ConfigError(f"--days {days}: the certificates must be valid for at least 1 day")
    out = Path(out)
    paths = _paths(out, sites)
    existing = [path for path in _targets(paths) if path.exists() or path.is_symlink()]
    if existing:  # an earlier run's keys (or another tool's) are never replaced, not even in part
        more = f" (and {len(existing) - 1} more of the files it would write)" if len(existing) > 1 else ""
        raise ConfigError(f"{existing[0]} exists already{more}: choose another --out folder")
    x509, hashes, serialization, ec = _crypto()
    keys = {name: ec.generate_private_key(ec.SECP384R1()) for name in sites}
    public = {
        name: key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        for name, key in keys.items()
    }
    enrolment = Enrolment(
        tuple(Site(name, i, f"{public[name].decode()} {name}") for i, name in enumerate(sites))
    )  # checks the names and keys before anything is written

    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days))
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_cert = _certificate(x509, hashes, CA_NAME, ca_key, ca_key, valid, ca=True)
    server_key = ec.generate_private_key(ec.SECP384R1())
    common_name = hosts[0] if len(hosts[0]) <= 64 else "fedistill SuperLink"  # a CN holds 64 characters
    server_cert = _certificate(x509, hashes, common_name, server_key, ca_key, valid, ca=False, hosts=hosts)

    pem = serialization.Encoding.PEM
    creds = paths
    _write(creds.ca_key, _private_pem(serialization, ca_key), secret=True)
    _write(creds.ca_cert, ca_cert.public_bytes(pem))
    _write(creds.server_cert, server_cert.public_bytes(pem))
    _write(creds.server_key, _private_pem(serialization, server_key), secret=True)
    for name, key in keys.items():
        ssh_format = serialization.PrivateFormat.OpenSSH
        private = key.private_bytes(serialization.Encoding.PEM, ssh_format, serialization.NoEncryption())
        _write(creds.site_keys[name], private, secret=True)
        _write(creds.site_public_keys[name], public[name] + f" {name}\n".encode())
        _write(creds.site_keys[name].parent / "ca.crt", ca_cert.public_bytes(pem))
    _write(creds.enrolment, enrolment.to_toml().encode())
    return creds


def _paths(out: Path, sites: list[str]) -> Credentials:
    return Credentials(
        root=out,
        ca_key=out / "ca" / "ca.key",
        ca_cert=out / "superlink" / "ca.crt",
        server_cert=out / "superlink" / "server.pem",
        server_key=out / "superlink" / "server.key",
        enrolment=out / ENROLMENT_FILE,
        site_keys={name: out / "sites" / name / f"{name}.key" for name in sites},
        site_public_keys={name: out / "sites" / name / f"{name}.pub" for name in sites},
    )


def _targets(creds: Credentials) -> list[Path]:
    """Every file `make_credentials` writes."""
    fixed = [creds.ca_key, creds.ca_cert, creds.server_cert, creds.server_key]
    per_site = [
        path
        for name, key in creds.site_keys.items()
        for path in (key, creds.site_public_keys[name], key.parent / "ca.crt")
    ]
    return [*fixed, *per_site, creds.enrolment]


def next_steps(creds: Credentials, port: int = 9092, host: str = "HOST") -> str:
    """The commands the operator and each site run next (docs/how-to/flower.md explains them); `host` is
    the name the sites use for the SuperLink."""
    link = creds.server_cert.parent
    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    lines = [
        f"wrote {creds.root}: keep {creds.ca_key} offline; send each site its folder sites/<name>/ securely",
        "operator (SuperLink machine; --host 0.0.0.0: Flower's SuperLink listens on 127.0.0.1 otherwise):",
        f"  FEDISTILL_ENROLMENT={creds.enrolment.resolve()} flower-superlink --enable-supernode-auth "
        f"--ssl-ca-certfile {link / 'ca.crt'} --ssl-certfile {creds.server_cert} "
        f"--ssl-keyfile {creds.server_key} --host 0.0.0.0 --port {port} "
        "--disable-runtime-dependency-installation",
        "  # $FLWR_HOME/config.toml (the connection `flwr` uses):",
        f'  #   [superlink.deploy]  address = "{address}"  root-certificates = "{creds.ca_cert.resolve()}"',
    ]
    for name, pub in creds.site_public_keys.items():
        lines.append(f"  flwr supernode register {pub} deploy --name {name}")
    lines.append("each site:")
    lines.append(
        f"  flower-supernode --superlink {address} --root-certificates ca.crt "
        "--auth-supernode-private-key <name>.key --node-config \"data-dir='...' state-dir='...'\""
    )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's options (`fedistill deploy credentials`)."""
    parser.add_argument("sites", nargs="+", help="site names, in partition order (site i holds partition i)")
    parser.add_argument(
        "--superlink-host",
        action="append",
        required=True,
        help="a DNS name or IP address the sites use for the SuperLink (repeatable; the first is the CN)",
    )
    parser.add_argument("--out", type=Path, required=True, help="an empty or new folder for the files")
    parser.add_argument("--days", type=int, default=365, help="validity of the certificates (default 365)")


def run_command(args: argparse.Namespace) -> int:
    """Write the credentials; 0 on success, 2 with one line on stderr when the input cannot be used."""
    try:
        creds = make_credentials(list(args.sites), list(args.superlink_host), args.out, days=args.days)
    except ConfigError as exc:
        print(f"fedistill: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # an --out folder that cannot be made or written
        where = exc.filename or args.out
        print(
            f"fedistill: error: cannot write {where}: {exc.strerror or exc}; choose another --out",
            file=sys.stderr,
        )
        return 2
    print(next_steps(creds, host=args.superlink_host[0]))
    return 0


# --- helpers ---------------------------------------------------------------------------------------
def _certificate(
    x509: Any,
    hashes: Any,
    common_name: str,
    key: Any,
    issuer_key: Any,
    valid: tuple[datetime.datetime, datetime.datetime],
    *,
    ca: bool,
    hosts: list[str] | None = None,
) -> Any:
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    issuer = (
        subject if ca else x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedistill deployment CA")])
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if ca:
        usage = dict.fromkeys(
            ("content_commitment", "key_encipherment", "data_encipherment", "key_agreement"), False
        )
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False, **usage,
            ),
            critical=True,
        )  # fmt: skip
    else:
        builder = (
            builder.add_extension(
                x509.SubjectAlternativeName([_san(x509, h) for h in hosts or []]), critical=False
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
            )
        )
    return builder.sign(issuer_key, hashes.SHA384())


def _ip(host: str) -> Any:
    """The IP address `host` names (IPv6 with or without brackets), else None."""
    try:
        return ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
    except ValueError:
        return None


def _check_host(host: str) -> None:
    """A host the certificate can name: an IP address or a DNS name, without a scheme or a port (a site
    that connects to `link:9092` verifies the name `link`, so a certificate for `link:9092` fails it)."""
    if _ip(host) is not None:
        return
    if "://" in host or ":" in host:
        raise ConfigError(
            f"--superlink-host {host!r}: give the host name or address alone, without its port or scheme "
            "(the port is the SuperLink's --port)"
        )
    if not DNS_NAME.match(host) or len(host) > 253:
        raise ConfigError(f"--superlink-host {host!r}: not a DNS name or an IP address")


def _san(x509: Any, host: str) -> Any:
    ip = _ip(host)
    return x509.IPAddress(ip) if ip is not None else x509.DNSName(host)


def _private_pem(serialization: Any, key: Any) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, *, secret: bool = False) -> None:
    """A new file (an existing one is never replaced: its mode would stay what it was); private keys are
    created readable by their owner only (never briefly wider)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _crypto() -> tuple[Any, Any, Any, Any]:
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError:
        raise ConfigError("the `cryptography` package is missing: pip install 'fedistill[flower]'") from None
    return x509, hashes, serialization, ec
