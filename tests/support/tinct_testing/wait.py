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
from typing import TypeVar, overload

T = TypeVar("T")

#: Seconds a test of the ``k8s`` tier gives a state to come about (an operator's reconcile, a
#: controller's work): an upper bound for a loaded machine, never a measured figure.
WAIT = 120.0

#: How much of the last observed value a failure message quotes.
_QUOTE = 2000


def _failure(
    what: str, timeout: float, value: object, error: BaseException | None, explain: Callable[[], str] | None
) -> AssertionError:
    seen = f"last {type(error).__name__}: {error}" if error is not None else f"last value: {value!r}"
    if len(seen) > _QUOTE:
        seen = seen[:_QUOTE] + " ..."
    message = f"gave up after {timeout:g}s waiting for {what}; {seen}"
    if explain is not None:
        message += f"\n{explain()}"
    return AssertionError(message)


def _name(check: Callable[..., object], what: str | None) -> str:
    return what or str(getattr(check, "__qualname__", None) or check)


def eventually(
    check: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.2,
    what: str | None = None,
    explain: Callable[[], str] | None = None,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """``check()``'s first truthy value, asked every ``interval`` seconds for up to ``timeout``.

    ``what`` names the state in the failure message (default: the check's name); ``explain``
    adds what a reader needs to see why it never came (logs, the objects around it), asked
    only on failure. ``ignoring``: exceptions that mean "not yet" besides ``AssertionError``
    (a connection refused while a server starts, ...).
    """
    not_yet: tuple[type[BaseException], ...] = (AssertionError, *ignoring)
    deadline = time.monotonic() + timeout
    value: object = None
    error: BaseException | None = None
    while True:
        try:
            got = check()
        except not_yet as e:
            error = e
        else:
            if got:
                return got
            value, error = got, None
        if time.monotonic() >= deadline:
            raise _failure(_name(check, what), timeout, value, error, explain) from error
        time.sleep(interval)


@overload
async def eventually_async(
    check: Callable[[], Awaitable[T | None]],
    *,
    timeout: float,
    interval: float = ...,
    what: str | None = ...,
    explain: Callable[[], str] | None = ...,
    ignoring: tuple[type[BaseException], ...] = ...,
) -> T: ...


@overload
async def eventually_async(
    check: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = ...,
    what: str | None = ...,
    explain: Callable[[], str] | None = ...,
    ignoring: tuple[type[BaseException], ...] = ...,
) -> T: ...


async def eventually_async(
    check: Callable[[], object],
    *,
    timeout: float,
    interval: float = 0.2,
    what: str | None = None,
    explain: Callable[[], str] | None = None,
    ignoring: tuple[type[BaseException], ...] = (),
) -> object:
    """:func:`eventually` on an event loop: ``check`` returns a value or an awaitable of one,
    and the pauses between asks are ``asyncio.sleep``."""
    not_yet: tuple[type[BaseException], ...] = (AssertionError, *ignoring)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    value: object = None
    error: BaseException | None = None
    while True:
        try:
            got = check()
            if inspect.isawaitable(got):
                got = await got
        except not_yet as e:
            error = e
        else:
            if got:
                return got
            value, error = got, None
        if loop.time() >= deadline:
            raise _failure(_name(check, what), timeout, value, error, explain) from error
        await asyncio.sleep(interval)


__all__ = ["WAIT", "eventually", "eventually_async"]
