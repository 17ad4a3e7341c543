"""The one way tests, the harness, the demo and the benchmarks wait for a state.

``eventually(check, timeout=..., interval=...)`` calls ``check`` until it returns something
truthy and returns that value. A check may also assert: an ``AssertionError`` it raises
counts as "not yet", like a falsy value. When ``timeout`` seconds pass first, it fails with an
``AssertionError`` that names what it waited for and the last value the check returned (or
the last assertion it raised, chained as the cause). Any other exception a check raises ends
the wait at once: a process that died is no reason to keep asking. ``eventually_async`` is
the same for a coroutine that must not block its event loop; its check may be a coroutine
function or a plain one (reading state the loop changes).

A wait is for a state, never a fixed pause: code that lets time pass on purpose ("no change
for 8 s", pacing traffic) says so where it sleeps.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypedDict, TypeVar, Unpack, overload

T = TypeVar("T")

#: Seconds a test of the ``k8s`` tier gives a state to come about (an operator's reconcile, a
#: controller's work): an upper bound for a loaded machine, never a measured figure.
WAIT = 120.0

#: How much of the last observed value a failure message quotes.
_QUOTE = 2000


class Options(TypedDict, total=False):
    """How :func:`eventually` and :func:`eventually_async` ask."""

    #: Seconds between two asks (default 0.2).
    interval: float
    #: The state waited for, as the failure message names it (default: the check's name).
    what: str
    #: What a reader needs to see why the state never came (logs, the objects around it);
    #: asked only on failure.
    explain: Callable[[], str]
    #: Exceptions of the check that mean "not yet" besides ``AssertionError`` (a connection
    #: refused while a server starts, ...).
    ignoring: tuple[type[BaseException], ...]


class _Asking:
    """One wait's bookkeeping: what the check last said, and when to give up."""

    def __init__(self, check: Callable[..., object], timeout: float, now: float, options: Options) -> None:
        self.timeout, self.deadline = timeout, now + timeout
        self.what = options.get("what") or str(getattr(check, "__qualname__", None) or check)
        self.explain = options.get("explain")
        self.interval = options.get("interval", 0.2)
        self.not_yet: tuple[type[BaseException], ...] = (AssertionError, *options.get("ignoring", ()))
        self.value: object = None
        self.error: BaseException | None = None

    def answered(self, got: object, error: BaseException | None, now: float) -> bool:
        """Whether ``got`` is the answer; raises the failure once time is up without one."""
        if error is None and got:
            return True
        self.value, self.error = got, error
        if now >= self.deadline:
            raise self._failure() from error
        return False

    def _failure(self) -> AssertionError:
        error = self.error
        seen = f"last {type(error).__name__}: {error}" if error is not None else f"last value: {self.value!r}"
        if len(seen) > _QUOTE:
            seen = seen[:_QUOTE] + " ..."
        message = f"gave up after {self.timeout:g}s waiting for {self.what}; {seen}"
        if self.explain is not None:
            message += f"\n{self.explain()}"
        return AssertionError(message)


def eventually(check: Callable[[], T | None], *, timeout: float, **options: Unpack[Options]) -> T:
    """``check()``'s first truthy value, asked every ``interval`` seconds for up to ``timeout``
    (see :class:`Options`)."""
    asking = _Asking(check, timeout, time.monotonic(), options)
    while True:
        try:
            got, error = check(), None
        except asking.not_yet as e:
            got, error = None, e
        if asking.answered(got, error, time.monotonic()):
            return got  # type: ignore[return-value]
        time.sleep(asking.interval)


@overload
async def eventually_async(
    check: Callable[[], Awaitable[T | None]], *, timeout: float, **options: Unpack[Options]
) -> T: ...


@overload
async def eventually_async(
    check: Callable[[], T | None], *, timeout: float, **options: Unpack[Options]
) -> T: ...


async def eventually_async(
    check: Callable[[], object], *, timeout: float, **options: Unpack[Options]
) -> object:
    """:func:`eventually` on an event loop: ``check`` returns a value or an awaitable of one,
    and the pauses between asks are ``asyncio.sleep``."""
    loop = asyncio.get_running_loop()
    asking = _Asking(check, timeout, loop.time(), options)
    while True:
        try:
            got, error = check(), None
            if inspect.isawaitable(got):
                got = await got
        except asking.not_yet as e:
            got, error = None, e
        if asking.answered(got, error, loop.time()):
            return got
        await asyncio.sleep(asking.interval)


__all__ = ["WAIT", "Options", "eventually", "eventually_async"]
