"""A version number held to its interface on the real API server: an ONNX input dropped in a
MINOR bump is flagged on the ModelVersion and its GrayRelease refused; the same change in a
MAJOR bump with ``allowMajorUpgrade`` is released. Artifacts are written by onnx,
safetensors and tokenizers; the operator runs both controllers in this process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tinct.cli import main
from tinct_testing.controlplane.harness import Cluster
from tinct_testing.interface_artifacts import make_version
from tinct_testing.modelversion_cluster import cond, get, mv_doc, wait_phase
from tinct_testing.modelversion_cluster import operator as mv_operator
from tinct_testing.release_cluster import (
    apply,
    condition,
    deployment,
    events,
    example,
    operator,
    release_status,
    service,
    wait_release,
)
from tinct_testing.wait import WAIT, eventually


def _mv(name: str, version: str, files: list[tuple[str, Path]]) -> dict[str, Any]:
    return mv_doc(name, [{"format": fmt, "uri": p.as_uri()} for fmt, p in files], version=version)


def _release(candidate: str, **spec: Any) -> dict[str, Any]:
    doc = example(analysis={"interval": "2s", "metrics": []}, allowMajorUpgrade=True, **spec)
    doc["spec"]["stable"]["modelVersion"] = "llama3-8b-1-2-0"
    doc["spec"]["candidate"]["modelVersion"] = candidate
    return doc


def test_input_removed_refused_as_minor_released_as_major(
    cluster: Cluster, namespace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns, root = namespace, tmp_path / "lineage"
    base = make_version(tmp_path / "1.2.0")
    dropped = make_version(tmp_path / "dropped", inputs=["input_ids"])
    apply(
        cluster, ns, service("sched-v1"), service("sched-v2"), deployment("sched-v1"), deployment("sched-v2")
    )
    with operator(ns, root):
        apply(cluster, ns, _mv("llama3-8b-1-2-0", "1.2.0", base))
        stable = wait_phase(cluster, ns, "llama3-8b-1-2-0", "Ready", "Failed")
        assert stable["status"]["phase"] == "Ready", stable["status"]
        assert cond(stable, "InterfaceCompatible")["reason"] == "NoEarlierVersion"
        assert stable["status"]["interface"]["summary"].startswith(
            "onnx model.onnx: inputs attention_mask,input_ids; outputs logits"
        )

        # The input dropped, declared MINOR: recorded, but it cannot be released as declared.
        apply(cluster, ns, _mv("llama3-8b-1-3-0", "1.3.0", dropped))
        minor = wait_phase(cluster, ns, "llama3-8b-1-3-0", "Ready", "Misversioned", "Failed")
        st = minor["status"]
        assert st["phase"] == "Misversioned", st
        c = cond(minor, "InterfaceCompatible")
        assert (c["status"], c["reason"]) == ("False", "VersionContradictsInterface")
        assert "compared with llama3-8b-1-2-0@1.2.0" in c["message"]
        assert "breaking InputRemoved: onnx model.onnx input attention_mask" in c["message"]
        assert st["message"].startswith("cannot be released as 1.3.0")
        assert st["digests"]["onnx"]  # still recorded
        warned = [
            e for e in events(cluster, ns, "ModelVersion") if e["reason"] == "VersionContradictsInterface"
        ]
        assert warned, "no Event for the contradicted version"
        assert warned[0]["type"] == "Warning"

        apply(cluster, ns, _release("llama3-8b-1-3-0"))
        refused = wait_release(
            cluster,
            ns,
            lambda s: (
                "InputRemoved" in condition(s, "ModelVersionsReady").get("message", "")
                if s.get("conditions")
                else False
            ),
            "the release refused with the differences",
        )
        mvr = condition(refused, "ModelVersionsReady")
        assert mvr["status"] == "False"
        assert "1.2.0 -> 1.3.0 breaks the interface" in mvr["message"]
        assert refused.get("phase") == "Pending"
        assert not refused.get("weights") or set(refused["weights"].values()) == {0}

        # The same artifacts as a MAJOR version, with allowMajorUpgrade: released.
        apply(cluster, ns, _mv("llama3-8b-2-0-0", "2.0.0", dropped))
        major = wait_phase(cluster, ns, "llama3-8b-2-0-0", "Ready", "Misversioned", "Failed")
        assert major["status"]["phase"] == "Ready", major["status"]
        c = cond(major, "InterfaceCompatible")
        assert (c["status"], c["reason"]) == ("True", "InterfaceMatchesVersion")
        assert "compared with llama3-8b-1-2-0@1.2.0" in c["message"]  # not the Misversioned 1.3.0

        apply(cluster, ns, _release("llama3-8b-2-0-0"))
        done = wait_release(cluster, ns, lambda s: s.get("phase") == "Promoted", "Promoted")
        assert condition(done, "ModelVersionsReady")["status"] == "True"
        assert release_status(cluster, ns)["phase"] == "Promoted"

    # What the operator recorded answers the CLI the same way.
    code = main(["lineage", "diff", "llama3-8b@1.2.0", "llama3-8b@1.3.0", "--root", str(root), "-o", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 3  # not compatible
    assert (report["declared"], report["measured"], report["compatible"]) == ("minor", "major", False)
    assert [d["kind"] for d in report["differences"]] == ["InputRemoved"]


def test_order_does_not_matter_the_later_version_waits_for_the_earlier(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """1.2.0 and 1.3.0 (an input dropped) applied together; 1.2.0's checkpoint is on a store
    that is down, so 1.3.0 is verified first. It waits, and once 1.2.0 is Ready it is compared
    with it: Misversioned, not Ready against nothing. A 2.0.0 verified before any earlier
    version of its model is compared again when one appears."""
    from tinct_testing.controlplane.harness import free_port
    from tinct_testing.lineage_artifacts import store_comes_up

    ns, root = namespace, tmp_path / "lineage"
    base = make_version(tmp_path / "1.2.0")
    dropped = make_version(tmp_path / "dropped", inputs=["input_ids"])
    checkpoint = tmp_path / "step.pt"
    checkpoint.write_bytes(b"weights" * 1000)
    port = free_port()
    creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}
    earlier = _mv("llama3-8b-1-2-0", "1.2.0", base)
    earlier["spec"]["source"] = {"uri": "s3://ckpt/step.pt"}
    later = _mv("llama3-8b-1-3-0", "1.3.0", dropped)
    both = yaml.safe_dump_all([earlier, later])
    with mv_operator(ns, root, tmp_path, TINCT_S3_ENDPOINT=f"http://127.0.0.1:{port}", **creds):
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=both)

        def waiting() -> dict[str, Any] | None:
            obj = get(cluster, ns, "llama3-8b-1-3-0")
            conds = ((obj or {}).get("status") or {}).get("conditions") or []
            hit = any(c["reason"] == "WaitingForEarlierVersion" for c in conds)
            return obj if hit else None

        held = eventually(waiting, timeout=WAIT, what="1.3.0 waiting for 1.2.0")
        assert held["status"]["phase"] == "Pending", held["status"]
        assert held["status"]["digests"]["onnx"]  # verified and recorded all the same
        assert cond(held, "InterfaceCompatible")["status"] == "Unknown"
        assert "llama3-8b-1-2-0@1.2.0 is not verified yet" in cond(held, "InterfaceCompatible")["message"]
        ready = cond(held, "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "WaitingForEarlierVersion")

        with store_comes_up(port, "ckpt", {"step.pt": checkpoint}):
            first = wait_phase(cluster, ns, "llama3-8b-1-2-0", "Ready", "Failed")
            assert first["status"]["phase"] == "Ready", first["status"]
            minor = wait_phase(cluster, ns, "llama3-8b-1-3-0", "Misversioned", "Ready")
        st = minor["status"]
        assert st["phase"] == "Misversioned", st
        c = cond(minor, "InterfaceCompatible")
        assert (c["status"], c["reason"]) == ("False", "VersionContradictsInterface")
        assert "compared with llama3-8b-1-2-0@1.2.0" in c["message"]
        assert st["interface"]["comparedWith"] == "llama3-8b-1-2-0@1.2.0"
        assert (cond(minor, "Ready")["status"], cond(minor, "Ready")["reason"]) == (
            "False",
            "VersionContradictsInterface",
        )

        # Another model: 2.0.0 first, alone, compared with nothing; then its 1.0.0 appears.
        second_other = _mv("other-2-0-0", "2.0.0", dropped)
        second_other["spec"]["model"] = "other"
        apply(cluster, ns, second_other)
        alone = wait_phase(cluster, ns, "other-2-0-0", "Ready", "Failed")
        assert cond(alone, "InterfaceCompatible")["reason"] == "NoEarlierVersion"
        first_other = _mv("other-1-0-0", "1.0.0", base)
        first_other["spec"]["model"] = "other"
        apply(cluster, ns, first_other)
        wait_phase(cluster, ns, "other-1-0-0", "Ready")

        def compared() -> dict[str, Any] | None:
            obj = get(cluster, ns, "other-2-0-0")
            c = cond(obj, "InterfaceCompatible") if obj else {}
            return obj if c.get("reason") == "InterfaceMatchesVersion" else None

        again = eventually(compared, timeout=WAIT, what="2.0.0 compared with 1.0.0")
        assert again["status"]["phase"] == "Ready"
        assert "compared with other-1-0-0@1.0.0" in cond(again, "InterfaceCompatible")["message"]
