"""``tinct release``: look at and steer a GrayRelease through the Kubernetes API.

``pause`` and ``resume`` set ``spec.paused``; ``promote``, ``abort`` and ``retry`` (and
``resume``, which also lifts a pause the operator made after inconclusive analyses) are
requests written to the ``tinct.io/action`` annotation as ``<verb>@a<attempt>-<nonce>``:
addressed to the release's current attempt (``status.attempt``), so a request left over
from an earlier attempt is refused rather than carried out. The operator carries out each
request once and records the outcome in ``status.lastAction`` (``Done`` or ``Refused``,
with why). ``tinct release`` waits for that outcome (``--wait``, 60 s by default), exits 1
when the request was refused or not acknowledged in time, and refuses to write a request
while an earlier one is not handled yet (it would replace it unseen). On a final release
(Promoted, RolledBack) every verb but ``retry`` of a rolled-back one is refused, exit 1 and
one line, and nothing is written. The same from GitOps or kubectl::

    kubectl patch gr chat --type merge -p '{"spec":{"paused":true}}'
    kubectl annotate gr chat tinct.io/action=promote@$(date +%s) --overwrite
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from typing import Any

__all__ = ["RELEASE_VERBS", "register"]

#: The verbs of ``tinct release`` (and of ``kubectl tinct``); all but the first three are
#: requests in the ``tinct.io/action`` annotation (:mod:`tinct.api.v1alpha1.action`).
RELEASE_VERBS = ("status", "list", "pause", "resume", "promote", "abort", "retry")


def _clients(args: argparse.Namespace) -> tuple[Any, str]:
    """The API (through :mod:`tinct.kubeconfig`) and the namespace of the chosen context."""
    from kubernetes import client

    from tinct.kubeconfig import api_client, choose, namespace_of, use

    use(args.kubeconfig, args.context)
    access = choose()
    namespace = namespace_of(access)
    return client.CustomObjectsApi(api_client()), namespace


def _get(api: Any, ns: str, name: str) -> dict[str, Any]:
    from tinct.api.v1alpha1.common import GROUP, VERSION

    obj: dict[str, Any] = api.get_namespaced_custom_object(GROUP, VERSION, ns, "grayreleases", name)
    return obj


def _patch(api: Any, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    from tinct.api.v1alpha1.common import GROUP, VERSION

    obj: dict[str, Any] = api.patch_namespaced_custom_object(GROUP, VERSION, ns, "grayreleases", name, body)
    return obj


def _status(api: Any, ns: str, name: str, args: argparse.Namespace) -> int:
    from tinct.release.views import print_status, watch_status

    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    if args.watch:
        return watch_status(api, ns, name, args.output, color)
    print_status(_get(api, ns, name), args.output, color)
    return 0


def _list(api: Any, ns: str, args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from tinct.api.v1alpha1.common import GROUP, VERSION
    from tinct.release.views import list_rows, print_list

    if args.all_namespaces:
        found = api.list_cluster_custom_object(GROUP, VERSION, "grayreleases")
    else:
        found = api.list_namespaced_custom_object(GROUP, VERSION, ns, "grayreleases")
    rows = list_rows(found.get("items") or [], datetime.now(UTC))
    if not rows and args.output == "text":
        where = "any namespace" if args.all_namespaces else f"namespace {ns}"
        print(f"no GrayReleases in {where}", file=sys.stderr)
        return 0
    print_list(rows, args.output, args.all_namespaces)
    return 0


def _refused_on_final(obj: dict[str, Any], verb: str) -> bool:
    """Whether ``verb`` is refused, said in one line, because the release is final: then
    nothing is written (:func:`~tinct.api.v1alpha1.action.final_refusal`)."""
    from tinct.api.v1alpha1.action import final_refusal

    why = final_refusal(verb, (obj.get("status") or {}).get("phase"))
    if why is None:
        return False
    meta = obj["metadata"]
    print(
        f"tinct release: grayrelease {meta.get('namespace')}/{meta['name']}: {verb} refused: {why}",
        file=sys.stderr,
    )
    return True


#: Times a request is written again after the release changed under it (409 Conflict): the
#: operator writes its status every round, and each write makes the read stale.
REQUEST_TRIES = 5


def _request(api: Any, ns: str, name: str, verb: str, wait: float) -> int:
    from kubernetes.client.exceptions import ApiException

    from tinct.api.v1alpha1.action import ACTION_ANNOTATION, action_value, handled

    for tries_left in reversed(range(REQUEST_TRIES)):
        # The checks and the attempt number come from the version the write is guarded by.
        obj = _get(api, ns, name)
        if _refused_on_final(obj, verb):
            return 1
        status = obj.get("status") or {}
        current = (obj["metadata"].get("annotations") or {}).get(ACTION_ANNOTATION)
        if current and not handled(current, status):
            print(
                f"tinct release: grayrelease {ns}/{name}: the earlier request {current} is not handled yet; "
                "wait for it (or for the operator to run) before giving another",
                file=sys.stderr,
            )
            return 1
        value = action_value(verb, int(status.get("attempt") or 1), uuid.uuid4().hex[:8])
        body: dict[str, Any] = {
            "metadata": {
                "annotations": {ACTION_ANNOTATION: value},
                "resourceVersion": obj["metadata"]["resourceVersion"],
            }
        }
        if verb == "resume":
            body["spec"] = {"paused": False}
        try:
            _patch(api, ns, name, body)
            break
        except ApiException as exc:
            if exc.status != 409 or not tries_left:
                raise
    print(f"grayrelease {ns}/{name}: requested {verb} ({ACTION_ANNOTATION}={value})")
    if wait <= 0:
        return 0
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        status = _get(api, ns, name).get("status") or {}
        last = status.get("lastAction") or {}
        if last.get("value") == value:
            where = f"{status.get('phase')} at step {status.get('progress') or status.get('step')}"
            if last.get("result") == "Refused":
                print(
                    f"tinct release: grayrelease {ns}/{name}: {verb} refused: {last.get('message')}",
                    file=sys.stderr,
                )
                return 1
            print(
                f"grayrelease {ns}/{name}: {verb} done: {last.get('message')}; {where}: {status.get('message')}"
            )
            return 0
        time.sleep(0.5)
    print(
        f"tinct release: grayrelease {ns}/{name}: the operator did not handle {verb} within {wait:g}s "
        "(is it running? it stays requested)",
        file=sys.stderr,
    )
    return 1


def _cmd(args: argparse.Namespace) -> int:
    from kubernetes.client.exceptions import ApiException

    if args.verb != "list" and not args.name:
        print(f"tinct release {args.verb}: give the GrayRelease's name", file=sys.stderr)
        return 2
    if args.watch and args.verb != "status":
        print("tinct release: --watch goes with status", file=sys.stderr)
        return 2
    api, default_ns = _clients(args)
    ns = args.namespace or default_ns
    try:
        if args.verb == "list":
            return _list(api, ns, args)
        if args.verb == "status":
            return _status(api, ns, args.name, args)
        if args.verb == "pause":
            # A release that became final since has spec.paused ignored: nothing to undo.
            if _refused_on_final(_get(api, ns, args.name), "pause"):
                return 1
            _patch(api, ns, args.name, {"spec": {"paused": True}})
            print(f"grayrelease {ns}/{args.name}: paused (spec.paused=true)")
            return 0
        return _request(api, ns, args.name, args.verb, args.wait)
    except ApiException as exc:
        if exc.status == 404:
            print(f"tinct release: grayrelease {ns}/{args.name} not found", file=sys.stderr)
        elif exc.status == 409:
            print(
                f"tinct release: grayrelease {ns}/{args.name} changed while the request was written; try again",
                file=sys.stderr,
            )
        else:
            print(f"tinct release: the API server answered {exc.status}: {exc.reason}", file=sys.stderr)
        return 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tinct.kubeconfig import add_flags

    p = sub.add_parser(
        "release",
        help="show or steer a GrayRelease: status, list, pause, resume, promote, abort, retry",
        description="Show a GrayRelease's dye matrix (status, live with --watch) or every release "
        "(list), or steer one through the Kubernetes API. pause/resume set spec.paused; "
        "promote/abort/retry are requests in the tinct.io/action annotation that the operator "
        "carries out once. A Promoted or RolledBack release is final: pause, resume, promote and "
        "abort are refused there (exit 1, one line, nothing written), and so is retry of a promoted "
        "one. As a kubectl plugin: kubectl tinct status chat --watch.",
    )
    p.add_argument("verb", choices=RELEASE_VERBS, help="what to do: " + ", ".join(RELEASE_VERBS))
    p.add_argument("name", nargs="?", help="GrayRelease name (every verb but list)")
    p.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="list: every namespace")
    p.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help="status: redraw the matrix at every change of the release until it is deleted (Ctrl-C ends)",
    )
    add_flags(p)
    p.add_argument(
        "-o",
        "--output",
        choices=["text", "json", "yaml"],
        default="text",
        help="status and list output format",
    )
    p.add_argument(
        "--color", choices=["auto", "always", "never"], default="auto", help="colour status on a terminal"
    )
    p.add_argument(
        "--wait",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="for promote/abort/retry/resume: wait this long for the operator to carry the request out "
        "or refuse it (exit 1 when refused or not handled in time; 0: do not wait)",
    )
    p.set_defaults(func=_cmd)
