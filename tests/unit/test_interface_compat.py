"""A version's number held to its interface: the predecessor, the condition, the phase, and
the GrayRelease precondition, on interfaces of real artifacts."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tinct.api.v1alpha1.grayrelease import GrayReleaseSpec
from tinct.api.v1alpha1.modelversion import ModelVersion
from tinct.artifacts.contract import verdict
from tinct.artifacts.formats import validate
from tinct.artifacts.hashing import FileDigest
from tinct.artifacts.interface import Interface, combine, digest
from tinct.artifacts.verify import Verification
from tinct.operator.grayrelease.preconditions import preconditions
from tinct.operator.interface import Comparison, predecessor, semver_key, to_compare_again, unsettled
from tinct.operator.modelversion import build_status
from tinct_testing.interface_artifacts import make_version
from tinct_testing.paths import EXAMPLES

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _interface(directory: Path, **kw: Any) -> Interface:
    files = make_version(directory, **kw)
    return combine((fmt, p.as_uri(), validate(p.as_uri(), fmt)) for fmt, p in files)


@pytest.fixture(scope="module")
def interfaces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Interface]:
    base = tmp_path_factory.mktemp("compat")
    return {
        "base": _interface(base / "base"),
        "no_mask": _interface(base / "no_mask", inputs=["input_ids"]),
        "more_out": _interface(base / "more_out", outputs=["logits", "hidden_states"]),
    }


def _obj(
    name: str, version: str, *, phase: str = "Ready", model: str = "llama3-8b", iface: str = "d"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "spec": {"model": model, "version": version},
        "status": {"phase": phase, "interface": {"digest": iface}, "digests": {"onnx": "a" * 64}},
    }


def _mv(version: str) -> ModelVersion:
    return ModelVersion.model_validate(
        {
            "metadata": {"name": "new", "namespace": "llm", "uid": "uid-new", "generation": 1},
            "spec": {
                "model": "llama3-8b",
                "version": version,
                "artifacts": [{"format": "onnx", "uri": "file:///m.onnx"}],
            },
        }
    )


def test_predecessor_is_the_highest_ready_version_below() -> None:
    objects = [
        _obj("a", "1.2.0"),
        _obj("b", "1.10.0"),
        _obj("c", "1.11.0-rc.1"),
        _obj("d", "1.11.0"),  # not below
        _obj("e", "1.10.5", phase="Failed"),
        _obj("f", "1.10.9", model="other"),
        _obj("g", "1.10.8", phase="Misversioned"),
    ]
    got = predecessor(_mv("1.11.0"), objects)
    assert got is not None
    assert got["metadata"]["name"] == "c"
    assert predecessor(_mv("1.0.0"), objects) is None
    key_rc, key_rel = semver_key("1.11.0-rc.1"), semver_key("1.11.0")
    assert key_rc is not None
    assert key_rel is not None
    assert key_rc < key_rel


def _ok(interface: Interface) -> Verification:
    d = FileDigest(uri="file:///m.onnx", sha256="a" * 64, size=10)
    return Verification(files=[("onnx", d)], digests={"onnx": "a" * 64}, interface=interface)


def _compatible(st: Any) -> Any:
    """The InterfaceCompatible condition of status ``st``."""
    return next(c for c in st.conditions if c.type == "InterfaceCompatible")


def _against(base: str, old: str, new: str, interfaces: dict[str, Interface]) -> Any:
    """The status of version ``new`` (without the attention mask) compared with ``base`` at ``old``."""
    v = verdict(old, new, interfaces["base"], interfaces["no_mask"])
    return build_status(
        _mv(new), _ok(interfaces["no_mask"]), "t", 1, NOW, Comparison(base=f"{base}@{old}", verdict=v)
    )


def test_input_removed_in_a_minor_bump_is_misversioned(interfaces: dict[str, Interface]) -> None:
    st = _against("base-mv", "1.2.0", "1.3.0", interfaces)
    assert st.phase == "Misversioned"
    cond = _compatible(st)
    assert (cond.status, cond.reason) == ("False", "VersionContradictsInterface")
    assert "compared with base-mv@1.2.0" in cond.message
    assert "breaking InputRemoved: onnx model.onnx input attention_mask" in cond.message
    assert st.message is not None
    assert st.message.startswith("cannot be released as 1.3.0")
    assert st.interface is not None
    assert st.interface.digest == digest(interfaces["no_mask"])


def test_the_same_change_in_a_major_bump_is_ready(interfaces: dict[str, Interface]) -> None:
    st = _against("b", "1.2.0", "2.0.0", interfaces)
    assert st.phase == "Ready"
    cond = _compatible(st)
    assert (cond.status, cond.reason) == ("True", "InterfaceMatchesVersion")


def test_no_earlier_version_and_unreadable_comparison() -> None:
    st = build_status(_mv("1.0.0"), _ok({}), "t", 1, NOW, Comparison())
    cond = _compatible(st)
    assert (st.phase, cond.status, cond.reason) == ("Ready", "True", "NoEarlierVersion")
    st = build_status(_mv("1.0.0"), _ok({}), "t", 1, NOW, Comparison(error="lineage down"))
    cond = _compatible(st)
    assert (st.phase, cond.status, cond.reason) == ("Ready", "Unknown", "ComparisonUnavailable")


def _at(obj: dict[str, Any], reason: str | None = None, compared: str | None = None) -> dict[str, Any]:
    """``obj`` verified at generation 1, compared with ``compared`` (InterfaceCompatible ``reason``)."""
    obj["metadata"]["generation"] = 1
    obj["status"]["observedGeneration"] = 1
    obj["status"]["interface"]["comparedWith"] = compared
    if reason is not None:
        obj["status"]["conditions"] = [{"type": "InterfaceCompatible", "status": "True", "reason": reason}]
    return obj


def test_an_earlier_version_still_verifying_is_waited_for() -> None:
    objects = [_obj("a", "1.2.0"), _obj("b", "1.4.0", phase="Hashing"), _obj("c", "1.3.0", phase="Failed")]
    waiting = unsettled(_mv("2.0.0"), objects)
    assert waiting is not None
    assert waiting["metadata"]["name"] == "b"
    # Below the predecessor, or settled, it changes nothing.
    assert unsettled(_mv("1.3.5"), objects) is None
    objects[1]["status"]["phase"] = "Ready"
    assert unsettled(_mv("2.0.0"), objects) is None
    # Waiting for an earlier one itself: not settled either.
    assert unsettled(_mv("2.0.0"), [_obj("b", "1.4.0", phase="Pending")]) is not None
    # One on its way out is not waited for.
    going = _obj("b", "1.4.0", phase="Hashing")
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert unsettled(_mv("2.0.0"), [going]) is None


def test_waiting_is_pending_and_not_ready() -> None:
    st = build_status(_mv("2.0.0"), _ok({}), "t", 1, NOW, Comparison(waiting="b@1.4.0"))
    cond = _compatible(st)
    assert (st.phase, cond.status, cond.reason) == ("Pending", "Unknown", "WaitingForEarlierVersion")
    assert "b@1.4.0 is not verified yet" in cond.message
    assert st.message == "1 file(s), 10 bytes verified; waiting for b@1.4.0 to compare interfaces with"
    ready = next(c for c in st.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "WaitingForEarlierVersion")
    assert st.lineage is not None  # verified and recorded all the same


def test_a_version_that_settles_is_compared_with_by_the_later_ones() -> None:
    settled = _at(_obj("b", "1.4.0"))
    objects = [
        _at(_obj("a", "1.2.0")),
        settled,
        _at(_obj("new", "2.0.0"), "NoEarlierVersion"),  # verified first: compared with nothing
        _at(_obj("older", "2.1.0"), "InterfaceMatchesVersion", "a@1.2.0"),  # 2.0.0 is between
        _at(_obj("w", "3.0.0", phase="Pending"), "WaitingForEarlierVersion"),
        _at(_obj("done", "1.5.0"), "InterfaceMatchesVersion", "b@1.4.0"),  # already compared with it
        _at(_obj("low", "1.3.0"), "NoEarlierVersion"),  # below it
        _at(_obj("x", "2.5.0", model="other"), "NoEarlierVersion"),
    ]
    again = [o["metadata"]["name"] for o in to_compare_again(settled, objects)]
    # 1.5.0 is the predecessor of 2.0.0 and 2.1.0, not 1.4.0; the one waiting looks again anyway.
    assert again == ["w"]
    objects = [o for o in objects if o["metadata"]["name"] != "done"]
    assert [o["metadata"]["name"] for o in to_compare_again(settled, objects)] == ["new", "w"]
    # A version still being verified is no reason to look again.
    hashing = _at(_obj("b", "1.4.0", phase="Hashing"))
    assert to_compare_again(hashing, objects) == []


def _release(allow_major: bool) -> GrayReleaseSpec:
    """examples/grayrelease.yaml between ModelVersions ``s`` and ``c``."""
    doc = yaml.safe_load((EXAMPLES / "grayrelease.yaml").read_text())
    spec = doc["spec"]
    spec["stable"]["modelVersion"], spec["candidate"]["modelVersion"] = "s", "c"
    spec["allowMajorUpgrade"] = allow_major
    return GrayReleaseSpec.model_validate(spec)


BACKENDS = {"sched-v1": True, "sched-v2": True}


def _problems(
    interfaces: dict[str, Interface], old: str, new: str, candidate: str, *, allow_major: bool
) -> list[Any]:
    mvs = {
        "s": _obj("s", old, iface=digest(interfaces["base"])),
        "c": _obj("c", new, iface=digest(interfaces[candidate])),
    }
    found = {"s": interfaces["base"], "c": interfaces[candidate]}
    return [
        p
        for p in preconditions(_release(allow_major), mvs, BACKENDS, BACKENDS, found)
        if p.condition == "ModelVersionsReady"
    ]


def test_release_refuses_a_breaking_change_in_a_minor_bump(interfaces: dict[str, Interface]) -> None:
    problems = _problems(interfaces, "1.2.0", "1.3.0", "no_mask", allow_major=True)
    assert [p.reason for p in problems] == ["BreakingInterfaceChange"]
    assert "breaking InputRemoved: onnx model.onnx input attention_mask" in problems[0].message
    assert "publish the candidate as a new MAJOR version" in problems[0].message


def test_release_of_a_breaking_change_needs_major_and_allow(interfaces: dict[str, Interface]) -> None:
    refused = _problems(interfaces, "1.2.0", "2.0.0", "no_mask", allow_major=False)
    assert {p.reason for p in refused} == {"MajorUpgradeNotAllowed", "BreakingInterfaceChange"}
    assert _problems(interfaces, "1.2.0", "2.0.0", "no_mask", allow_major=True) == []


def test_release_of_an_additive_change(interfaces: dict[str, Interface]) -> None:
    assert _problems(interfaces, "1.2.0", "1.3.0", "more_out", allow_major=False) == []
    patch = _problems(interfaces, "1.2.0", "1.2.1", "more_out", allow_major=False)
    assert [p.reason for p in patch] == ["VersionContradictsInterface"]
    assert "additive OutputAdded" in patch[0].message


def test_release_with_identical_interfaces_reads_nothing(interfaces: dict[str, Interface]) -> None:
    mvs = {"s": _obj("s", "1.2.0", iface="x"), "c": _obj("c", "1.2.1", iface="x")}
    assert preconditions(_release(False), mvs, BACKENDS, BACKENDS, {}) == []


def test_release_waits_when_an_interface_cannot_be_read(interfaces: dict[str, Interface]) -> None:
    mvs = {"s": _obj("s", "1.2.0", iface="x"), "c": _obj("c", "1.2.1", iface="y")}
    problems = preconditions(_release(False), mvs, BACKENDS, BACKENDS, {})
    assert [p.reason for p in problems] == ["InterfaceNotRecorded"]
