"""Routing tables from files, for running outside a cluster.

Each file holds one table; earlier files on the command line count as older (they keep a
model two tables claim). A file is read at startup, again on SIGHUP, and whenever its
modification time or size changes (checked every second). A file that does not parse or
validate is rejected like any table: logged, counted, and the table in force stays; so is
one whose version goes back (:class:`~tinct.router.table.TableHolder`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Protocol

from tinct.api.backends import BackendPolicy
from tinct.api.routing import RoutingTableError, parse_table
from tinct.router.table import TableHolder, TableRefusedError

_log = logging.getLogger(__name__)


class FileTable:
    """Loads one table file into a holder, when it changed or when asked."""

    def __init__(self, path: Path, holder: TableHolder, order: int = 0) -> None:
        self.path = path
        self.holder = holder
        #: Position on the command line: earlier files count as older tables.
        self.order = order
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
        try:
            self.holder.put(source, table, created=float(self.order))
        except TableRefusedError:
            return False  # rejected (logged and counted) by the holder
        return True

    def changed(self) -> bool:
        return self._stamp() != self._seen


@contextlib.asynccontextmanager
async def file_source(
    paths: Sequence[Path], holder: TableHolder, reloaders: list[Callable[[], None]]
) -> AsyncIterator[None]:
    """Load each of ``paths`` into ``holder``, poll them, and add their reload (for SIGHUP) to
    ``reloaders`` while the context is open."""
    files = [FileTable(path, holder, i) for i, path in enumerate(paths)]
    for ft in files:
        ft.load()

    def reload() -> None:
        for ft in files:
            ft.load()

    async def poll(every: float) -> None:
        while True:
            await asyncio.sleep(every)
            for ft in files:
                if ft.changed():
                    ft.load()

    reloaders.append(reload)
    task = asyncio.create_task(poll(1.0), name="tinct-table-file-poll")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class TableSources(Protocol):
    """Where a router's (or the comparer's) tables come from: the files ``table_files``, and
    with ``watch`` the routing-table ConfigMaps of ``namespace`` (None: all) under ``selector``,
    whose backends ``backends`` judges."""

    @property
    def table_files(self) -> tuple[Path, ...]: ...
    @property
    def watch(self) -> bool: ...
    @property
    def namespace(self) -> str | None: ...
    @property
    def selector(self) -> str: ...
    @property
    def kubeconfig(self) -> Path | None: ...
    @property
    def context(self) -> str | None: ...
    @property
    def backends(self) -> BackendPolicy: ...


@contextlib.asynccontextmanager
async def table_sources(
    config: TableSources,
    holder: TableHolder,
    reloaders: list[Callable[[], None]],
    *,
    post_events: bool,
) -> AsyncIterator[None]:
    """Keep ``holder`` on the tables ``config`` names while the context is open; with
    ``post_events``, a table from the cluster that is rejected gets a Warning Event."""
    async with contextlib.AsyncExitStack() as stack:
        if config.table_files:
            await stack.enter_async_context(file_source(config.table_files, holder, reloaders))
        if config.watch:
            from tinct.router.watch import ConfigMapWatch  # the kubernetes client, only when asked

            watch = ConfigMapWatch(
                holder,
                asyncio.get_running_loop(),
                namespace=config.namespace,
                selector=config.selector,
                kubeconfig=config.kubeconfig,
                context=config.context,
                post_events=post_events,
                backends=config.backends,
            )
            watch.start()
            stack.callback(watch.stop)
        yield


__all__ = ["FileTable", "TableSources", "file_source", "table_sources"]
