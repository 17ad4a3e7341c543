"""LoRA adapters: both files read within bounds, joined into one adapter, held to their base."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tinct.api.v1alpha1.modelversion import ModelVersionSpec
from tinct.artifacts.contract import diff
from tinct.artifacts.fair import FairPool
from tinct.artifacts.formats import FormatError, validate
from tinct.artifacts.interface import InterfaceError, combine, summary
from tinct.artifacts.limits import LORA_CONFIG_MAX_BYTES
from tinct.artifacts.lora import check_against_base, served_name
from tinct.artifacts.verify import Verification, verify
from tinct_testing.lora_artifacts import HIDDEN, KV, adapter_artifacts, make_adapter, make_base


@pytest.fixture
def pool() -> Iterator[FairPool]:
    p = FairPool(2)
    yield p
    p.shutdown()


def _facts(directory: Path) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        ("lora", p.as_uri(), validate(p.as_uri(), "lora"))
        for p in (directory / "adapter_config.json", directory / "adapter_model.safetensors")
    ]


def _base_interface(tmp_path: Path) -> dict[str, Any]:
    path = make_base(tmp_path / "model.safetensors")
    return combine([("safetensors", path.as_uri(), validate(path.as_uri(), "safetensors"))])


def test_the_config_and_the_weights_join_into_one_adapter(tmp_path: Path) -> None:
    d = make_adapter(tmp_path / "sql", r=4, alpha=8, targets=("q_proj", "v_proj"))
    config = validate((d / "adapter_config.json").as_uri(), "lora")
    assert config == {
        "file": "adapter_config.json",
        "peft_type": "LORA",
        "r": 4,
        "lora_alpha": 8,
        "target_modules": ["q_proj", "v_proj"],
        "base_model": "llama3-8b",
        "rank_pattern": {},
        "task_type": "CAUSAL_LM",
        "use_dora": False,
    }
    lora = combine(_facts(d))["lora"]
    assert (lora["r"], lora["max_rank"], lora["base_model"]) == (4, 4, "llama3-8b")
    assert lora["modules"]["model.layers.0.self_attn.q_proj"] == {
        "rank": 4,
        "lora_A": [4, HIDDEN],
        "lora_B": [HIDDEN, 4],
        "base_shape": [HIDDEN, HIDDEN],
    }
    assert lora["modules"]["model.layers.1.self_attn.v_proj"]["base_shape"] == [KV, HIDDEN]
    assert len(lora["modules"]) == 4
    assert summary({"lora": lora}) == "lora: r 4, alpha 8, 4 modules (q_proj,v_proj), base llama3-8b"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"bad": {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": (HIDDEN, 2)}},
            r"module 'model.layers.0.self_attn.q_proj': lora_A is \[4, 16\] and lora_B is \[16, 2\]",
        ),
        ({"config": {"r": 8}}, r"has rank 4 but adapter_config.json says r=8"),
        (
            {"config": {"target_modules": ["q_proj", "v_proj", "gate_proj"]}},
            r"gate_proj.*have no lora weights",
        ),
    ],
)
def test_an_adapter_at_odds_with_itself_is_refused(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    d = make_adapter(tmp_path / "a", r=4, **change)
    with pytest.raises(InterfaceError, match=message):
        combine(_facts(d))


def test_the_two_files_are_one_directory_under_their_own_names(tmp_path: Path) -> None:
    d = make_adapter(tmp_path / "a")
    other = tmp_path / "b"
    other.mkdir()
    (other / "adapter_config.json").write_bytes((d / "adapter_config.json").read_bytes())
    apart = [_facts(d)[1], ("lora", (other / "adapter_config.json").as_uri(), _facts(d)[0][2])]
    with pytest.raises(InterfaceError, match="one directory"):
        combine(apart)
    renamed = d / "weights.safetensors"
    renamed.write_bytes((d / "adapter_model.safetensors").read_bytes())
    with pytest.raises(InterfaceError, match="must be named"):
        combine([_facts(d)[0], ("lora", renamed.as_uri(), validate(renamed.as_uri(), "lora"))])
    with pytest.raises(InterfaceError, match=r"one adapter_config\.json and one"):
        combine(_facts(d)[:1])


def test_a_config_that_is_no_lora_config_is_invalid_and_a_huge_one_over_its_cap(tmp_path: Path) -> None:
    d = make_adapter(tmp_path / "a", config={"peft_type": "IA3"})
    with pytest.raises(FormatError, match="peft_type is 'IA3'"):
        validate((d / "adapter_config.json").as_uri(), "lora")
    big = tmp_path / "big" / "adapter_config.json"
    big.parent.mkdir()
    big.write_text(json.dumps({"peft_type": "LORA", "r": 4, "notes": "x" * LORA_CONFIG_MAX_BYTES}))
    with pytest.raises(FormatError) as err:
        validate(big.as_uri(), "lora")
    assert err.value.limit == "LORA_CONFIG_MAX_BYTES"


def test_an_adapter_that_fits_its_base_passes(tmp_path: Path) -> None:
    lora = combine(_facts(make_adapter(tmp_path / "a", r=8)))["lora"]
    base = _base_interface(tmp_path)
    fits = check_against_base(lora, base, base_name="llama3-8b-1-0-0", base_model="llama3-8b", max_rank=16)
    assert fits is None
    # The config may name the base as the hub does: its last part is the model.
    lora["base_model"] = "meta/LLAMA3-8B"
    assert check_against_base(lora, base, base_name="b", base_model="llama3-8b", max_rank=None) is None


def test_a_base_of_other_shapes_names_the_module_and_both_shapes(tmp_path: Path) -> None:
    lora = combine(_facts(make_adapter(tmp_path / "a", r=4, kv=4)))["lora"]
    base = _base_interface(tmp_path)
    got = check_against_base(lora, base, base_name="llama3-8b-1-0-0", base_model="llama3-8b", max_rank=16)
    assert got is not None
    assert got.reason == "ShapeMismatch"
    assert got.message == (
        "module model.layers.0.self_attn.v_proj: the adapter's lora_A is [4, 16] and lora_B is [4, 4], "
        "which fit a base weight of [4, 16], but base ModelVersion llama3-8b-1-0-0 has "
        "model.layers.0.self_attn.v_proj.weight F16[8,16]"
    )


def test_rank_base_model_and_modules_are_held_to_the_base(tmp_path: Path) -> None:
    base = _base_interface(tmp_path)
    wide = combine(_facts(make_adapter(tmp_path / "w", r=32)))["lora"]
    got = check_against_base(wide, base, base_name="b", base_model="llama3-8b", max_rank=16)
    assert got is not None
    assert (got.reason, "r=32 is over maxLoraRank 16" in got.message) == ("RankTooLarge", True)
    other = combine(_facts(make_adapter(tmp_path / "o", base_model="mistral-7b")))["lora"]
    got = check_against_base(other, base, base_name="b", base_model="llama3-8b", max_rank=None)
    assert got is not None
    assert got.reason == "BaseModelMismatch"
    assert "'mistral-7b'" in got.message
    deep = combine(_facts(make_adapter(tmp_path / "d", layers=3)))["lora"]
    got = check_against_base(deep, base, base_name="b", base_model="llama3-8b", max_rank=None)
    assert got is not None
    assert got.reason == "ModuleMissing"
    assert "model.layers.2.self_attn.q_proj" in got.message
    got = check_against_base(deep, {}, base_name="b", base_model="llama3-8b", max_rank=None)
    assert got is not None
    assert got.reason == "BaseShapesUnknown"


def test_a_version_of_lora_artifacts_verifies_with_one_digest(tmp_path: Path, pool: FairPool) -> None:
    d = make_adapter(tmp_path / "a")
    spec = ModelVersionSpec.model_validate(
        {
            "model": "support",
            "version": "1.0.0",
            "adapter": {"baseModelVersion": "llama3-8b-1-0-0"},
            "artifacts": adapter_artifacts(d),
        }
    )
    got: Verification = asyncio.run(verify(spec, pool.group("v"), artifact_roots=("/",)))
    assert got.ok, got.failure
    assert set(got.digests) == {"lora"}
    assert got.interface is not None
    assert set(got.interface) == {"lora"}
    assert served_name("support", got.digests["lora"]) == f"support-{got.digests['lora'][:12]}"


def test_lora_files_belong_to_an_adapter_and_an_adapter_to_lora_files(tmp_path: Path) -> None:
    d = make_adapter(tmp_path / "a")
    with pytest.raises(ValueError, match="lora artifacts belong to an adapter"):
        ModelVersionSpec.model_validate({"model": "m", "version": "1.0.0", "artifacts": adapter_artifacts(d)})
    with pytest.raises(ValueError, match="an adapter"):
        ModelVersionSpec.model_validate(
            {
                "model": "m",
                "version": "1.0.0",
                "adapter": {"baseModelVersion": "base"},
                "artifacts": [{"format": "onnx", "uri": "s3://m/model.onnx"}],
            }
        )


def test_another_base_model_is_a_breaking_difference(tmp_path: Path) -> None:
    old = combine(_facts(make_adapter(tmp_path / "a")))
    new = combine(_facts(make_adapter(tmp_path / "b", base_model="llama3-70b", r=8)))
    kinds = {d.kind: d.level for d in diff(old, new)}
    assert kinds == {"AdapterBaseChanged": "breaking", "AdapterModulesChanged": "none"}
