"""Artifacts over the operator's caps are refused naming the cap; within them they are read,
streamed, with the interface their libraries see (tinct.artifacts.limits).

The files at the largest caps (a 64 MiB tokenizer.json, a 64 MiB safetensors header) go
through the real operator in tests/k8s/test_modelversion_hardening.py; their memory is
measured by bench/artifacts.py.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import get_args

import pytest

from tinct.api.v1alpha1.modelversion import ArtifactFormat
from tinct.artifacts import limits
from tinct.artifacts.fair import FairPool
from tinct.artifacts.formats import READERS, FormatError, validate
from tinct_testing.interface_artifacts import (
    big_index,
    big_ptx,
    make_llm_shards,
    make_tokenizer,
    onnx_with_inputs,
    onnx_with_sparse_initializers,
    verify_files,
)

MiB = 1024 * 1024


@pytest.fixture
def pool() -> Iterator[FairPool]:
    p = FairPool(2)
    yield p
    p.shutdown()


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_every_format_of_the_api_has_a_reader() -> None:
    assert set(READERS) == set(get_args(ArtifactFormat))


def _safetensors_header(path: Path, header: bytes, data: int = 0) -> Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * data)
    return path


def _sparse_header(path: Path, length: int) -> Path:
    with path.open("wb") as f:
        f.write(struct.pack("<Q", length) + b"{")
        f.truncate(8 + length)
    return path


def _tokenizer_config(path: Path, **fields: object) -> Path:
    path.write_text(json.dumps(fields))
    return path


def _onnx_wide_inputs(path: Path) -> Path:
    """Seventeen inputs of almost 1 MiB each (their doc strings): over 16 MiB together."""
    import onnx
    from onnx import TensorProto, helper

    inputs = [
        helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [1], doc_string="d" * (MiB - 1024))
        for i in range(17)
    ]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x0"], ["y"])],
        "g",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _ptx_long_line(path: Path) -> Path:
    head = b".version 8.4\n.target sm_80\n.address_size 64\n"
    line = b"// " + b"x" * (limits.PTX_MAX_LINE + 2 * MiB) + b"\n"
    return _write(path, head + line + b".visible .entry k()\n{\n\tret;\n}\n")


def _tensor(shape: list[int]) -> dict[str, object]:
    return {"dtype": "U8", "shape": shape, "data_offsets": [0, 1]}


#: name -> (fmt, file name, make the file, the cap it is over)
OVER: dict[str, tuple[str, str, Callable[[Path], Path], str]] = {
    "safetensors header": (
        "safetensors",
        "m.safetensors",
        lambda p: _sparse_header(p, 97 * 1000 * 1000),
        "SAFETENSORS_MAX_HEADER",
    ),
    "safetensors rank": (
        "safetensors",
        "m.safetensors",
        lambda p: _safetensors_header(p, json.dumps({"w": _tensor([1] * 65)}).encode(), 1),
        "SAFETENSORS_MAX_RANK",
    ),
    "safetensors metadata": (
        "safetensors",
        "m.safetensors",
        lambda p: _safetensors_header(
            p, json.dumps({"__metadata__": {f"k{i}": "v" * 4096 for i in range(300)}}).encode()
        ),
        "SAFETENSORS_MAX_METADATA",
    ),
    "index size": (
        "safetensors",
        "model.safetensors.index.json",
        lambda p: _sparse_header(p, limits.INDEX_MAX_BYTES),
        "INDEX_MAX_BYTES",
    ),
    "json string": (
        "tokenizer",
        "tokenizer_config.json",
        lambda p: _tokenizer_config(p, chat_template="t" * (limits.JSON_MAX_TOKEN + 1)),
        "JSON_MAX_TOKEN",
    ),
    "json nesting": (
        "tokenizer",
        "tokenizer_config.json",
        lambda p: _write(p, b'{"x": ' + b"[" * 65 + b"]" * 65 + b"}"),
        "JSON_MAX_DEPTH",
    ),
    "chat template": (
        "tokenizer",
        "tokenizer_config.json",
        lambda p: _tokenizer_config(
            p, chat_template=[{"name": n, "template": "t" * (3 * MiB)} for n in ("default", "tool_use")]
        ),
        "CHAT_TEMPLATE_MAX_CHARS",
    ),
    "special token": (
        "tokenizer",
        "tokenizer_config.json",
        lambda p: _tokenizer_config(p, bos_token="<" * (limits.SPECIAL_TOKEN_MAX_CHARS + 1)),
        "SPECIAL_TOKEN_MAX_CHARS",
    ),
    "special tokens": (
        "tokenizer",
        "tokenizer_config.json",
        lambda p: _tokenizer_config(
            p, additional_special_tokens=[f"<{i}>" for i in range(limits.TOKENIZER_MAX_SPECIAL + 1)]
        ),
        "TOKENIZER_MAX_SPECIAL",
    ),
    "onnx inputs": (
        "onnx",
        "m.onnx",
        lambda p: onnx_with_inputs(p, limits.ONNX_MAX_ENTRIES),
        "ONNX_MAX_ENTRIES",
    ),
    "onnx interface bytes": ("onnx", "m.onnx", _onnx_wide_inputs, "ONNX_MAX_INTERFACE"),
    "ptx entries": (
        "ptx",
        "k.ptx",
        lambda p: big_ptx(p, limits.PTX_MAX_ENTRIES + 1, 0) and p,
        "PTX_MAX_ENTRIES",
    ),
    "ptx entry names": (
        "ptx",
        "k.ptx",
        lambda p: big_ptx(p, 1000, limits.PTX_MAX_ENTRY_BYTES + 1000 * 1024) and p,
        "PTX_MAX_ENTRY_BYTES",
    ),
    "ptx line": ("ptx", "k.ptx", _ptx_long_line, "PTX_MAX_LINE"),
}


@pytest.mark.parametrize("case", sorted(OVER))
def test_a_file_over_a_cap_is_refused_naming_it(tmp_path: Path, case: str) -> None:
    fmt, name, make, cap = OVER[case]
    path = make(tmp_path / name)
    with pytest.raises(FormatError) as info:
        validate(path.as_uri(), fmt, onnx_parse_limit=0)
    print(f"{case}: {info.value.detail}")
    assert info.value.limit == cap
    assert f"({cap})" in info.value.detail
    assert len(str(info.value)) < 1024


def test_an_oversized_header_or_index_is_refused_before_reading_it(tmp_path: Path) -> None:
    for fmt, name, make, _ in (OVER["safetensors header"], OVER["index size"]):
        path = make(tmp_path / name)
        before = _rchar()
        with pytest.raises(FormatError, match="over the limit of"):
            validate(path.as_uri(), fmt)
        assert _rchar() - before < 256 * 1024


def test_onnx_2_gib_of_initializers_is_read_without_its_weights(tmp_path: Path) -> None:
    path = onnx_with_sparse_initializers(tmp_path / "model.onnx", 2 * 1024 * MiB)
    assert path.stat().st_size > 2 * 1024 * MiB
    before = _rchar()
    facts = validate(path.as_uri(), "onnx")
    read = _rchar() - before
    print(f"bytes read for the interface of a {path.stat().st_size}-byte ONNX model: {read}")
    assert read < 1024 * 1024
    assert facts["inputs"] == {
        "bias": {"dtype": "FLOAT", "shape": [1], "optional": True},
        "x": {"dtype": "FLOAT", "shape": [1], "optional": False},
    }
    assert facts["outputs"] == {"y": {"dtype": "FLOAT", "shape": [1]}}
    assert facts["opsets"] == {"ai.onnx": 17}


def test_vocab_digest_is_that_of_the_vocabulary_tokenizers_reads(tmp_path: Path) -> None:
    """The digest is over the id -> token map the tokenizers library builds from the file."""
    import hashlib

    from tokenizers import Tokenizer, models

    unigram = Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0), ("é", -2.0), ("😀", -3.0)], unk_id=0))
    unigram.add_special_tokens(["<s>", "</s>"])
    unigram.add_tokens(["hello", "a"])  # "a" is in the vocabulary already: same id
    (tmp_path / "u").mkdir()
    unigram.save(str(tmp_path / "u" / "tokenizer.json"))
    bpe = make_tokenizer(tmp_path / "b", vocab_size=80)[0]
    for path in (tmp_path / "u" / "tokenizer.json", bpe):
        library = Tokenizer.from_file(str(path))
        by_id = {i: t for t, i in library.get_vocab(with_added_tokens=True).items()}
        lines = "\n".join(f"{i}\t{t}" for i, t in sorted(by_id.items()))
        facts = validate(path.as_uri(), "tokenizer")
        assert facts["vocab_size"] == library.get_vocab_size(with_added_tokens=True)
        assert facts["vocab_digest"] == hashlib.sha256(lines.encode()).hexdigest()


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (
            b'{"w": '
            + json.dumps(_tensor([1])).encode()
            + b', "w": '
            + json.dumps(_tensor([1])).encode()
            + b"}",
            "listed twice",
        ),
        (b'{"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 18446744073709551616]}}', "past the data"),
        (b'{"w": ' + json.dumps(_tensor([1])).encode() + b"} trailing", "not JSON: parse error: trailing"),
    ],
)
def test_hostile_safetensors_headers_fail_clearly(tmp_path: Path, header: bytes, message: str) -> None:
    path = _safetensors_header(tmp_path / "m.safetensors", header, 1)
    with pytest.raises(FormatError, match=message) as info:
        validate(path.as_uri(), "safetensors")
    assert info.value.limit is None


def test_an_index_naming_10000_missing_shards_fails_with_a_short_message(
    tmp_path: Path, pool: FairPool
) -> None:
    first, _, _ = make_llm_shards(tmp_path)
    index = tmp_path / "model.safetensors.index.json"
    shards = big_index(index, 10_000, 2 * MiB, shards=10_000)
    result = verify_files(pool, "safetensors", [first, index])
    assert result.failure is not None
    print(result.failure.message)
    assert result.failure.reason == "InterfaceInconsistent"
    assert (
        f"10,000 shard(s) that no artifact declares: {shards[0]}, {shards[1]}, {shards[2]}, … and 9,997 more"
        in (result.failure.message)
    )
    assert len(result.failure.message) < 1024
