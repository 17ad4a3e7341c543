from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tinct.artifacts.formats import FormatError, validate
from tinct_testing.lineage_artifacts import PTX_TEXT, make_onnx, make_safetensors


def _rewrite_header(path: Path, mutate: object) -> Path:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    mutate(header)  # type: ignore[operator]
    new = json.dumps(header).encode()
    out = path.with_name("bad-" + path.name)
    out.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])
    return out


def test_valid_files_pass(tmp_path: Path) -> None:
    validate(make_onnx(tmp_path / "m.onnx").as_uri(), "onnx")
    validate(make_safetensors(tmp_path / "m.safetensors").as_uri(), "safetensors")
    (tmp_path / "k.ptx").write_text(PTX_TEXT)
    validate((tmp_path / "k.ptx").as_uri(), "ptx")


def test_onnx_parse_limit_decides_the_full_parse(tmp_path: Path) -> None:
    """Above the limit only the wire form is walked; at or under it onnx.checker runs too."""
    from onnx import TensorProto, helper

    validate(make_onnx(tmp_path / "m.onnx", dim=1000).as_uri(), "onnx", onnx_parse_limit=0)
    # Sound on the wire (graph, opset), but a node reads an input nothing defines.
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "Missing"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    dangling = tmp_path / "dangling.onnx"
    dangling.write_bytes(model.SerializeToString())
    size = dangling.stat().st_size
    validate(dangling.as_uri(), "onnx", onnx_parse_limit=0)
    validate(dangling.as_uri(), "onnx", onnx_parse_limit=size - 1)
    with pytest.raises(FormatError, match=r"onnx rejects the model: .*'Missing'"):
        validate(dangling.as_uri(), "onnx", onnx_parse_limit=size)


@pytest.mark.parametrize("limit", [0, 1 << 30])
def test_onnx_truncated_fails(tmp_path: Path, limit: int) -> None:
    path = make_onnx(tmp_path / "m.onnx", dim=256)
    bad = tmp_path / "t.onnx"
    bad.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(FormatError, match="onnx"):
        validate(bad.as_uri(), "onnx", onnx_parse_limit=limit)


def test_onnx_without_graph_fails(tmp_path: Path) -> None:
    import onnx

    model = onnx.ModelProto(ir_version=8)
    model.opset_import.add(domain="", version=17)
    bad = tmp_path / "nograph.onnx"
    bad.write_bytes(model.SerializeToString())
    with pytest.raises(FormatError, match="no graph"):
        validate(bad.as_uri(), "onnx", onnx_parse_limit=0)


def test_safetensors_file_is_not_onnx(tmp_path: Path) -> None:
    st = make_safetensors(tmp_path / "m.safetensors")
    with pytest.raises(FormatError):
        validate(st.as_uri(), "onnx")


def test_safetensors_truncated_fails(tmp_path: Path) -> None:
    path = make_safetensors(tmp_path / "m.safetensors")
    bad = tmp_path / "t.safetensors"
    bad.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(FormatError, match="data section"):
        validate(bad.as_uri(), "safetensors")


def test_safetensors_bad_header_length(tmp_path: Path) -> None:
    path = make_safetensors(tmp_path / "m.safetensors")
    raw = path.read_bytes()
    bad = tmp_path / "h.safetensors"
    bad.write_bytes(struct.pack("<Q", len(raw) * 2) + raw[8:])
    with pytest.raises(FormatError, match="past the end"):
        validate(bad.as_uri(), "safetensors")


def test_safetensors_shape_offset_mismatch(tmp_path: Path) -> None:
    path = make_safetensors(tmp_path / "m.safetensors")
    bad = _rewrite_header(path, lambda h: h["embed.weight"].update(shape=[3, 4]))
    with pytest.raises(FormatError, match="needs"):
        validate(bad.as_uri(), "safetensors")


def test_safetensors_unknown_dtype(tmp_path: Path) -> None:
    path = make_safetensors(tmp_path / "m.safetensors")
    bad = _rewrite_header(path, lambda h: h["step"].update(dtype="Q7"))
    with pytest.raises(FormatError, match="dtype"):
        validate(bad.as_uri(), "safetensors")


def test_ptx_missing_directive_and_binary(tmp_path: Path) -> None:
    p = tmp_path / "k.ptx"
    p.write_text(PTX_TEXT.replace(".address_size 64", ""))
    with pytest.raises(FormatError, match="address_size"):
        validate(p.as_uri(), "ptx")
    p.write_bytes(b"\x7fELF\x00\x00" + PTX_TEXT.encode())
    with pytest.raises(FormatError, match="binary"):
        validate(p.as_uri(), "ptx")
