"""The ``tinct`` command as tests, scripts and benchmarks run it: this interpreter's tinct, so
that it is the checkout's (installed editable) whatever ``PATH`` says."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping

#: ``tinct`` as argv.
TINCT = (sys.executable, "-m", "tinct.cli")


def tinct(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """``tinct ARGS`` to its end, its output captured as text; ``env``: its whole environment
    (default: this process'). It does not raise when the command fails."""
    return subprocess.run(
        [*TINCT, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env=dict(env) if env is not None else None,
    )


def tinct_ok(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """:func:`tinct` that must succeed: a failure is an ``AssertionError`` quoting its stderr."""
    proc = tinct(*args, env=env, timeout=timeout)
    assert proc.returncode == 0, f"tinct {' '.join(args)} exited {proc.returncode}: {proc.stderr}"
    return proc


def router_argv(port: int, *args: str) -> list[str]:
    """The argv of ``tinct router ARGS`` listening on 127.0.0.1:``port``."""
    return [*TINCT, "router", "--host", "127.0.0.1", "--port", str(port), *args]


__all__ = ["TINCT", "router_argv", "tinct", "tinct_ok"]
