"""Artifact benchmark: the memory (and time) one artifact at the operator's caps costs to read.

Prints one line per case as it is measured, then the whole result as JSON on the last line.
Every file is generated in a temporary directory (ONNX weights as holes in a sparse file)
that is removed at the end.

    python bench/artifacts.py [--only CASE ...]

Each case runs ``tinct.artifacts.formats.validate`` in a child process that has imported
everything first, resets its peak RSS (``/proc/self/clear_refs`` 5), reads the file, and
reports the peak (VmHWM) minus the resident size it started from: ``<case>_rss_growth_mb``,
and ``<case>_s`` for the time. Cases at a cap must be read (the child fails otherwise);
cases over a cap must fail with LimitExceeded, and are measured up to that point.

- tokenizer_at_caps: a BPE tokenizer.json of TOKENIZER_MAX_VOCAB entries filling
  TOKENIZER_MAX_BYTES.
- tokenizer_long_tokens: a tokenizer.json of 15 tokens of JSON_MAX_TOKEN bytes each, mostly
  ASCII with one character outside the BMP (the widest Python string per byte).
- chat_template_at_cap: a tokenizer_config.json whose chat template has
  CHAT_TEMPLATE_MAX_CHARS characters, one outside the BMP.
- safetensors_at_caps: a header of SAFETENSORS_MAX_HEADER bytes listing
  SAFETENSORS_MAX_TENSORS tensors.
- version_safetensors_at_caps: a whole version of that one file as the operator handles it:
  verified (read, combined into the interface, hashed), its lineage rows and its status
  built (not counted in artifact_rss_growth_mb: it is what a version costs, not a read).
- safetensors_97mb_header: a header of 97 MB listing 1.4 M tensors (refused before it is read).
- safetensors_over_tensor_cap: a header of SAFETENSORS_MAX_HEADER bytes listing 900,000
  tensors (refused once it has listed SAFETENSORS_MAX_TENSORS).
- index_at_caps: an index of INDEX_MAX_ENTRIES entries filling INDEX_MAX_BYTES.
- onnx_inputs_at_caps: a graph of ONNX_MAX_ENTRIES - 2 inputs (with one output and one opset
  import: the entry cap), small enough to be parsed by the onnx checker too.
- onnx_1m_inputs: a graph of 1,000,000 inputs (refused at the cap).
- onnx_2gb_initializers: a graph whose two initializers hold 2 GiB (sparse).
- onnx_full_parse_at_limit: a model of just under DEFAULT_ONNX_PARSE_LIMIT bytes that the
  onnx package parses and checks in full (one large initializer).
- ptx_at_caps: PTX_MAX_ENTRIES kernels whose names fill PTX_MAX_ENTRY_BYTES.

artifact_rss_growth_mb is the largest of them: the bound the chart's operator memory limit
is sized with (docs/operations/limits.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tinct.artifacts import limits
from tinct.artifacts.onnx_wire import DEFAULT_ONNX_PARSE_LIMIT
from tinct_testing.interface_artifacts import (
    big_index,
    big_ptx,
    big_safetensors_header,
    big_tokenizer,
    onnx_with_inputs,
    onnx_with_sparse_initializers,
)
from tinct_testing.lineage_artifacts import make_onnx

MIB = 1024 * 1024

#: The child: import everything, reset the peak, read, report growth of the peak and time.
_CHILD = """
import json, sys, time
from pathlib import Path
import ijson, numpy, onnx, onnx.checker
from tinct.artifacts.formats import FormatError, validate

def kb(field):
    line = next(l for l in Path('/proc/self/status').read_text().splitlines() if l.startswith(field))
    return int(line.split()[1])

def version(uri, fmt):
    # What the operator does with a version of this one artifact, up to its status.
    import asyncio
    from datetime import UTC, datetime
    from tinct.api.v1alpha1.modelversion import ModelVersion
    from tinct.artifacts.fair import FairPool
    from tinct.artifacts.verify import verify
    from tinct.lineage.records import model_version_rows
    from tinct.operator.modelversion import build_status

    mv = ModelVersion.model_validate({
        "metadata": {"name": "m", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {"model": "m", "version": "1.0.0", "artifacts": [{"format": fmt, "uri": uri}]},
    })
    pool = FairPool(1)
    result = asyncio.run(verify(mv.spec, pool.group("m"), artifact_roots=("/",)))
    pool.shutdown()
    if result.failure is not None:
        raise SystemExit(result.failure.message)
    model_version_rows(mv, "registered", result, operator_version="bench")
    build_status(mv, result, "/t", 1, datetime.now(UTC))

uri, fmt, expect = sys.argv[1], sys.argv[2], sys.argv[3]
Path('/proc/self/clear_refs').write_text('5')
base = kb('VmRSS:')
t = time.perf_counter()
try:
    if expect == 'version':
        version(uri, fmt)
    else:
        validate(uri, fmt)
    outcome = expect if expect == 'version' else 'read'
except FormatError as exc:
    outcome = 'limit' if exc.limit else 'invalid'
    print(exc, file=sys.stderr)
seconds = time.perf_counter() - t
print(json.dumps({'mb': (kb('VmHWM:') - base) / 1024, 's': seconds, 'outcome': outcome}))
sys.exit(0 if outcome == expect else 1)
"""


def _say(name: str, value: Any) -> None:
    print(f"{name}: {value}", file=sys.stderr, flush=True)


def _write_long_tokens(path: Path) -> None:
    token = "a" * (limits.JSON_MAX_TOKEN - 64) + "\U0001f600"
    vocab = ",".join(f'"{i}{token}":{i}' for i in range(15))
    path.write_text('{"model":{"type":"BPE","vocab":{' + vocab + '},"merges":[]}}', encoding="utf-8")


def _write_chat_template(path: Path) -> None:
    template = "x" * (limits.CHAT_TEMPLATE_MAX_CHARS - 64) + "\U0001f600"
    path.write_text(json.dumps({"bos_token": "<s>", "chat_template": template}, ensure_ascii=False))


def _cases(tmp: Path) -> dict[str, tuple[Callable[[], Path], str, str]]:
    """case -> (make the file, format, the outcome expected: read, limit, or version: the
    whole version of that file)."""
    tok_entries = limits.TOKENIZER_MAX_VOCAB - 2
    tok_bytes = limits.TOKENIZER_MAX_BYTES - 64 * 1024
    header = limits.SAFETENSORS_MAX_HEADER - 64 * 1024

    def at(name: str, make: Callable[[Path], object]) -> Callable[[], Path]:
        def run() -> Path:
            path = tmp / name
            make(path)
            return path

        return run

    return {
        "tokenizer_at_caps": (
            at("tokenizer.json", lambda p: big_tokenizer(p, tok_entries, tok_bytes)),
            "tokenizer",
            "read",
        ),
        "tokenizer_long_tokens": (at("long/tokenizer.json", _write_long_tokens), "tokenizer", "read"),
        "chat_template_at_cap": (at("tokenizer_config.json", _write_chat_template), "tokenizer", "read"),
        "safetensors_at_caps": (
            at(
                "cap.safetensors", lambda p: big_safetensors_header(p, limits.SAFETENSORS_MAX_TENSORS, header)
            ),
            "safetensors",
            "read",
        ),
        "version_safetensors_at_caps": (
            at(
                "version.safetensors",
                lambda p: big_safetensors_header(p, limits.SAFETENSORS_MAX_TENSORS, header),
            ),
            "safetensors",
            "version",
        ),
        "safetensors_97mb_header": (
            at("huge.safetensors", lambda p: big_safetensors_header(p, 1_400_000, 97 * MIB)),
            "safetensors",
            "limit",
        ),
        "safetensors_over_tensor_cap": (
            at("many.safetensors", lambda p: big_safetensors_header(p, 900_000, header)),
            "safetensors",
            "limit",
        ),
        "index_at_caps": (
            at(
                "model.safetensors.index.json",
                lambda p: big_index(p, limits.INDEX_MAX_ENTRIES, limits.INDEX_MAX_BYTES - 64 * 1024, 64),
            ),
            "safetensors",
            "read",
        ),
        "onnx_inputs_at_caps": (
            at("inputs.onnx", lambda p: onnx_with_inputs(p, limits.ONNX_MAX_ENTRIES - 2)),
            "onnx",
            "read",
        ),
        "onnx_1m_inputs": (at("million.onnx", lambda p: onnx_with_inputs(p, 1_000_000)), "onnx", "limit"),
        "onnx_2gb_initializers": (
            at("weights.onnx", lambda p: onnx_with_sparse_initializers(p, 2 * 1024 * MIB)),
            "onnx",
            "read",
        ),
        "onnx_full_parse_at_limit": (
            at("full.onnx", lambda p: make_onnx(p, dim=(DEFAULT_ONNX_PARSE_LIMIT - 4096) // 4)),
            "onnx",
            "read",
        ),
        "ptx_at_caps": (
            at(
                "kernels.ptx", lambda p: big_ptx(p, limits.PTX_MAX_ENTRIES, limits.PTX_MAX_ENTRY_BYTES - 4096)
            ),
            "ptx",
            "read",
        ),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", help="run only these cases")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tinct-bench-artifacts-"))
    result: dict[str, Any] = {}
    try:
        (tmp / "long").mkdir()
        for case, (make, fmt, expect) in _cases(tmp).items():
            if args.only and case not in args.only:
                continue
            path = make()
            proc = subprocess.run(
                [sys.executable, "-c", _CHILD, path.as_uri(), fmt, expect], capture_output=True, text=True
            )
            if proc.returncode != 0:
                raise SystemExit(
                    f"{case}: expected {expect}, got {proc.stdout.strip()} {proc.stderr.strip()}"
                )
            got = json.loads(proc.stdout)
            result[f"{case}_rss_growth_mb"] = round(got["mb"], 1)
            result[f"{case}_s"] = round(got["s"], 2)
            _say(case, f"{got['mb']:.1f} MB, {got['s']:.2f} s ({path.stat().st_size / MIB:.1f} MiB file)")
            path.unlink()
        growth = [
            v for k, v in result.items() if k.endswith("_rss_growth_mb") and not k.startswith("version_")
        ]
        result["artifact_rss_growth_mb"] = max(growth) if growth else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
