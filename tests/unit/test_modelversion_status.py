"""Pure builders of the ModelVersion operator: event choice, status and lineage rows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tinct.api.v1alpha1.modelversion import ModelVersion
from tinct.artifacts.hashing import FileDigest
from tinct.artifacts.verify import Failure, Verification
from tinct.lineage.records import BaseRef, model_version_rows
from tinct.operator.adapter import Base
from tinct.operator.modelversion import build_status, event_for

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _mv(status: dict[str, Any] | None = None, generation: int = 1) -> ModelVersion:
    return ModelVersion.model_validate(
        {
            "metadata": {"name": "m", "namespace": "ns", "uid": "u1", "generation": generation},
            "spec": {
                "model": "llama",
                "version": "1.0.0",
                "artifacts": [{"format": "onnx", "uri": "file:///a.onnx"}],
                "quantization": {"method": "awq", "bits": 4, "groupSize": 128},
                "runtime": "vllm",
            },
            "status": status,
        }
    )


def _ok() -> Verification:
    d = FileDigest(uri="file:///a.onnx", sha256="a" * 64, size=10)
    return Verification(files=[("onnx", d)], digests={"onnx": "a" * 64})


def test_event_names() -> None:
    assert event_for(_mv(), _ok()) == "registered"
    ready = {"phase": "Ready", "lineage": {"table": "/t", "version": 3}, "observedGeneration": 1}
    assert event_for(_mv(ready, generation=2), _ok()) == "updated"
    assert event_for(_mv(), Verification(failure=Failure("Verified", "DigestMismatch", "x"))) == "failed"


def test_ready_status() -> None:
    st = build_status(_mv(), _ok(), "/t/model_versions", 7, NOW)
    assert st.phase == "Ready"
    assert st.observed_generation == 1
    assert st.digests is not None
    assert st.digests.onnx == "a" * 64
    assert st.lineage is not None
    assert (st.lineage.table, st.lineage.version) == ("/t/model_versions", 7)
    assert {c.type: c.status for c in st.conditions} == {
        "Compatible": "True",
        "Verified": "True",
        "Recorded": "True",
        "Ready": "True",
    }
    ready = next(c for c in st.conditions if c.type == "Ready")
    assert (ready.reason, ready.message, ready.observed_generation) == (
        "VerifiedAndRecorded",
        "1 file(s), 10 bytes verified",
        1,
    )
    assert "progress" not in st.wire()


def test_failed_status_keeps_transition_time_of_unchanged_conditions() -> None:
    first = build_status(_mv(), _ok(), "/t", 1, NOW)
    later = datetime(2026, 2, 1, tzinfo=UTC)
    bad = Verification(failure=Failure("Verified", "DigestMismatch", "declared digest differs"))
    mv = _mv(first.wire(), generation=2)
    st = build_status(mv, bad, "/t", 2, later)
    assert (st.phase, st.message) == ("Failed", "declared digest differs")
    conds = {c.type: c for c in st.conditions}
    assert (conds["Verified"].status, conds["Verified"].reason) == ("False", "DigestMismatch")
    assert conds["Verified"].last_transition_time == later
    assert conds["Compatible"].last_transition_time == NOW
    # Ready says what holds it: the failed condition's reason, from the moment it failed.
    ready = conds["Ready"]
    assert (ready.status, ready.reason, ready.message) == (
        "False",
        "DigestMismatch",
        "declared digest differs",
    )
    assert (ready.observed_generation, ready.last_transition_time) == (2, later)


def test_incompatible_is_reported_on_compatible() -> None:
    bad = Verification(failure=Failure("Compatible", "AsymmetricAWQUnsupported", "no"))
    conds = {c.type: c for c in build_status(_mv(), bad, "/t", 1, NOW).conditions}
    assert (conds["Compatible"].status, conds["Compatible"].reason) == ("False", "AsymmetricAWQUnsupported")
    assert conds["Verified"].status == "Unknown"
    assert (conds["Ready"].status, conds["Ready"].reason) == ("False", "AsymmetricAWQUnsupported")


def test_ready_is_false_while_something_holds_the_version() -> None:
    ready = build_status(_mv(), _ok(), "/t", 1, NOW)
    later = datetime(2026, 2, 1, tzinfo=UTC)
    st = ready.held("Verified", "StorageUnavailable", "retrying in 5s: s3 down", 2, later)
    conds = {c.type: c for c in st.conditions}
    assert st.phase == "Ready"  # the phase is the last verdict; Ready speaks for generation 2
    assert (conds["Verified"].status, conds["Verified"].reason) == ("Unknown", "StorageUnavailable")
    assert (conds["Ready"].status, conds["Ready"].reason, conds["Ready"].message) == (
        "False",
        "StorageUnavailable",
        "retrying in 5s: s3 down",
    )
    assert st.merge_patch("phase", "message", "conditions").keys() == {"phase", "message", "conditions"}


def test_rows() -> None:
    rows = model_version_rows(_mv(), "registered", _ok(), now=NOW, operator_version="1.2.3")
    (row,) = rows["model_versions"]
    assert row["event_id"] == "u1/1/registered"
    assert (row["quantization_method"], row["quantization_group_size"], row["runtime"]) == (
        "awq",
        128,
        "vllm",
    )
    assert row["operator_version"] == "1.2.3"
    assert [a["sha256"] for a in rows["artifacts"]] == ["a" * 64]
    retired = model_version_rows(_mv(generation=5), "retired", Verification(digests={"onnx": "b" * 64}))
    assert retired["model_versions"][0]["event_id"] == "u1/retired"
    assert retired["model_versions"][0]["onnx_sha256"] == "b" * 64
    assert retired["artifacts"] == []


def test_a_huge_failure_message_is_summarised_to_fit_the_status() -> None:
    """340k characters (an index naming 10,000 missing shards, listed in full) still give a
    status the API server accepts: the message cut in the middle, start and end kept."""
    from tinct.api.v1alpha1.common import MESSAGE_MAX, Condition
    from tinct.text import listing

    names = [f"model-{i:05d}-of-10000.safetensors" for i in range(1, 10_001)]
    huge = "the index names shard(s) " + ", ".join(names) + ": re-export the artifacts together"
    assert len(huge) > 340_000
    failed = Verification(failure=Failure("Verified", "InterfaceInconsistent", huge))
    st = build_status(_mv(), failed, "/t/model_versions", 7, NOW)
    verified = next(c for c in st.conditions if c.type == "Verified")
    for text in (st.message or "", verified.message):
        assert len(text) == MESSAGE_MAX
        assert text.startswith("the index names shard(s) model-00001-of-10000.safetensors, ")
        assert text.endswith(": re-export the artifacts together")
        assert " … " in text
    assert len(Condition(type="T", status="True", message="x" * 100_000).message) == MESSAGE_MAX
    assert listing(names) == (
        "model-00001-of-10000.safetensors, model-00002-of-10000.safetensors, "
        "model-00003-of-10000.safetensors, … and 9,997 more"
    )
    assert listing(names[:2]) == "model-00001-of-10000.safetensors, model-00002-of-10000.safetensors"


def _adapter() -> tuple[ModelVersion, Verification]:
    mv = ModelVersion.model_validate(
        {
            "metadata": {"name": "support-1-0-0", "namespace": "ns", "uid": "u2", "generation": 1},
            "spec": {
                "model": "support",
                "version": "1.0.0",
                "adapter": {"baseModelVersion": "llama-1-0-0"},
                "artifacts": [
                    {"format": "lora", "uri": "s3://a/support/adapter_config.json"},
                    {"format": "lora", "uri": "s3://a/support/adapter_model.safetensors"},
                ],
            },
        }
    )
    files = [
        ("lora", FileDigest(uri="s3://a/support/adapter_config.json", sha256="c" * 64, size=300)),
        ("lora", FileDigest(uri="s3://a/support/adapter_model.safetensors", sha256="d" * 64, size=900)),
    ]
    lora = {
        "peft_type": "LORA",
        "r": 8,
        "lora_alpha": 16,
        "target_modules": ["q_proj", "v_proj"],
        "base_model": "llama",
        "max_rank": 8,
        "modules": {"model.layers.0.self_attn.q_proj": {}, "model.layers.0.self_attn.v_proj": {}},
        "extra_tensors": [],
    }
    return mv, Verification(files=files, digests={"lora": "e" * 64}, interface={"lora": lora})


BASE = Base(name="llama-1-0-0", uid="u1", model="llama", version="1.0.0", max_rank=16, quantized=False)


def test_an_adapter_that_fits_is_ready_with_its_served_name_and_base() -> None:
    mv, v = _adapter()
    st = build_status(mv, v, "/t/model_versions", 3, NOW, base=BASE)
    assert st.phase == "Ready"
    assert st.digests is not None
    assert st.digests.lora == "e" * 64
    assert st.adapter is not None
    assert st.adapter.wire() == {
        "baseModelVersion": "llama-1-0-0",
        "baseModel": "llama",
        "servedName": "support-" + "e" * 12,
        "path": "s3://a/support",
        "rank": 8,
        "modules": 2,
    }
    (fits,) = [c for c in st.conditions if c.type == "BaseCompatible"]
    assert (fits.status, fits.reason) == ("True", "AdapterFitsBase")
    assert "rank 8 within maxLoraRank 16" in fits.message


def test_an_adapter_that_does_not_fit_fails_on_base_compatible_with_its_files_verified() -> None:
    mv, v = _adapter()
    v.failure = Failure("BaseCompatible", "ShapeMismatch", "module m: lora_A is [8, 4] ...")
    st = build_status(mv, v, "/t/model_versions", 3, NOW, base=BASE)
    assert (st.phase, st.message) == ("Failed", "module m: lora_A is [8, 4] ...")
    conds = {c.type: (c.status, c.reason) for c in st.conditions}
    assert conds["BaseCompatible"] == ("False", "ShapeMismatch")
    assert conds["Verified"] == ("True", "DigestsVerified")


def test_an_adapter_event_records_its_facts_and_base() -> None:
    mv, v = _adapter()
    rows = model_version_rows(
        mv,
        "registered",
        v,
        now=NOW,
        base=BaseRef(name="llama-1-0-0", uid="u1", model="llama", version="1.0.0"),
    )
    (row,) = rows["adapters"]
    assert row["event_id"] == rows["model_versions"][0]["event_id"] == "u2/1/registered"
    assert {k: row[k] for k in ("base_model_version", "base_uid", "peft_type", "rank", "lora_alpha")} == {
        "base_model_version": "llama-1-0-0",
        "base_uid": "u1",
        "peft_type": "LORA",
        "rank": 8,
        "lora_alpha": 16.0,
    }
    assert (row["target_modules"], row["modules"], row["config_base_model"]) == (
        ["q_proj", "v_proj"],
        2,
        "llama",
    )
    assert (row["lora_sha256"], row["served_name"]) == ("e" * 64, "support-" + "e" * 12)
    assert "adapters" not in model_version_rows(_mv(), "registered", _ok(), now=NOW)
