"""An ONNX model with as many graph entries as its cap allows is read and checked whole (the onnx
checker included)."""

from __future__ import annotations

from pathlib import Path

from tinct.artifacts import limits
from tinct.artifacts.formats import validate
from tinct_testing.interface_artifacts import onnx_with_inputs


def test_onnx_at_the_entry_cap_is_read_and_checked(tmp_path: Path) -> None:
    """One output and one opset import: the inputs fill the rest of ONNX_MAX_ENTRIES."""
    path = onnx_with_inputs(tmp_path / "model.onnx", limits.ONNX_MAX_ENTRIES - 2)
    facts = validate(path.as_uri(), "onnx")  # under the parse limit: the onnx checker runs too
    assert len(facts["inputs"]) == limits.ONNX_MAX_ENTRIES - 2
    assert facts["inputs"]["x99997"] == {"dtype": "FLOAT", "shape": [1], "optional": False}
