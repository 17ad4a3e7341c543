from __future__ import annotations

import pytest

from tinct.api.v1alpha1.modelversion import Quantization
from tinct.artifacts.compat import check


@pytest.mark.parametrize(
    ("quant", "runtime", "reason"),
    [
        (
            {"method": "awq", "bits": 4, "symmetric": False, "group_size": 128},
            "tensorrt-llm",
            "AsymmetricAWQUnsupported",
        ),
        ({"method": "gptq", "bits": 4}, "vllm", "GroupSizeRequired"),
        ({"method": "fp8", "bits": 8}, "onnxruntime", "MethodUnsupportedByRuntime"),
        ({"method": "fp8", "bits": 4}, "vllm", "BitsMismatch"),
    ],
)
def test_violations(quant: dict[str, object], runtime: str, reason: str) -> None:
    reasons = [v.reason for v in check(Quantization.model_validate(quant), runtime)]
    assert reason in reasons


@pytest.mark.parametrize(
    ("quant", "runtime"),
    [
        ({"method": "awq", "bits": 4, "symmetric": True, "group_size": 128}, "tensorrt-llm"),
        ({"method": "awq", "bits": 4, "symmetric": False, "group_size": 128}, "vllm"),
        ({"method": "fp8", "bits": 8}, "tensorrt-llm"),
        (None, "llama-cpp"),
        ({"method": "int8", "bits": 8}, None),
    ],
)
def test_compatible(quant: dict[str, object] | None, runtime: str | None) -> None:
    q = Quantization.model_validate(quant) if quant else None
    assert check(q, runtime) == []
