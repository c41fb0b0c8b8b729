"""Who may call a served model: a bearer token required off loopback, read from the user's file
or made here and written 0600 under $DLSCALE_HOME, and compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

from dlscale.atomic import write_atomic
from dlscale.errors import UserError
from dlscale.home import dlscale_home

MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 4096
# A visible ASCII run with no spaces: what fits in an HTTP header after "Bearer " unchanged.
TOKEN_CHARS = frozenset(chr(c) for c in range(0x21, 0x7F))


@dataclass(frozen=True)
class BearerToken:
    """The token's SHA-256 only: that is what travels to Ray Serve's replicas (pickled into
    Ray's object store), so the token itself never leaves the process that read it."""

    sha256: bytes

    @classmethod
    def of(cls, token: str) -> BearerToken:
        return cls(hashlib.sha256(token.encode()).digest())

    def accepts(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header carries the token. Both sides are hashed first, so
        `compare_digest` compares two 32-byte strings and its time tells nothing of the token,
        not even its length."""
        if authorization is None:
            return False
        scheme, _, offered = authorization.partition(" ")
        if scheme.lower() != "bearer":  # RFC 6750 §2.1: the scheme is case-insensitive
            return False
        offered_sha256 = hashlib.sha256(offered.strip().encode("utf-8", "replace")).digest()
        return hmac.compare_digest(offered_sha256, self.sha256)


def required_token(
    host: str, port: int, token_file: Path | None
) -> tuple[BearerToken | None, Path | None]:
    """The token an endpoint on host:port requires, and the file it is in: the user's file;
    else, where the endpoint listens beyond this machine, a new one (Ray Serve's proxy has no
    authentication of its own: anyone who reaches the port could use the model and read its
    metrics); else, on loopback, none: only this machine reaches it (every user of it, though:
    on a shared machine give a token file)."""
    if token_file is not None:
        return BearerToken.of(read_token_file(token_file)), token_file
    if is_loopback(host):
        return None, None
    token, path = new_token_file(port)
    return BearerToken.of(token), path


def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine's loopback interface (127.0.0.0/8, ::1, or a
    name such as localhost that resolves to nothing else); 0.0.0.0 and :: listen on every
    interface, so they are not."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        resolved = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(resolved) and all(
        ipaddress.ip_address(address[4][0].split("%")[0]).is_loopback for address in resolved
    )


def read_token_file(path: Path) -> str:
    """The token in `path` (surrounding whitespace and a final newline dropped), or one line
    saying why it cannot be used."""
    try:
        with path.open("rb") as handle:  # a bounded read: /dev/zero or a huge file ends too
            raw = handle.read(MAX_TOKEN_CHARS + 3)
    except OSError as exc:
        raise UserError(f"--token-file {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise UserError(f"--token-file {path}: the token must be ASCII") from None
    if not MIN_TOKEN_CHARS <= len(token) <= MAX_TOKEN_CHARS:
        raise UserError(
            f"--token-file {path}: a token of {len(token)} characters; give "
            f"{MIN_TOKEN_CHARS}..{MAX_TOKEN_CHARS} (e.g. python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))')"
        )
    if not set(token) <= TOKEN_CHARS:
        raise UserError(
            f"--token-file {path}: the token has spaces or control characters; give one word"
        )
    return token


def new_token_file(port: int) -> tuple[str, Path]:
    """A fresh token (32 random bytes, URL-safe base64) written 0600 to
    $DLSCALE_HOME/serve-model/token-PORT, replacing the last one served on that port. Under
    the user's home, not the run folder: a run folder may be mounted read-only (the container)
    or copied to others with its results."""
    folder = dlscale_home() / "serve-model"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / f"token-{port}"
    token = secrets.token_urlsafe(32)
    # write_atomic's temporary file is made readable and writable by its owner
    # only (0600), and renamed over the old one: the token is never readable by others.
    write_atomic(path, lambda handle: handle.write(f"{token}\n".encode()))
    os.chmod(path, 0o600)
    return token, path
