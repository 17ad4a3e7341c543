"""A status the operator can vouch for: sealed, numbered, checked against its record."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from tinct.api.routing import configmap_name
from tinct.api.v1alpha1.grayrelease import GrayRelease, GrayReleaseStatus
from tinct.operator.grayrelease.decide import decide
from tinct.operator.grayrelease.decision import Inputs
from tinct.operator.grayrelease.kube import FoundTable
from tinct.operator.grayrelease.runtime import Runtime, Written
from tinct.operator.grayrelease.seal import Record, digest, parse_record, sealed, verdict
from tinct.operator.grayrelease.tables import desired_table
from tinct_testing.release_helpers import T0, release, result, step

KEY = b"k" * 32


def _progressing() -> GrayRelease:
    gr = step(release(), T0)
    gr = step(gr, T0 + timedelta(minutes=5), result("Pass", T0 + timedelta(minutes=5)))
    assert gr.status is not None
    return gr


def _as_stored(status: GrayReleaseStatus) -> GrayReleaseStatus:
    """What a reader gets back from the API server for ``status`` written whole."""
    return GrayReleaseStatus.model_validate(status.wire())


def test_a_sealed_status_verifies_after_the_round_trip_and_a_changed_one_does_not() -> None:
    st = sealed(KEY, "uid-1", _progressing().status.model_copy(deep=True), 7)  # type: ignore[union-attr]
    back = _as_stored(st)
    assert back.sequence == 7
    assert verdict(KEY, "uid-1", back) is None
    assert verdict(KEY, "uid-2", back) is not None, "bound to the release's uid"
    assert verdict(b"other" * 8, "uid-1", back) is not None, "bound to the key"
    forged = back.model_copy(update={"phase": "Promoted", "step": 3})
    assert verdict(KEY, "uid-1", forged) == "its seal does not verify: it was not written by the operator"
    assert "does not parse" in (verdict(KEY, "uid-1", None, valid=False) or "")


def test_a_replayed_sealed_status_is_older_than_the_record() -> None:
    gr = _progressing()
    uid = "uid-1"
    old = sealed(KEY, uid, gr.status.model_copy(deep=True), 3)  # type: ignore[union-attr]
    new = sealed(KEY, uid, old.model_copy(update={"step": 2}), 4)
    record = Record.of(uid, new)
    assert verdict(KEY, uid, _as_stored(new), record=record) is None
    why = verdict(KEY, uid, _as_stored(old), record=record)
    assert why is not None
    assert "older status (sequence 3)" in why
    # Written and sealed, its record not written yet (the operator killed between the two).
    newer = sealed(KEY, uid, new.model_copy(update={"step": 3}), 5)
    assert verdict(KEY, uid, _as_stored(newer), record=record) is None
    # Exactly the recorded status is the operator's own under any key (a restart without one).
    assert verdict(b"fresh-key" * 4, uid, _as_stored(new), record=record) is None
    assert verdict(KEY, uid, None, record=record) == "it was removed"


def test_the_record_round_trips_and_its_core_is_enough_to_go_on() -> None:
    st = sealed(KEY, "uid-1", _progressing().status.model_copy(deep=True), 9)  # type: ignore[union-attr]
    record = Record.of("uid-1", st)
    again = parse_record(record.to_json())
    assert again == record
    assert len(record.to_json()) < 4096
    core = record.status()
    assert (core.phase, core.step, core.attempt, core.transitions, core.sequence) == (
        st.phase,
        st.step,
        st.attempt,
        st.transitions,
        9,
    )
    assert core.routing == st.routing
    assert core.conditions == [], "what people read is not kept"
    assert parse_record("{not json") is None
    assert parse_record('{"uid": "u", "sequence": 1, "digest": "d", "core": {"phase": "Hacked"}}') is None
    assert record.digest == digest(_as_stored(st))


def test_a_status_from_before_sealing_is_adopted_only_when_it_agrees_with_its_table() -> None:
    gr = _progressing()
    st = gr.status
    assert st is not None
    assert st.routing is not None
    table = desired_table(gr, st, st.routing.version)
    assert verdict(KEY, "uid-1", st, table=table) is None
    promoted = st.model_copy(update={"phase": "Promoted", "step": 3})
    assert verdict(KEY, "uid-1", promoted, table=table) is not None
    assert verdict(KEY, "uid-1", st) is not None, "no table: nothing to agree with"
    assert verdict(KEY, "uid-1", GrayReleaseStatus()) is None, "an empty status is no status"


def _runtime(record: Record | None) -> Runtime:
    rt = Runtime(key=KEY)

    class Tables:
        synced = None

        def __init__(self) -> None:
            self.tables: dict[str, FoundTable] = {}

        def get(self, name: str) -> FoundTable | None:
            return self.tables.get(name)

    tables = Tables()
    if record is not None:
        tables.tables[configmap_name("llm", "chat")] = FoundTable("cm", 1, "d", None, 0.0, record)
    rt.tables = tables  # type: ignore[assignment]
    return rt


def _body(gr: GrayRelease, status: dict[str, Any] | None) -> dict[str, Any]:
    doc = gr.model_dump(by_alias=True, mode="json", exclude={"status"})
    doc["metadata"]["resourceVersion"] = "10"
    doc["status"] = status
    return doc


def test_a_forged_status_is_not_acted_on_the_operator_goes_on_from_its_own() -> None:
    gr = _progressing()
    mine = sealed(KEY, "uid-1", gr.status.model_copy(deep=True), 5)  # type: ignore[union-attr]
    record = Record.of("uid-1", mine)
    forged = mine.wire() | {"phase": "Promoted", "step": 3, "candidateWeight": 100}
    # From the record alone (the operator restarted).
    rt = _runtime(record)
    start = rt.begin(("llm", "chat"), _body(gr, forged), asyncio.Event())  # type: ignore[arg-type]
    assert start.tampered is not None
    assert "its seal does not verify" in start.tampered
    assert "the operator's record of the last status it wrote" in start.tampered
    assert start.release.status is not None
    assert (start.release.status.phase, start.release.status.step) == (mine.phase, mine.step)
    assert start.base == "10", "the round writes over the forged status"
    # From memory (the operator running), preferred over the record.
    rt.written[("llm", "chat")] = Written("uid-1", "9", "9", mine)
    start = rt.begin(("llm", "chat"), _body(gr, forged), asyncio.Event())  # type: ignore[arg-type]
    assert start.tampered is not None
    assert "the status the operator wrote last" in start.tampered
    assert start.release.status == mine
    # Its own status passes.
    start = rt.begin(("llm", "chat"), _body(gr, _as_stored(mine).wire()), asyncio.Event())  # type: ignore[arg-type]
    assert start.tampered is None
    # A status that does not even parse is not the operator's either.
    start = rt.begin(("llm", "chat"), _body(gr, {"phase": "Promoted", "step": -1}), asyncio.Event())  # type: ignore[arg-type]
    assert start.tampered is not None
    assert "does not parse" in start.tampered


def test_the_round_after_a_tamper_says_so_once_the_release_moves_on_it_is_verified_again() -> None:
    gr = _progressing()
    d = decide(gr, Inputs(now=T0 + timedelta(minutes=6), tampered="the status was not the operator's"))
    assert [(t.reason, t.warning, t.record) for t in d.transitions][:1] == [("StatusTampered", True, False)]
    cond = next(c for c in d.status.conditions if c.type == "StatusVerified")
    assert (cond.status, cond.reason) == ("False", "StatusTampered")
    later = step(
        gr.model_copy(update={"status": d.status}),
        T0 + timedelta(minutes=20),
        result("Pass", T0 + timedelta(minutes=20)),
    )
    assert later.status is not None
    cond = next(c for c in later.status.conditions if c.type == "StatusVerified")
    assert (cond.status, cond.reason) == ("True", "Sealed")


def test_an_older_view_of_its_own_writes_is_no_tamper_a_replay_is() -> None:
    gr = _progressing()
    first = sealed(KEY, "uid-1", gr.status.model_copy(deep=True), 5)  # type: ignore[union-attr]
    second = sealed(KEY, "uid-1", first.model_copy(update={"history": []}), 6)
    rt = _runtime(Record.of("uid-1", second))
    rt.written[("llm", "chat")] = Written("uid-1", "9", "11", second, ("9", "10", "11"))
    # The watch still has the round's first write (rv 10) when the next round starts.
    lagging = _body(gr, _as_stored(first).wire()) | {}
    lagging["metadata"]["resourceVersion"] = "10"
    assert not rt.foreign(("llm", "chat"), lagging)
    start = rt.begin(("llm", "chat"), lagging, asyncio.Event())  # type: ignore[arg-type]
    assert start.tampered is None
    assert (start.release.status, start.base) == (second, "11")
    # The same status written back by someone else later (rv 12): a replay.
    replayed = _body(gr, _as_stored(first).wire())
    replayed["metadata"]["resourceVersion"] = "12"
    assert rt.foreign(("llm", "chat"), replayed)
    start = rt.begin(("llm", "chat"), replayed, asyncio.Event())  # type: ignore[arg-type]
    assert start.tampered is not None
    assert "replayed" in start.tampered
    assert (start.release.status, start.base) == (second, "12")
