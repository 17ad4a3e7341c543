"""How much one lineage query may take: memory, and time.

**Memory.** DataFusion runs each query in a greedy memory pool of :attr:`Limits.memory`
bytes with its disk manager disabled: a join, sort or aggregation that needs more than
the pool fails instead of growing or spilling to disk (an operator's pod has a read-only
root and a memory limit of its own). The answer is collected batch by batch, and once the
batches' data passes the same number of bytes the query is stopped: a cartesian product
with no sort in it needs no working memory, only room for its answer (and time to print).

**Time.** A query may run for :attr:`Limits.timeout` seconds from its start. In the main
thread (the ``tinct`` command) a timer signal interrupts it wherever DataFusion is, the
way Ctrl-C does: the Python bindings wait for a query while watching for signals, and drop
it when a signal handler raises. In other threads (the operator's reads of its own tables)
signals cannot reach it, and the deadline is checked between the answer's batches.

Either limit ends the query with :class:`~tinct.lineage.errors.QueryLimitError`, naming
the limit. DataFusion stops working on a query when its stream is dropped, so no frame
that a traceback may keep holds on to the stream (the bindings' own frames are cleared).

(Pulling the stream asynchronously would make the deadline work in every thread, but a
cancelled pull leaves the bindings completing futures while the interpreter shuts down,
which aborts the process.)

DataFusion and pyarrow are imported where they are used, so the command's parser can name
the defaults and ``tinct --help`` stays fast.
"""

from __future__ import annotations

import re
import signal
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from tinct.lineage.errors import QueryLimitError

if TYPE_CHECKING:
    import pyarrow as pa
    from datafusion import DataFrame, RuntimeEnvBuilder

__all__ = ["DEFAULT_MEMORY_LIMIT", "DEFAULT_TIMEOUT", "Limits", "collect", "deadline", "size_text"]

#: Bytes a query's working memory, and again its answer, may take unless told otherwise.
DEFAULT_MEMORY_LIMIT = 256 * 2**20
#: Seconds a query may run unless told otherwise.
DEFAULT_TIMEOUT = 60.0

#: How DataFusion says its memory pool refused an allocation (or a spill it may not make).
_EXHAUSTED = re.compile(r"Resources exhausted")


def size_text(size: int) -> str:
    """``size`` bytes for a person: ``256 MiB``, ``1.5 GiB``, ``512 KiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.4g} {unit}"
    return f"{size} B"


@dataclass(frozen=True)
class Limits:
    """The memory (bytes) and time (seconds) one query may take."""

    memory: int = DEFAULT_MEMORY_LIMIT
    timeout: float = DEFAULT_TIMEOUT

    def __post_init__(self) -> None:
        if self.memory <= 0 or not self.timeout > 0:
            raise ValueError("a query's memory limit and timeout must be more than 0")

    def runtime(self) -> RuntimeEnvBuilder:
        """DataFusion's runtime for one query: a pool of :attr:`memory` bytes, no spilling."""
        from datafusion import RuntimeEnvBuilder

        return RuntimeEnvBuilder().with_disk_manager_disabled().with_greedy_memory_pool(self.memory)

    def out_of_memory(self) -> QueryLimitError:
        return QueryLimitError(
            "memory",
            f"the query needs more than the memory limit of {size_text(self.memory)} for its joins, sorts "
            "or aggregations (nothing spills to disk): filter or aggregate sooner, or raise --memory-limit",
        )

    def answer_too_large(self) -> QueryLimitError:
        return QueryLimitError(
            "memory",
            f"the answer is larger than the memory limit of {size_text(self.memory)}: add a LIMIT, a "
            "filter or an aggregate, or raise --memory-limit",
        )

    def too_long(self) -> QueryLimitError:
        return QueryLimitError(
            "timeout",
            f"the query ran longer than the timeout of {self.timeout:g} s and was stopped: add a filter "
            "or a LIMIT, or raise --timeout",
        )


class _Expired(Exception):  # noqa: N818 - a signal, not an error a caller sees
    """Raised by the timer's signal handler into whatever the main thread is running."""


@contextmanager
def deadline(limits: Limits) -> Iterator[float]:
    """The :func:`time.monotonic` time the block must end by (``limits.timeout`` from now);
    in the main thread the block is interrupted then.

    A timer someone else set is left alone (the deadline is then only checked between
    batches), and a signal that comes after the block raises nothing.

    Raises:
        QueryLimitError: the deadline passed (raised by :func:`collect` too).
    """
    seconds = limits.timeout
    end = time.monotonic() + seconds
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getitimer(signal.ITIMER_REAL)[0]:
        yield end
        return
    armed = True

    def expire(signum: int, frame: FrameType | None) -> None:
        if armed:
            raise _Expired

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield end
    except _Expired:
        raise limits.too_long() from None
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def collect(frame: DataFrame, limits: Limits, end: float) -> pa.Table:
    """The answer of ``frame`` within ``limits``, by the :func:`deadline` ``end``.

    Raises:
        QueryLimitError: the query passed a limit.
    """
    import pyarrow as pa

    batches: list[pa.RecordBatch] = []
    size = 0
    stream: Any = None
    schema = frame.schema()
    try:
        stream = frame.execute_stream()
        for batch in stream:
            if time.monotonic() > end:
                raise limits.too_long()
            got = batch.to_pyarrow()
            # Its size as data, what printing it costs too, even where batches share buffers
            # (a cartesian product repeats one side's buffers in every batch).
            size += got.nbytes
            if size > limits.memory:
                raise limits.answer_too_large()
            # Partitions of one answer may differ in what they mark nullable (a view over a
            # join): the answer has the frame's schema.
            batches.append(
                got if got.schema == schema else pa.RecordBatch.from_arrays(got.columns, schema=schema)
            )
    except BaseException as exc:
        # The bindings' frames in the traceback (a stream's __next__, the timer's handler) hold
        # the stream: kept by whoever keeps the exception, they would keep the query running.
        traceback.clear_frames(exc.__traceback__)
        if (
            isinstance(exc, Exception)
            and not isinstance(exc, QueryLimitError)
            and _EXHAUSTED.search(str(exc))
        ):
            raise limits.out_of_memory() from None
        raise
    finally:
        stream = None  # dropping the stream stops the query, even while a traceback keeps this frame
    return pa.Table.from_batches(batches, schema=schema)
