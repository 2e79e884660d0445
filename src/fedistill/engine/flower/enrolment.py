"""The operator's enrolment of an authenticated deployment: which site holds which partition.

Each site authenticates to the SuperLink with its own ECDSA key pair (Flower's SuperNode
authentication), and the SuperLink binds the node id it hands out to that public key. The enrolment
file maps each public key to a site name and a fixed partition id, so the ServerApp can tell which
node is which site without trusting anything the node says about itself. The operator writes it
with `fedistill deploy credentials` (credentials.py) and gives it to the SuperLink's environment:

    FEDISTILL_ENROLMENT=/path/enrolment.toml flower-superlink --enable-supernode-auth ...

    [[site]]
    name = "hospital-a"
    partition-id = 0
    public-key = "ecdsa-sha2-nistp384 AAAA... hospital-a"
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedistill.errors import ConfigError

#: The SuperLink's environment variable that names the enrolment file of a deployment.
ENROLMENT_ENV = "FEDISTILL_ENROLMENT"
#: The transport header key with which the server tells a node the partition it is enrolled for.
ASSIGNED_PARTITION = "partition-id"
SITE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class Site:
    """One enrolled site: its name, its fixed partition, and its public key (one OpenSSH line)."""

    name: str
    partition: int
    public_key: str


@dataclass(frozen=True)
class Enrolment:
    """Every enrolled site, checked: unique names and keys, partitions exactly 0..n-1."""

    sites: tuple[Site, ...]

    def __post_init__(self) -> None:
        names = [site.name for site in self.sites]
        for name in names:
            if not SITE_NAME.match(name):
                raise ConfigError(f"site name {name!r}: use letters, digits, '.', '_' or '-' (at most 64)")
        if len(set(names)) != len(names):
            raise ConfigError(f"enrolment: a site name appears twice in {names}")
        partitions = sorted(site.partition for site in self.sites)
        if partitions != list(range(len(self.sites))):
            raise ConfigError(f"enrolment: partitions must be 0..{len(self.sites) - 1}, got {partitions}")
        identities = [key_identity(site.public_key) for site in self.sites]
        if len(set(identities)) != len(identities):
            raise ConfigError("enrolment: two sites share one public key")
        object.__setattr__(self, "_by_identity", dict(zip(identities, self.sites, strict=True)))

    def site_for_key(self, public_key: bytes | str) -> Site | None:
        """The site that holds `public_key` (OpenSSH, PEM or DER), or None if it is not enrolled."""
        try:
            identity = key_identity(public_key)
        except ConfigError:
            return None
        return self._by_identity.get(identity)  # type: ignore[attr-defined]

    def to_toml(self) -> str:
        lines = ["# fedistill enrolment: each site's fixed partition, bound to its authentication key."]
        for site in sorted(self.sites, key=lambda s: s.partition):
            lines += [
                "",
                "[[site]]",
                f"name = {json.dumps(site.name)}",
                f"partition-id = {site.partition}",
                f"public-key = {json.dumps(site.public_key)}",
            ]
        return "\n".join(lines) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "enrolment") -> Enrolment:
        rows = data.get("site")
        if not isinstance(rows, list) or not rows:
            raise ConfigError(f"{source}: no [[site]] tables")
        try:
            sites = tuple(
                Site(str(row["name"]), int(row["partition-id"]), str(row["public-key"]).strip())
                for row in rows
            )
        except (KeyError, TypeError, ValueError) as exc:
            needs = "every [[site]] needs name, partition-id and public-key"
            raise ConfigError(f"{source}: {needs} ({exc})") from None
        for row, site in zip(rows, sites, strict=True):
            value = row["partition-id"]
            if isinstance(value, bool) or not isinstance(value, int):  # int() took 1.7 or "1" as 1
                raise ConfigError(
                    f"{source}: site {site.name!r}: partition-id must be a whole number, got {value!r}"
                )
        return cls(sites)


def load_enrolment(path: Path) -> Enrolment:
    """Read and check an enrolment file (one-line ConfigError when it cannot be used)."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read the enrolment file {path}: {exc}") from None
    return Enrolment.from_dict(data, source=str(path))


def enrolment_from_environment() -> Path | None:
    """The enrolment file named by the SuperLink's environment, or None for an open deployment."""
    value = os.environ.get(ENROLMENT_ENV, "").strip()
    return Path(value) if value else None


def key_identity(public_key: bytes | str) -> bytes:
    """A public key in a canonical form (DER SubjectPublicKeyInfo) whatever its encoding: an OpenSSH
    line (the enrolment, `flwr supernode register`), PEM (what the SuperLink reports) or DER."""
    serialization, ec = _crypto()
    data = public_key.encode() if isinstance(public_key, str) else bytes(public_key)
    try:
        if data.startswith(b"ecdsa-") or data.startswith(b"ssh-"):
            key = serialization.load_ssh_public_key(data)
        elif data.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(data)
        else:
            key = serialization.load_der_public_key(data)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"not a public key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ConfigError(f"Flower authenticates SuperNodes with ECDSA keys, not {type(key).__name__}")
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _crypto() -> tuple[Any, Any]:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError:
        raise ConfigError("the `cryptography` package is missing: pip install 'fedistill[flower]'") from None
    return serialization, ec
