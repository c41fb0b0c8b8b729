"""Joining a Ray cluster that asks for a token: ask its head once before ray.init, say why not.

Ray 2.60's `ray start --head` turns token authentication on whenever the head has a token
(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token), but `ray.init(address=HOST:PORT)`
sends one only when RAY_AUTH_MODE=token is set; without it the driver retries for 20 s, printing
InvalidAuthToken warnings, and then fails without naming the token. So before ray.init we make one
request to the head (milliseconds): if it refuses us for want of a token, we turn token mode on the
way Ray itself does for a local cluster (RAY_AUTH_MODE in this process, Ray's config reloaded) and
ask again. Ray's own loader reads the token, from the places Ray's clients read it; we only send it
to a head that asked for one. A missing, unreadable or wrong token is one line.
"""

from __future__ import annotations

import contextlib
import os
import sys

from dlscale.errors import UserError, one_line

AUTH_MODE = "RAY_AUTH_MODE"
TOKEN_HELP = (
    "copy the head's token (`ray get-auth-token` there) to ~/.ray/auth_token on this machine, "
    "or set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
)
# Whether this process turned token mode on, so that leaving the cluster turns it off again: a
# later local Ray in the same process (tests, notebooks) must not inherit it.
_turned_on = False


def authenticate(address: str) -> None:
    """Make this process's Ray client able to join `address`, or raise a one-line UserError."""
    from ray.exceptions import AuthenticationError

    forget()  # a failed join may have left it on
    _reload()  # the mode and token as they are now: a process may join again after a change
    head = _head_address(address)
    if head is None:  # no cluster found for 'auto': ray.init says so itself
        return
    refusal = _ask(head)
    if refusal is None:
        return
    if not isinstance(refusal, AuthenticationError):
        raise _no_head(address, refusal)
    mode = os.environ.get(AUTH_MODE)
    if mode is not None and mode.lower() != "token":
        raise UserError(
            f"the Ray cluster at '{address}' requires an authentication token, but "
            f"{AUTH_MODE}={mode} here turns tokens off: unset it"
        )
    if not _has_token():
        raise UserError(
            f"the Ray cluster at '{address}' requires an authentication token and none was "
            f"found here: {TOKEN_HELP}"
        )
    if mode is None:  # Ray's driver sends no token to an explicit address unless told to
        _token_mode(True)
        refusal = _ask(head)
        if refusal is None:
            return
        _token_mode(False)
    if isinstance(refusal, AuthenticationError):
        raise UserError(
            f"the Ray cluster at '{address}' rejected the authentication token from "
            f"{_token_source()}: it is not that cluster's token; {TOKEN_HELP}"
        )
    raise _no_head(address, refusal)


def forget() -> None:
    """After ray.shutdown(): undo the token mode that authenticate() turned on, if it did."""
    if _turned_on:
        _token_mode(False)


def _no_head(address: str, refusal: Exception) -> UserError:
    # Said after Ray's own wait (about 40 s), where ray.init would wait much longer (minutes).
    return UserError(
        f"cannot join the Ray cluster at '{address}': {_reason(refusal).rstrip('.')}; is that "
        "the head's address (the --port of `ray start --head`)?"
    )


def _head_address(address: str) -> str | None:
    if address != "auto":
        return address
    from ray._private.services import canonicalize_bootstrap_address

    try:
        return canonicalize_bootstrap_address("auto")
    except Exception:  # an unreadable 'auto' is ray.init's to report, as before
        return None


def _ask(head: str) -> Exception | None:
    """One request to the head's GCS: None if it answers, else why not (a Ray exception)."""
    from ray._raylet import GcsClient

    with _quiet_native_stderr():
        try:
            GcsClient(address=head)
        except Exception as exc:  # every refusal is reported, by its kind
            return exc
    return None


def _has_token() -> bool:
    from ray._raylet import AuthenticationTokenLoader
    from ray.exceptions import AuthenticationError

    try:
        return AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True)
    except AuthenticationError as exc:  # e.g. RAY_AUTH_TOKEN_PATH names a missing/empty file
        raise UserError(f"cannot read the Ray authentication token: {_reason(exc)}") from None


def _token_source() -> str:
    # Named in the order Ray's token loader tries them (an empty RAY_AUTH_TOKEN does not count).
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return f"RAY_AUTH_TOKEN_PATH ({os.environ['RAY_AUTH_TOKEN_PATH']})"
    return "~/.ray/auth_token"


def _token_mode(on: bool) -> None:
    global _turned_on
    if on:
        os.environ[AUTH_MODE] = "token"
    else:
        os.environ.pop(AUTH_MODE, None)
    _reload()
    _turned_on = on


def _reload() -> None:
    from ray._raylet import AuthenticationTokenLoader, Config

    # Ray's config caches the mode from the environment: reload it (as Ray's own
    # _enable_token_auth does), then let the token loader read the token afresh.
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def _reason(exc: Exception) -> str:
    # Ray appends a paragraph of advice to its first sentence; ours is the one line's advice.
    text = getattr(exc, "message", None) or str(exc)
    return one_line(text.split(". Ensure that")[0])


@contextlib.contextmanager
def _quiet_native_stderr():
    """Ray's C++ client logs each refused request to file descriptor 2; we report it as one
    line instead, so the descriptor itself points at /dev/null for the request's duration."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
