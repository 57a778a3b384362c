"""The credentials of a Flower deployment, made by the project (``cryptography``, which Flower
depends on): ``python -m fedssl.flower credentials [DIR] --host NAME... --nodes N``.

Into ``DIR`` (by default ``~/.config/fedssl/flower-credentials``, outside any project; a folder
git would offer for a commit is refused), readable by their owner only where private:

- ``ca.crt`` / ``ca.key``: a certificate authority of this deployment alone. Every party gets
  ``ca.crt`` (it verifies the SuperLink); ``ca.key`` stays where it was made.
- ``superlink.crt`` / ``superlink.key``: the SuperLink's TLS certificate, signed by the CA,
  valid for ``localhost``, ``127.0.0.1`` and every ``--host`` (the names and addresses the
  nodes and the submitter dial).
- ``node-K.key`` / ``node-K.pub``: SuperNode K's key pair (EC P-384, OpenSSH format, as Flower's
  SuperNode authentication wants). The SuperLink accepts only nodes whose public key was
  registered (``flwr supernode register node-K.pub``); node K's machine gets ``node-K.key``.
- ``control.token``: the secret that opens the SuperLink's Control API (``flwr run``, ``flwr
  ls``, ``flwr supernode register``); the SuperLink keeps only ``control.sha256``.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import secrets
import subprocess
from pathlib import Path

from fedssl.stage.runtime import StageFailed

CA, SUPERLINK, TOKEN, TOKEN_DIGEST = "ca", "superlink", "control.token", "control.sha256"
VALID_DAYS = 365


def node_key(folder: Path, node: int) -> Path:
    return Path(folder) / f"node-{node}.key"


def make(folder: Path | str, hosts: list[str], nodes: int) -> Path:
    """Write a new CA, the SuperLink's certificate for ``hosts``, ``nodes`` node key pairs and
    a Control API token into ``folder``; refuses a folder that already holds a CA."""
    from cryptography.hazmat.primitives.asymmetric import ec

    folder = Path(folder).expanduser()
    if (folder / f"{CA}.key").exists():
        raise FileExistsError(f"{folder} already holds credentials ({CA}.key): use another folder")
    if committable(folder):
        raise StageFailed(
            f"{folder} is in a git repository that does not ignore it: its keys and token "
            "could be committed; choose a folder outside the repository (the default) or "
            "git-ignore it"
        )
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_cert = _certificate("fedssl deployment CA", ca_key.public_key(), ca_key, None, [])
    _write_pair(folder, CA, ca_key, ca_cert)
    key = ec.generate_private_key(ec.SECP384R1())
    names = ["localhost", "127.0.0.1", *hosts]
    _write_pair(folder, SUPERLINK, key, _certificate("fedssl SuperLink", key.public_key(),
                                                     ca_key, ca_cert, names))  # fmt: skip
    for k in range(nodes):
        _write_node_key(folder, k)
    token = secrets.token_urlsafe(32)
    _write(folder / TOKEN, token.encode(), private=True)
    _write(folder / TOKEN_DIGEST, digest(token).encode(), private=False)
    return folder


def committable(folder: Path) -> bool:
    """Whether git would offer files written into ``folder`` for a commit: it lies in a git
    work tree that does not ignore it (``git check-ignore`` exits 1; 0 is ignored, 128 no
    repository)."""
    probe = Path(folder).resolve() / f"{CA}.key"
    where = next(p for p in probe.parents if p.is_dir())
    try:
        check = subprocess.run(["git", "check-ignore", "-q", str(probe)], cwd=where,
                               capture_output=True)  # fmt: skip
    except FileNotFoundError:  # no git here: nothing to commit with
        return False
    return check.returncode == 1


def digest(token: str) -> str:
    return hashlib.sha256(token.strip().encode()).hexdigest()


def _certificate(name: str, public_key, signer, issuer, names: list[str]):
    """A CA certificate (``issuer`` None: self-signed) or a server certificate for ``names``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject if issuer is None else issuer.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is not None:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_alt_name(n) for n in dict.fromkeys(names)]),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    return builder.sign(signer, hashes.SHA384())


def _alt_name(name: str):
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _write_pair(folder: Path, stem: str, key, cert) -> None:
    from cryptography.hazmat.primitives import serialization

    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write(folder / f"{stem}.key", pem, private=True)
    _write(folder / f"{stem}.crt", cert.public_bytes(serialization.Encoding.PEM), private=False)


def _write_node_key(folder: Path, node: int) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    _write(node_key(folder, node), private, private=True)
    _write(node_key(folder, node).with_suffix(".pub"), public + b"\n", private=False)


def _write(path: Path, data: bytes, private: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
