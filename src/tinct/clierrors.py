"""What a person reads when a ``tinct`` command fails: one line saying what and why, no traceback.

Every command runs under :func:`run`, which turns the failures a user can act on — a
kubeconfig that cannot be used, an API server that cannot be reached or refuses the
credentials, a Prometheus or lineage root that is not there — into a message and an exit
status (:data:`EXIT_CODES`); anything else still gets one line and the hint that
``TINCT_DEBUG=1`` shows the traceback.

Only the standard library is imported at module level so ``tinct --help`` stays fast.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

__all__ = ["EXIT_CODES", "EXIT_STATUS_HELP", "UserError", "explain", "run"]

#: The exit status of a command Ctrl-C stopped.
INTERRUPTED = 130

#: The exit statuses every ``tinct`` command keeps to.
EXIT_CODES = {
    0: "success",
    1: "the command failed: not found, refused, or the cluster, Prometheus or lineage tables "
    "could not be reached or read",
    2: "usage: an argument or input tinct refuses before doing anything",
    INTERRUPTED: "interrupted (Ctrl-C)",
}

#: The ``exit status`` section of ``--help``.
EXIT_STATUS_HELP = "exit status:\n" + "\n".join(f"  {code:<4} {what}" for code, what in EXIT_CODES.items())


class UserError(Exception):
    """A failure with a message for a person and the exit status it ends the command with."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return self.message


def _first_line(text: object, limit: int = 300) -> str:
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line[:limit]


def _unreachable(exc: BaseException) -> UserError | None:
    """An API server (or other HTTP endpoint) that could not be reached, from urllib3's errors."""
    try:
        import urllib3.exceptions as u3
    except ImportError:  # pragma: no cover - kubernetes depends on urllib3
        return None
    if not isinstance(exc, u3.HTTPError):
        return None
    where = _where(exc) or _where(getattr(exc, "reason", None)) or "the API server"
    reason: BaseException = getattr(exc, "reason", None) or exc
    text = str(reason)
    if "refused" in text.lower():
        why = "connection refused"
    elif isinstance(reason, u3.SSLError) or "certificate" in text.lower():
        why = f"TLS failed ({_first_line(text, 160)})"
    elif isinstance(reason, u3.TimeoutError) or "timed out" in text.lower():
        why = "timed out"
    elif "Name or service not known" in text or "nodename nor servname" in text:
        why = "the host name does not resolve"
    else:
        why = _first_line(text, 160)
    from tinct.kubeconfig import choose

    return UserError(
        f"cannot reach the Kubernetes API server at {where}: {why}; is the cluster up, "
        f"and is {choose()} the one you mean? (--kubeconfig, --context)"
    )


def _where(exc: object) -> str | None:
    """``scheme://host:port`` of the connection a urllib3 error is about, if it says."""
    found = vars(exc) if hasattr(exc, "__dict__") else {}
    pool, conn = found.get("pool"), found.get("conn")
    if pool is not None and getattr(pool, "host", None):
        return f"{getattr(pool, 'scheme', 'https')}://{pool.host}:{pool.port}"
    if conn is not None and getattr(conn, "host", None):
        scheme = "https" if type(conn).__name__.startswith("HTTPS") else "http"
        return f"{scheme}://{conn.host}:{conn.port}"
    return None


def _api_status(exc: BaseException) -> UserError | None:
    try:
        from kubernetes.client.exceptions import ApiException
    except ImportError:  # pragma: no cover
        return None
    if not isinstance(exc, ApiException):
        return None
    import json

    message = ""
    try:
        message = str(json.loads(exc.body or "{}").get("message") or "")
    except (ValueError, AttributeError):
        message = ""
    from tinct.kubeconfig import choose

    if exc.status == 401:
        return UserError(f"the API server refused the credentials of {choose()} (401 Unauthorized)")
    if exc.status == 403:
        return UserError(f"forbidden: {_first_line(message) or exc.reason}")
    if exc.status == 404 and "the server could not find the requested resource" in message:
        return UserError(
            "the API server does not serve tinct.io resources: install the CRDs "
            "(kubectl apply -f crds/, or the Helm chart)"
        )
    return UserError(
        f"the API server answered {exc.status} {exc.reason}: {_first_line(message)}".rstrip(": ")
    )


def explain(exc: BaseException) -> UserError | None:
    """The message (and exit status) for a failure a user can act on; None for others."""
    if isinstance(exc, UserError):
        return exc
    from tinct.kubeconfig import KubeconfigError

    if isinstance(exc, KubeconfigError):
        return UserError(str(exc), 2)
    for explainer in (_unreachable, _api_status):
        got = explainer(exc)
        if got is not None:
            return got
    if isinstance(exc, BrokenPipeError):
        return UserError("output closed early", 1)
    return None


def run(prog: str, func: Callable[[], int]) -> int:
    """Run a command's ``func``; a failure becomes one line on stderr and an exit status."""
    try:
        return func()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except SystemExit:
        raise
    except Exception as exc:
        if os.environ.get("TINCT_DEBUG"):
            raise
        try:
            err = explain(exc)
        except Exception:  # explaining must not fail louder than the failure
            err = None
        if err is None:
            print(
                f"{prog}: unexpected error: {type(exc).__name__}: {_first_line(exc)} "
                "(TINCT_DEBUG=1 shows the traceback)",
                file=sys.stderr,
            )
            return 1
        print(f"{prog}: {err.message}", file=sys.stderr)
        return err.code
