"""Interface facts derived from real artifacts, bounded reads, and hostile files refused."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from tinct.artifacts.fair import FairPool
from tinct.artifacts.formats import FormatError, validate
from tinct.artifacts.interface import InterfaceError, combine, digest, summary
from tinct_testing.interface_artifacts import (
    make_llm_onnx,
    make_llm_shards,
    make_tokenizer,
    ptx_text,
    verify_files,
)


@pytest.fixture
def pool() -> Iterator[FairPool]:
    p = FairPool(2)
    yield p
    p.shutdown()


def test_onnx_inputs_outputs_opsets_and_metadata(tmp_path: Path) -> None:
    path = make_llm_onnx(tmp_path / "model.onnx", vocab=32, metadata={"producer": "export.py"})
    facts = validate(path.as_uri(), "onnx")
    assert facts == {
        "inputs": {
            "attention_mask": {"dtype": "INT64", "shape": ["batch", "seq"], "optional": False},
            "input_ids": {"dtype": "INT64", "shape": ["batch", "seq"], "optional": False},
        },
        "outputs": {"logits": {"dtype": "FLOAT", "shape": ["batch", "seq", 32]}},
        "opsets": {"ai.onnx": 17},
        "metadata": {"producer": "export.py"},
    }
    # Above the full-parse limit the same facts come from the wire walk alone.
    assert validate(path.as_uri(), "onnx", onnx_parse_limit=0) == facts


def test_onnx_input_with_an_initializer_is_optional(tmp_path: Path) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "bias"], ["Y"])],
        "g",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 4]),
            helper.make_tensor_value_info("bias", TensorProto.FLOAT, [4]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 4])],
        initializer=[numpy_helper.from_array(np.zeros(4, dtype=np.float32), name="bias")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 7
    onnx.save(model, str(tmp_path / "m.onnx"))
    facts = validate((tmp_path / "m.onnx").as_uri(), "onnx", onnx_parse_limit=0)
    assert facts["inputs"]["bias"]["optional"] is True
    assert facts["inputs"]["X"] == {"dtype": "FLOAT", "shape": [None, 4], "optional": False}
    assert facts["opsets"] == {"ai.onnx": 13, "com.microsoft": 1}


def test_onnx_oversized_input_entry_is_refused(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    big = helper.make_tensor_value_info("X", TensorProto.FLOAT, [4], doc_string="x" * (2 * 1024 * 1024))
    graph = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Y"])],
        "g",
        [big],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "m.onnx"))
    with pytest.raises(
        FormatError,
        match=r"graph input or output of 2,097,.* bytes: over the limit of 1 MiB \(ONNX_MAX_ENTRY\)",
    ):
        validate((tmp_path / "m.onnx").as_uri(), "onnx", onnx_parse_limit=0)


def test_safetensors_shards_and_index_give_the_architecture(tmp_path: Path) -> None:
    files = make_llm_shards(tmp_path, vocab=32, hidden=8, layers=3)
    facts = [("safetensors", p.as_uri(), validate(p.as_uri(), "safetensors")) for p in files]
    assert facts[2][2]["index"]["lm_head.weight"] == "model-00002-of-00002.safetensors"
    st = combine(facts)["safetensors"]
    assert (st["vocab_size"], st["hidden_size"], st["layers"], st["indexed"]) == (32, 8, 3, True)
    assert st["tensors"]["model.embed_tokens.weight"] == "F16[32,8]"
    assert st["tensors"]["model.layers.2.input_layernorm.weight"] == "F16[8]"
    assert len(st["tensors"]) == 8


def test_safetensors_index_naming_an_undeclared_shard_fails(tmp_path: Path) -> None:
    first, _, index = make_llm_shards(tmp_path)
    facts = [("safetensors", p.as_uri(), validate(p.as_uri(), "safetensors")) for p in (first, index)]
    with pytest.raises(
        InterfaceError,
        match=r"names 1 shard\(s\) that no artifact declares: model-00002-of-00002.safetensors",
    ):
        combine(facts)


def test_verify_fails_a_version_whose_index_disagrees_with_its_shards(tmp_path: Path, pool: FairPool) -> None:
    first, _, index = make_llm_shards(tmp_path)
    result = verify_files(pool, "safetensors", [first, index])
    assert result.failure is not None
    assert (result.failure.condition, result.failure.reason) == ("Verified", "InterfaceInconsistent")
    assert "re-export the safetensors artifacts together" in result.failure.message


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_headers_of_a_40_gib_sparse_shard_are_read_without_its_data(tmp_path: Path) -> None:
    """The header describes 40 GiB of tensors; the file is sparse, and validating it and
    deriving its interface reads a few kilobytes (rchar of /proc/self/io)."""
    from safetensors import safe_open

    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    tensors = [("model.embed_tokens.weight", [128256, 4096])]
    tensors += [
        (f"model.layers.{i}.mlp.{proj}.weight", [14336, 4096])
        for i in range(90)
        for proj in ("up_proj", "gate_proj", "down_proj", "extra_proj")
    ]
    for name, shape in tensors:
        nbytes = shape[0] * shape[1] * 2
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    assert offset >= 40 * 1024**3
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the header is padded to 8 bytes, as the library pads it
    path = tmp_path / "model-00001-of-00001.safetensors"
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)
    assert path.stat().st_size > 40 * 1024**3
    assert path.stat().st_blocks * 512 < 1024 * 1024  # sparse: no data blocks on disk
    # The safetensors library itself reads the file as what it claims to be.
    with safe_open(str(path), framework="numpy") as st:
        assert st.get_slice("model.layers.89.mlp.down_proj.weight").get_shape() == [14336, 4096]

    before = _rchar()
    facts = validate(path.as_uri(), "safetensors")
    read = _rchar() - before
    print(f"bytes read for the headers of a {path.stat().st_size}-byte shard: {read}")
    assert read < 256 * 1024, read
    interface = combine([("safetensors", path.as_uri(), facts)])["safetensors"]
    assert (interface["vocab_size"], interface["hidden_size"], interface["layers"]) == (128256, 4096, 90)


def test_ptx_directives_and_every_entry(tmp_path: Path) -> None:
    # Enough kernels that the file spans several 1 MiB scan chunks; the last one is at the end.
    names = [f"kernel_{i:05d}" for i in range(4000)]
    text = ptx_text(names, target="sm_90a", version="8.4")
    path = tmp_path / "kernels.ptx"
    path.write_text(text)
    assert path.stat().st_size > 2 * 1024 * 1024
    facts = validate(path.as_uri(), "ptx")
    assert facts["version"] == "8.4"
    assert facts["target"] == "sm_90a"
    assert facts["address_size"] == 64
    assert facts["entries"] == names


def test_ptx_comments_do_not_declare_entries(tmp_path: Path) -> None:
    text = ptx_text(["real"]) + "\n// .visible .entry ghost(\n"
    (tmp_path / "k.ptx").write_text(text)
    assert validate((tmp_path / "k.ptx").as_uri(), "ptx")["entries"] == ["real"]


def test_ptx_with_binary_content_past_the_head_fails(tmp_path: Path) -> None:
    path = tmp_path / "k.ptx"
    path.write_bytes(ptx_text(["a"] * 1).encode() + b"\n" * 200_000 + b"\x00\x01")
    with pytest.raises(FormatError, match="NUL bytes"):
        validate(path.as_uri(), "ptx")


def test_tokenizer_files_written_by_tokenizers(tmp_path: Path) -> None:
    tok, cfg = make_tokenizer(tmp_path, vocab_size=60)
    tj = validate(tok.as_uri(), "tokenizer")
    from tokenizers import Tokenizer

    expected_size = Tokenizer.from_file(str(tok)).get_vocab_size(with_added_tokens=True)
    assert tj["file"] == "tokenizer.json"
    assert tj["vocab_size"] == expected_size
    assert tj["special_tokens"] == {"</s>": "2", "<s>": "1", "<unk>": "0"}
    tc = validate(cfg.as_uri(), "tokenizer")
    assert tc["special_tokens"] == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    assert tc["chat_template_digest"] is not None
    merged = combine([("tokenizer", tok.as_uri(), tj), ("tokenizer", cfg.as_uri(), tc)])["tokenizer"]
    assert merged["vocab_digest"] == tj["vocab_digest"]
    assert merged["chat_template_digest"] == tc["chat_template_digest"]
    # Another training corpus: another vocabulary, another digest.
    other = validate(make_tokenizer(tmp_path / "b", words=("lorem ipsum dolor",))[0].as_uri(), "tokenizer")
    assert other["vocab_digest"] != tj["vocab_digest"]


def test_unigram_vocabulary_is_a_list(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0), ("b", -2.0)], unk_id=0))
    tok.save(str(tmp_path / "tokenizer.json"))
    facts = validate((tmp_path / "tokenizer.json").as_uri(), "tokenizer")
    assert (facts["model"], facts["vocab_size"]) == ("Unigram", 3)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (b"\xff\xfe not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"model": {"type": "BPE", "vocab": {"a": -1}}}', "ids must be non-negative"),
        (b'{"model": {"type": "BPE", "vocab": {"a": 18446744073709551616}}}', "ids must be non-negative"),
        (b'{"model": {"type": "BPE", "vocab": {"a": 1e999}}}', "ids must be non-negative"),
        (b'{"version": "1.0"}', 'tokenizer.json has no "model" object'),
    ],
)
def test_hostile_tokenizer_files_fail_clearly(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_bytes(content)
    with pytest.raises(FormatError, match=message):
        validate(path.as_uri(), "tokenizer")


def test_oversized_tokenizer_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    with path.open("wb") as f:
        f.truncate(65 * 1024 * 1024)
    before = _rchar()
    with pytest.raises(FormatError, match=r"over the limit of 64 MiB \(TOKENIZER_MAX_BYTES\)"):
        validate(path.as_uri(), "tokenizer")
    assert _rchar() - before < 64 * 1024


def test_safetensors_header_nested_too_deeply_fails(tmp_path: Path) -> None:
    raw = b"{" + b'"a":' * 1 + b"[" * 200_000 + b"]" * 200_000 + b"}"
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(FormatError, match="nested too deeply"):
        validate(path.as_uri(), "safetensors")


def test_digest_ignores_uris_and_summary_is_short(tmp_path: Path) -> None:
    a = make_llm_onnx(tmp_path / "model.onnx")
    (tmp_path / "b").mkdir()
    b = make_llm_onnx(tmp_path / "b" / "model.onnx")
    ia = combine([("onnx", a.as_uri(), validate(a.as_uri(), "onnx"))])
    ib = combine([("onnx", b.as_uri(), validate(b.as_uri(), "onnx"))])
    assert digest(ia) == digest(ib)
    assert summary(ia) == "onnx model.onnx: inputs attention_mask,input_ids; outputs logits; opset ai.onnx 17"
