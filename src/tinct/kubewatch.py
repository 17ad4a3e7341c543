"""List, then watch from the listing's resourceVersion: the one loop that follows objects.

The router (:mod:`tinct.router.watch`) and the GrayRelease controller
(:class:`tinct.operator.grayrelease.kube.TableWatch`) both follow routing-table ConfigMaps
through the synchronous ``kubernetes`` client in a daemon thread; :class:`ListWatch` is the
loop they share:

- **List** the objects, hand them all over at once (:attr:`ListWatch.on_list`: what is not
  in a listing is gone), and **watch** from the listing's resourceVersion, each event to
  :attr:`ListWatch.on_event` (``ADDED``, ``MODIFIED`` or ``DELETED`` and the object).
- A watch ends after :data:`WATCH_SECONDS` (the server closes it) and is **resumed** from the
  last resourceVersion seen, with nothing listed again. Bookmarks are asked for: they move
  that resourceVersion on while nothing changes, so a resumed watch rarely finds it too old.
- **410 Gone** (the resourceVersion is older than what the API server still holds, as an
  HTTP answer or an ``ERROR`` event in the stream): list again at once.
- **Any other failure** (an ``ERROR`` event, a refused or cut connection, an answer that is
  not 2xx): logged, then list again after a pause of 0.5 s that doubles up to 10 s and
  starts over after a listing that works.

:meth:`ListWatch.stop` ends the loop: it cuts a watch in progress, so the thread ends soon.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

__all__ = ["WATCH_SECONDS", "Following", "ListCall", "ListWatch"]

#: Seconds the API server keeps one watch request open before the loop resumes it.
WATCH_SECONDS = 60
_FIRST_PAUSE = 0.5
_MAX_PAUSE = 10.0

#: Makes the list call afresh (a client may need building, and may fail): the client's
#: ``list_*`` function and the arguments it takes besides the label selector.
ListCall = Callable[[], tuple[Callable[..., Any], dict[str, Any]]]


@dataclass(eq=False)
class ListWatch:
    """Follows the objects ``list_call`` lists under ``selector``, in a thread of its own."""

    #: The list function to call and watch, and its arguments (see :data:`ListCall`).
    list_call: ListCall
    _: KW_ONLY
    #: Label selector, applied by the API server.
    selector: str
    #: Every object of a listing (all that exist); called in the thread.
    on_list: Callable[[list[Any]], None]
    #: ``(type, object)`` of each ``ADDED``, ``MODIFIED`` or ``DELETED`` event.
    on_event: Callable[[str, Any], None]
    #: What is followed, for log lines (``routing tables in namespace x``).
    what: str
    #: The logger of the module that follows them.
    log: logging.Logger
    #: The thread's name.
    name: str = "tinct-watch"
    thread: threading.Thread = field(init=False, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _watch: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self.run, name=self.name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """End the loop; a watch in progress is cut."""
        self._stop.set()
        w = self._watch
        if w is not None:
            w.stop()

    def run(self) -> None:
        """The loop (:meth:`start` runs it in :attr:`thread`), until :meth:`stop`."""
        from kubernetes.client.exceptions import ApiException

        pause = _FIRST_PAUSE
        while not self._stop.is_set():
            try:
                fn, kw = self.list_call()
                listing = fn(label_selector=self.selector, **kw)
                self.on_list(list(listing.items))
                pause = _FIRST_PAUSE
                self._watch_from(fn, kw, listing.metadata.resource_version)
            except ApiException as e:
                if self._stop.is_set():
                    return
                if e.status == 410:
                    self.log.info("watching %s: resourceVersion expired (410), listing again", self.what)
                    continue
                self.log.warning("watching %s failed: %s %s; retrying", self.what, e.status, e.reason)
            except Exception as e:
                if self._stop.is_set():
                    return
                self.log.warning("watching %s failed: %r; retrying", self.what, e)
            if self._stop.wait(pause):
                return
            pause = min(pause * 2, _MAX_PAUSE)

    def _watch_from(self, fn: Callable[..., Any], kw: dict[str, Any], rv: str) -> None:
        """Watch from ``rv``, resuming each watch the server ends, until stopped or failed."""
        import kubernetes
        from kubernetes.client.exceptions import ApiException

        watch: Any = kubernetes.watch
        while not self._stop.is_set():
            w = watch.Watch()
            self._watch = w
            if self._stop.is_set():  # stopped before the watch could be cut
                return
            for ev in w.stream(
                fn,
                label_selector=self.selector,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_SECONDS,
                _request_timeout=WATCH_SECONDS + 10,
                **kw,
            ):
                if self._stop.is_set():
                    w.stop()
                    return
                kind, obj = ev["type"], ev["object"]
                if kind == "ERROR":
                    code = obj.get("code", 500) if isinstance(obj, dict) else getattr(obj, "code", 500)
                    raise ApiException(status=code, reason=str(obj))
                # The client keeps the resourceVersion of every event, bookmarks included.
                rv = w.resource_version or rv
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self.on_event(kind, obj)


class Following:
    """What keeps a view of objects through the :class:`ListWatch` it holds as ``_watch``."""

    _watch: ListWatch

    def start(self) -> None:
        self._watch.start()

    def stop(self) -> None:
        self._watch.stop()
