"""The list-then-watch loop (``tinct.kubewatch``) on the real API server: a resourceVersion
the server no longer holds (410 Gone, after a restart), a cut connection and an outage of
the API server's address, each followed by what changed meanwhile.

The router's ConfigMap watch and the controller's table watch both run this loop; their own
tests (``test_router_watch.py``, ``test_grayrelease_operator.py``) cover what they make of
the objects.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tinct.kubeconfig import choose, configuration
from tinct.kubewatch import ListWatch
from tinct_testing import wait
from tinct_testing.controlplane.harness import Cluster, ControlPlane, free_port

WAIT = 60.0  # upper bound for the watch to deliver; never a measured figure
LABEL = "tinct.io/kubewatch-test"
SELECTOR = f"{LABEL}=true"
#: Where the test's own control plane keeps its ConfigMaps.
NAMESPACE = "default"
_log = logging.getLogger("tinct.test.kubewatch")


def eventually(check: Callable[[], bool], what: str) -> None:
    wait.eventually(check, timeout=WAIT, interval=0.05, what=what)


class Mirror:
    """What a follower knows of the ConfigMaps: name -> their ``v`` value."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, str] = {}
        self.listings = 0

    def on_list(self, items: list[Any]) -> None:
        with self._lock:
            self._objects = {cm.metadata.name: (cm.data or {}).get("v", "") for cm in items}
            self.listings += 1

    def on_event(self, kind: str, cm: Any) -> None:
        with self._lock:
            if kind == "DELETED":
                self._objects.pop(cm.metadata.name, None)
            else:
                self._objects[cm.metadata.name] = (cm.data or {}).get("v", "")

    @property
    def objects(self) -> dict[str, str]:
        with self._lock:
            return dict(self._objects)


def _core(kubeconfig: Path | None = None, host: str | None = None) -> Any:
    """A CoreV1Api as the admin of ``kubeconfig`` (default: the session's cluster); at
    ``host`` instead of the kubeconfig's server if given."""
    from kubernetes import client

    cfg = configuration(choose(kubeconfig))
    if host is not None:
        cfg.tls_server_name = urlsplit(cfg.host).hostname
        cfg.host = host
    return client.CoreV1Api(client.ApiClient(cfg))


def _put(core: Any, namespace: str, name: str, value: str) -> None:
    from kubernetes.client.exceptions import ApiException

    body = {"metadata": {"name": name, "labels": {LABEL: "true"}}, "data": {"v": value}}
    try:
        core.create_namespaced_config_map(namespace, body)
    except ApiException as e:
        if e.status != 409:
            raise
        core.replace_namespaced_config_map(name, namespace, body)


@contextlib.contextmanager
def following(list_fn: Any, namespace: str, mirror: Mirror) -> Iterator[ListWatch]:
    lw = ListWatch(
        lambda: (list_fn, {"namespace": namespace}),
        selector=SELECTOR,
        on_list=mirror.on_list,
        on_event=mirror.on_event,
        what=f"test ConfigMaps in {namespace}",
        log=_log,
        name="tinct-test-watch",
    )
    lw.start()
    try:
        yield lw
    finally:
        lw.stop()


def test_a_watch_from_a_resource_version_the_server_no_longer_holds_lists_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A follower that listed before the API server restarted resumes against the new one.

    The API server serves watches from its watch cache, which starts at the revision etcd
    has when the server starts: a resourceVersion from before is too old for it (410 Gone),
    whatever etcd still holds. A control plane of this test's own is started, written to,
    and started again on the same etcd data.
    """
    import kubernetes
    from kubernetes.client.exceptions import ApiException

    work = tmp_path / "cp"
    with ControlPlane(workdir=work, with_kwok=False) as before:
        core = _core(before.kubeconfig)
        _put(core, NAMESPACE, "a", "1")
        expired = core.list_namespaced_config_map(NAMESPACE).metadata.resource_version
        _put(core, NAMESPACE, "a", "2")  # etcd's revision moves past what was listed
    with ControlPlane(workdir=work, with_kwok=False) as after:
        core = _core(after.kubeconfig)
        # The API server itself answers a watch from that resourceVersion with 410 Gone.
        with pytest.raises(ApiException) as gone:
            for _ in kubernetes.watch.Watch().stream(
                core.list_namespaced_config_map, NAMESPACE, resource_version=expired, timeout_seconds=10
            ):
                pass
        assert gone.value.status == 410

        real = core.list_namespaced_config_map

        @functools.wraps(real)
        def list_fn(*args: Any, **kwargs: Any) -> Any:
            got = real(*args, **kwargs)
            if not kwargs.get("watch") and mirror.listings == 0:
                # The first listing comes back as the follower had it before the restart;
                # "b" is made after it, so only a listing taken again holds it.
                got.metadata.resource_version = expired
                _put(core, NAMESPACE, "b", "1")
            return got

        mirror = Mirror()
        caplog.set_level(logging.INFO, logger=_log.name)
        with following(list_fn, NAMESPACE, mirror):
            eventually(lambda: mirror.listings >= 2, "a second listing after the 410")
            assert mirror.objects == {"a": "2", "b": "1"}
            assert any("resourceVersion expired (410), listing again" in r.message for r in caplog.records)
            # Watching goes on from the second listing.
            _put(core, NAMESPACE, "c", "1")
            core.delete_namespaced_config_map("a", NAMESPACE)
            eventually(lambda: mirror.objects == {"b": "1", "c": "1"}, "the watch after the relist")


class TcpProxy:
    """Forwards connections to ``target``; :meth:`cut` drops every open one, :meth:`down`
    stops listening too (the API server's address refuses connections) until :meth:`up`."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self.accepted = 0
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listening = threading.Event()
        self._listener: threading.Thread | None = None
        self.up()

    def up(self) -> None:
        server = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        server.settimeout(0.1)
        self._listening.set()
        self._listener = threading.Thread(target=self._accept, args=(server,), daemon=True)
        self._listener.start()

    def _accept(self, server: socket.socket) -> None:
        with server:
            while self._listening.is_set():
                try:
                    client, _ = server.accept()
                except TimeoutError:
                    continue
                client.settimeout(None)
                try:
                    upstream = socket.create_connection(self.target, timeout=10)
                except OSError:
                    client.close()
                    continue
                upstream.settimeout(None)
                with self._lock:
                    self.accepted += 1
                    self._open |= {client, upstream}
                for src, dst in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(src, dst)

    def _drop(self, *socks: socket.socket) -> None:
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
            with self._lock:
                self._open.discard(s)

    def cut(self) -> None:
        with self._lock:
            open_ = list(self._open)
        self._drop(*open_)

    def down(self) -> None:
        self._listening.clear()
        if self._listener is not None:
            self._listener.join()
        self.cut()


def test_a_cut_connection_and_an_outage_are_followed_by_what_changed_meanwhile(
    cluster: Cluster, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    core = _core()
    server = urlsplit(core.api_client.configuration.host)
    proxy = TcpProxy((server.hostname or "127.0.0.1", server.port or 443))
    via_proxy = _core(host=f"https://127.0.0.1:{proxy.port}")
    mirror = Mirror()
    _put(core, namespace, "a", "1")
    try:
        with following(via_proxy.list_namespaced_config_map, namespace, mirror):
            eventually(lambda: mirror.objects == {"a": "1"}, "the first listing")
            _put(core, namespace, "b", "1")
            eventually(lambda: mirror.objects == {"a": "1", "b": "1"}, "a change by the watch")

            # The connection is cut (both ends closed) while changes go on.
            connections = proxy.accepted
            proxy.cut()
            _put(core, namespace, "b", "2")
            core.delete_namespaced_config_map("a", namespace)
            eventually(lambda: mirror.objects == {"b": "2"}, "the changes made around the cut")
            assert proxy.accepted > connections  # it connected again

            # The address refuses connections for a while; meanwhile objects change.
            caplog.clear()
            listings = mirror.listings
            proxy.down()
            _put(core, namespace, "c", "1")
            core.delete_namespaced_config_map("b", namespace)
            eventually(
                lambda: any("failed" in r.message for r in caplog.records if r.name == _log.name),
                "a failed attempt while the address refuses connections",
            )
            proxy.up()
            eventually(lambda: mirror.objects == {"c": "1"}, "the changes made during the outage")
            assert mirror.listings > listings  # after a failure it lists again
            _put(core, namespace, "c", "2")
            eventually(lambda: mirror.objects == {"c": "2"}, "the watch after the outage")
    finally:
        proxy.down()
