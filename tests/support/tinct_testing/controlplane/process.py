"""The processes of the harness: one child process, waiting for it to be ready, and the
lifecycle a group of them shares (the control plane, KEDA, the node).

Every child gets SIGKILL when the process that started it dies (``PR_SET_PDEATHSIG``):
atexit does not run when a test process is killed hard, and nothing may outlive it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from tinct_testing.wait import eventually


class ControlPlaneError(RuntimeError):
    """A process of the harness did not start; carries the tail of its log."""

    def __init__(self, what: str, log: Path | None = None) -> None:
        self.what = what
        self.log = log
        tail = ""
        if log is not None and log.exists():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        super().__init__(f"{what}\n--- last lines of {log} ---\n{tail}" if tail else what)


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: get SIGKILL when the process that started it dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Process:
    """A child in a session of its own, its output in ``log``; :meth:`stop` ends its group."""

    def __init__(
        self, argv: Sequence[str], log: Path, append: bool = False, env: Mapping[str, str] | None = None
    ) -> None:
        self.log = log
        self._fh = log.open("ab" if append else "wb")
        self.proc = subprocess.Popen(
            list(argv),
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env} if env is not None else None,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._fh.close()


def http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    """Whether ``url`` answers 200 within 2 s (no answer at all counts as no)."""
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def terminate(proc: subprocess.Popen[Any], grace: float = 15.0) -> None:
    """SIGTERM ``proc``, then SIGKILL when it has not exited within ``grace`` seconds."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def spawned(
    argv: Sequence[str],
    log: Path,
    env: Mapping[str, str] | None = None,
    *,
    append: bool = False,
    grace: float = 15.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` running for the block, its output in ``log``, then :func:`terminate`-d.

    Unlike a :class:`Process`, it stays in its parent's session and outlives it when the
    parent is killed hard: for the commands a script runs (``tinct operator``, ...).
    """
    with log.open("ab" if append else "wb") as fh:
        proc = subprocess.Popen(
            list(argv), stdout=fh, stderr=subprocess.STDOUT, env=dict(env) if env is not None else None
        )
        try:
            yield proc
        finally:
            terminate(proc, grace)


def wait_ready(
    what: str,
    check: Callable[[], object],
    proc: Process | subprocess.Popen[Any],
    deadline: float,
    *,
    interval: float = 0.2,
    ignoring: tuple[type[BaseException], ...] = (),
    log: Path | None = None,
) -> float:
    """Seconds until ``check()`` holds for ``proc``, which must stay alive meanwhile.

    :class:`ControlPlaneError` with the tail of the process' log (a :class:`Process`'s own, or
    ``log``) when it exits first or the ``deadline`` (``time.monotonic()``) passes;
    ``ignoring``: exceptions of ``check`` that mean "not yet" (the last is reported).
    """
    started = time.monotonic()
    popen = proc.proc if isinstance(proc, Process) else proc
    log = proc.log if isinstance(proc, Process) else log

    def ready() -> object:
        if popen.poll() is not None:
            raise ControlPlaneError(f"{what} exited with code {popen.returncode}", log)
        return check()

    try:
        eventually(
            ready,
            timeout=max(0.0, deadline - started),
            interval=interval,
            what=what,
            ignoring=ignoring,
        )
    except AssertionError as e:
        raise ControlPlaneError(f"{what} was not ready in time ({e})", log) from None
    return round(time.monotonic() - started, 2)


class Workdir:
    """A work directory: ``path``, the one given, else a new one that :meth:`remove` removes."""

    def __init__(self, given: Path | None, prefix: str) -> None:
        self.path = given or Path(tempfile.mkdtemp(prefix=prefix))
        self._own = given is None

    def remove(self) -> None:
        """Remove the directory if it was made here; a given one stays."""
        if self._own:
            shutil.rmtree(self.path, ignore_errors=True)


class Processes:
    """Processes started together and stopped together, in a work directory of their own.

    :meth:`start` registers :meth:`stop` with atexit and runs :meth:`_start` against one
    deadline; when that fails, whatever it started is stopped before the error goes on.
    :meth:`stop` stops each of :meth:`_processes` in the order given, then removes the work
    directory if this object made it; it is safe to call twice. A context manager as well.
    """

    #: Seconds :meth:`start` (and ``with``) gives :meth:`_start` unless told otherwise.
    start_timeout = 60.0

    def __init__(self, workdir: Path | None, prefix: str) -> None:
        self._workdir = Workdir(workdir, prefix)
        self.workdir = self._workdir.path
        self._stopped = False

    def _start(self, deadline: float) -> None:
        raise NotImplementedError

    def _processes(self) -> Sequence[Process | None]:
        """The processes in the order they stop (None: not started)."""
        raise NotImplementedError

    def start(self, timeout: float | None = None) -> Self:
        atexit.register(self.stop)
        try:
            self._start(time.monotonic() + (self.start_timeout if timeout is None else timeout))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            for p in self._processes():
                if p is not None:
                    with contextlib.suppress(OSError, subprocess.SubprocessError):
                        p.stop()
        finally:
            self._workdir.remove()
            atexit.unregister(self.stop)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pids(self) -> list[int]:
        """The ids of the processes that run now."""
        return [p.proc.pid for p in self._processes() if p is not None and p.alive()]


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, which still answers ``kill(pid, 0)``, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split()[2] != "Z"


@contextlib.contextmanager
def killed_hard(setup: str, pids: str, directory: Path, timeout: float) -> Iterator[list[int]]:
    """A Python process (in this environment) that runs ``setup``, writes the pids the
    expression ``pids`` gives into ``directory`` and sleeps: those pids are yielded once
    written, then the process gets SIGKILL -- no atexit, no ``finally`` -- the way a CI job's
    timeout or an OOM kill ends a test run."""
    out = directory / "pids"
    script = (
        f"import time\nfrom pathlib import Path\n{setup}\n"
        f"Path({str(out)!r}).write_text(' '.join(map(str, {pids})))\ntime.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script])
    try:

        def written() -> list[int]:
            if owner.poll() is not None:
                raise RuntimeError(f"the process exited with code {owner.returncode} before writing {out}")
            return [int(w) for w in out.read_text().split()] if out.exists() else []

        yield eventually(written, timeout=timeout, what=f"{out} written")
    finally:
        owner.kill()
        owner.wait()


__all__ = [
    "ControlPlaneError",
    "Process",
    "Processes",
    "Workdir",
    "http_ok",
    "killed_hard",
    "running",
    "spawned",
    "terminate",
    "wait_ready",
]
