"""The service's secrets, without a database: the server key, password hashes, token and session
values and their HMAC digests, roles, and durations such as "30d".

Only digests are stored: a token or session value is random, so HMAC-SHA256 under the server's
key (DIR/secret) is enough, and a stolen database without that file opens nothing. Passwords are
chosen by people, so they get a slow, salted hash (argon2id).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
import stat
import string
from pathlib import Path

from argon2 import PasswordHasher
from argon2.exceptions import Argon2Error, InvalidHashError

from dlscale import units
from dlscale.atomic import temp_beside
from dlscale.errors import UserError, os_reason

SECRET_BYTES = 32
ROLES = {"viewer": 1, "editor": 2, "owner": 3}
SCOPES = ("read", "write")
TOKEN_PREFIX_HEX = 8
TOKEN_SECRET_CHARS = 43  # of 62 letters and digits: 256 random bits
TOKEN_PATTERN = re.compile(r"dls_([0-9a-f]{8})_([A-Za-z0-9]{43})")
# No '_' or '-' in the secret part: the text splits on '_' unambiguously, and a double click
# selects the whole token.
_ALPHANUMERIC = string.ascii_letters + string.digits

_hasher = PasswordHasher()


def load_secret(data_dir: Path) -> bytes:
    """The server's HMAC key, DIR/secret: made on first use (32 random bytes, mode 0600)."""
    path = Path(data_dir) / "secret"
    if not path.exists():
        _create_secret(path)
    try:
        mode = path.stat().st_mode
        key = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read the service's secret: {os_reason(exc)}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        # As ssh does with private keys: anyone who reads it can forge nothing yet, but can
        # check guessed tokens offline against a copied database.
        raise UserError(f"{path}: readable by other users (mode {mode & 0o777:o}); chmod 600 it")
    if len(key) != SECRET_BYTES:
        raise UserError(f"{path}: holds {len(key)} bytes, expected {SECRET_BYTES}")
    return key


def _create_secret(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with temp_beside(path) as (handle, staged):  # 0600, removed if a stop lands here
        handle.write(secrets.token_bytes(SECRET_BYTES))
        handle.flush()
        os.fsync(handle.fileno())
        # Never replaces: a server started at the same time may have won; its key stands.
        with contextlib.suppress(FileExistsError):
            os.link(staged, path)
        os.unlink(staged)


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(password_hash: str, password: str) -> bool:
    try:
        return _hasher.verify(password_hash, password)
    except (Argon2Error, InvalidHashError):
        return False


def new_password() -> str:
    return secrets.token_urlsafe(15)  # 20 characters, 120 random bits


def digest(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def same_digest(key: bytes, text: str, stored: str) -> bool:
    """Whether `text` has the stored digest, in time that does not depend on where they differ."""
    return hmac.compare_digest(digest(key, text), stored)


def new_token() -> tuple[str, str]:
    """(text, prefix): `dls_<8 hex>_<43 letters and digits>`; the prefix names the token."""
    prefix = secrets.token_hex(TOKEN_PREFIX_HEX // 2)
    secret = "".join(secrets.choice(_ALPHANUMERIC) for _ in range(TOKEN_SECRET_CHARS))
    return f"dls_{prefix}_{secret}", prefix


def parse_token(text: str) -> str | None:
    """The prefix of a well-formed token, else None."""
    found = TOKEN_PATTERN.fullmatch(text) if isinstance(text, str) else None
    return found.group(1) if found else None


def new_session() -> tuple[str, str]:
    """(session id for the cookie, CSRF value the pages send back in a header)."""
    return secrets.token_urlsafe(32), secrets.token_urlsafe(32)


def check_role(role: str) -> str:
    if role not in ROLES:
        raise UserError(f"role '{role}' is not one of {', '.join(ROLES)}")
    return role


def role_at_least(role: str | None, needed: str) -> bool:
    return role in ROLES and ROLES[role] >= ROLES[needed]


def parse_duration(text: str) -> float:
    """Seconds in "30d", "12h", "90m" or "3600s" (a whole or decimal number, then a unit)."""
    try:
        return units.parse_duration(text)
    except ValueError as exc:
        raise UserError(f"duration {exc}") from None
