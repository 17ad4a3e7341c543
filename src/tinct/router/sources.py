"""Routing tables from a file, for running outside a cluster.

The file is read at startup, again on SIGHUP, and whenever its modification time or size
changes (checked every ``poll`` seconds). A file that does not parse or validate is rejected
like any table: logged, counted, and the table in force stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from tinct.api.routing import RoutingTableError, parse_table
from tinct.router.table import TableHolder

_log = logging.getLogger(__name__)


class FileTable:
    """Loads one table file into a holder, when it changed or when asked."""

    def __init__(self, path: Path, holder: TableHolder) -> None:
        self.path = path
        self.holder = holder
        self._seen: tuple[int, int] | None = None

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def load(self) -> bool:
        """Read the file now; True when a table was put in force."""
        source = f"file {self.path}"
        self._seen = self._stamp()
        try:
            text = self.path.read_bytes()
        except OSError as e:
            self.holder.reject(source, f"cannot read: {e}")
            return False
        try:
            table = parse_table(text, source)
        except RoutingTableError as e:
            self.holder.reject(source, e.reason)
            return False
        self.holder.swap(table, source)
        return True

    def changed(self) -> bool:
        return self._stamp() != self._seen

    async def poll(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            if self.changed():
                self.load()


@contextlib.asynccontextmanager
async def file_source(
    path: Path, holder: TableHolder, reloaders: list[Callable[[], None]]
) -> AsyncIterator[None]:
    """Load ``path`` into ``holder``, poll it, and add its reload (for SIGHUP) to ``reloaders``
    while the context is open."""
    ft = FileTable(path, holder)
    ft.load()

    def reload() -> None:
        ft.load()

    reloaders.append(reload)
    task = asyncio.create_task(ft.poll(1.0), name="tinct-table-file-poll")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


__all__ = ["FileTable", "file_source"]
