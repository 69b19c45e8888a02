"""The normative protocol vectors (tests/vectors/*.json) against both decoders.

Also checks that the committed vectors equal the generator's output and that
every row of the decoder error table in docs/PROTOCOL.md has a vector.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

from parallelhue.reference.decode import Frame, FrameError, decode_frame, frame_meaning
from parallelhue_vllm import wire

VECTOR_DIR = Path(__file__).resolve().parent / "vectors"
FILES = ["header", "hello", "provenance", "text", "notice"]


def _load(name: str) -> dict[str, list[dict[str, Any]]]:
    return json.loads((VECTOR_DIR / f"{name}.json").read_text(encoding="utf-8"))


VALID = [(name, v) for name in FILES for v in _load(name)["valid"]]
INVALID = [(name, v) for name in FILES for v in _load(name)["invalid"]]


def _ids(cases: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [f"{name}:{vector['name']}" for name, vector in cases]


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("vector_generator", VECTOR_DIR / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_vectors_equal_generated_output() -> None:
    generator = _generator()
    for name, vectors in generator.all_vectors().items():
        committed = (VECTOR_DIR / f"{name}.json").read_text(encoding="utf-8")
        assert committed == generator.render(vectors), f"{name}.json is stale"


@pytest.mark.parametrize(("file", "vector"), VALID, ids=_ids(VALID))
def test_reference_decodes_valid_vector(file: str, vector: dict[str, Any]) -> None:
    frame = decode_frame(bytes.fromhex(vector["hex"]))
    assert frame_meaning(frame) == vector["frame"]


def _reencode(frame: Frame) -> bytes:
    if frame.hello is not None:
        return wire.encode_hello(frame.header, frame.hello)
    return wire.encode_records(frame.kind, frame.header, frame.records)


@pytest.mark.parametrize(("file", "vector"), VALID, ids=_ids(VALID))
def test_valid_vector_reencodes_to_the_same_bytes(file: str, vector: dict[str, Any]) -> None:
    data = bytes.fromhex(vector["hex"])
    assert _reencode(decode_frame(data)) == data


@pytest.mark.parametrize(("file", "vector"), INVALID, ids=_ids(INVALID))
def test_reference_rejects_invalid_vector(file: str, vector: dict[str, Any]) -> None:
    with pytest.raises(FrameError) as caught:
        decode_frame(bytes.fromhex(vector["hex"]))
    assert str(caught.value) == vector["error"]


def _native_decode() -> Any:
    try:
        from parallelhue import _native  # type: ignore[attr-defined]
    except ImportError:
        return None
    return getattr(_native, "decode_frame", None)


needs_native = pytest.mark.skipif(
    _native_decode() is None,
    reason="parallelhue._native.decode_frame is not built (run `make native`)",
)


@needs_native
@pytest.mark.parametrize(("file", "vector"), VALID, ids=_ids(VALID))
def test_native_decodes_valid_vector(file: str, vector: dict[str, Any]) -> None:
    assert _native_decode()(bytes.fromhex(vector["hex"])) == vector["frame"]


@needs_native
@pytest.mark.parametrize(("file", "vector"), INVALID, ids=_ids(INVALID))
def test_native_rejects_invalid_vector(file: str, vector: dict[str, Any]) -> None:
    with pytest.raises(ValueError) as caught:
        _native_decode()(bytes.fromhex(vector["hex"]))
    assert str(caught.value) == vector["error"]


# One pattern per row (or alternative) of the decoder error table in docs/PROTOCOL.md.
ERROR_TABLE = {
    "fewer than 64 bytes": r"truncated frame: \d+ bytes, header needs 64",
    "more than 65536 bytes": r"oversized frame: \d+ bytes, limit 65536",
    "wrong magic": r"bad magic: expected 50485545, got [0-9a-f]{8}",
    "version": r"unsupported protocol version \d+ \(this build speaks 3\)",
    "unknown kind": r"unknown frame kind \d+",
    "flags": r"reserved header flags set: \d+",
    "source id 0": r"source id 0 is reserved",
    "body_len": r"body length mismatch: header says \d+, datagram has \d+",
    "body ends early (hello)": r"truncated hello body at byte \d+",
    "body ends early (provenance)": r"truncated provenance body at byte \d+",
    "body ends early (text)": r"truncated text body at byte \d+",
    "body ends early (notice)": r"truncated notice body at byte \d+",
    "bytes left over (hello)": r"\d+ trailing bytes after hello body",
    "bytes left over (provenance)": r"\d+ trailing bytes after provenance body",
    "bytes left over (text)": r"\d+ trailing bytes after text body",
    "bytes left over (notice)": r"\d+ trailing bytes after notice body",
    "record_count": r"record count \d+ out of range 1\.\.=1024",
    "repeated stream": r"stream \d+ appears twice in one frame",
    "stream 0xFFFF": r"stream 65535 is reserved",
    "n_tokens": r"record for stream \d+: \d+ tokens out of range [01]\.\.=256",
    "offset overflow": r"record for stream \d+: offset \d+ \+ \d+ tokens overflows u32",
    "unknown role": r"record for stream \d+: unknown role \d+ at token \d+",
    "bad role sequence": r"record for stream \d+: invalid role sequence [PATB]+",
    "padded > scheduled": r"record for stream \d+: \d+ padded drafts exceed \d+ scheduled",
    "accepted > scheduled - padded": r"record for stream \d+: \d+ accepted drafts exceed \d+ "
    r"scheduled minus \d+ padded",
    "stop-string flags": r"record for stream \d+: stop-string flags \d+ with finish reason \d+",
    "lead_len without span_back": r"record for stream \d+: lead_len \d+ without span_back "
    r"at token \d+",
    "lead_len > frag_len": r"record for stream \d+: lead_len \d+ exceeds the \d+-byte "
    r"fragment at token \d+",
    "bad flags": r"record for stream \d+: invalid flags \d+",
    "finish/flags mismatch": r"record for stream \d+: finish reason \d+ with finished=[01]",
    "span_back": r"record for stream \d+: span_back \d+ on empty fragment at token \d+",
    "invalid UTF-8 fragment": r"record for stream \d+: invalid UTF-8 in fragment of token \d+",
    "invalid UTF-8 http delta": r"record for stream \d+: invalid UTF-8 in http delta",
    "trimmed_tokens": r"record for stream \d+: trimmed_tokens \d+ without tokens_trimmed flag",
    "hello role": r"hello: unknown role \d+",
    "hello engine": r"hello: unknown engine \d+",
    "hello derivation": r"hello: unknown role derivation \d+",
    "hello async flag": r"hello: invalid async_scheduling \d+",
    "hello verification": r"hello: unknown verification \d+",
    "hello K": r"hello: num_speculative_tokens \d+ exceeds 255 \(a step of K \+ 1 tokens must "
    r"fit one record\)",
    "hello consistency": r"hello: inconsistent speculative fields \(method '.*', K \d+, "
    r"derivation \d+, verification \d+\)",
    "hello derivation vs async": r"hello: role derivation [12] with async_scheduling [01]",
    "hello frontend": r"hello: frontend hello with speculative fields \(method '.*', K \d+, "
    r"derivation \d+, async_scheduling [01], verification \d+\)",
    "hello UTF-8 plugin_version": r"hello: invalid UTF-8 in plugin_version",
    "hello UTF-8 engine_version": r"hello: invalid UTF-8 in engine_version",
    "hello UTF-8 spec_method": r"hello: invalid UTF-8 in spec_method",
    "notice too long": r"notice for stream \d+: message of \d+ bytes exceeds 1024",
    "notice UTF-8": r"notice for stream \d+: invalid UTF-8 message",
}


@pytest.mark.parametrize("row", sorted(ERROR_TABLE))
def test_every_error_table_row_has_a_vector(row: str) -> None:
    pattern = re.compile(ERROR_TABLE[row])
    assert any(pattern.fullmatch(vector["error"]) for _, vector in INVALID), row


def test_every_invalid_vector_matches_a_table_row() -> None:
    patterns = [re.compile(p) for p in ERROR_TABLE.values()]
    unmatched = [
        vector["error"]
        for _, vector in INVALID
        if not any(p.fullmatch(vector["error"]) for p in patterns)
    ]
    assert unmatched == []


# ------------------------------------------------ older senders (0.1, 0.2)


def _old_message(version: int) -> str:
    return f"rejected frame: unsupported protocol version {version} (this build speaks 3)"


def _old_frames(version: int) -> list[bytes]:
    """A parallelhue-vllm 0.{version} scheduler's hello and first provenance frame."""
    generator = _generator()
    hello = generator.raw_frame(
        wire.KIND_HELLO, generator.hello_body(verification=0), seq=0, version=version
    )
    record = generator.records_body(generator.prov_record(ids=[7], roles=[0], scheduled=0))
    return [hello, generator.raw_frame(wire.KIND_PROVENANCE, record, seq=1, version=version)]


def _reconciler_classes() -> list[Any]:
    from parallelhue.reference import Reconciler

    classes = [Reconciler]
    try:
        from parallelhue import _native  # type: ignore[attr-defined]
    except ImportError:
        return classes
    return [*classes, _native.Reconciler]


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("cls", _reconciler_classes(), ids=lambda c: c.__module__)
def test_an_old_sender_gets_one_exact_error_per_frame(cls: Any, version: int) -> None:
    generator = _generator()
    rec = cls(generator.RUN_ID.hex(), 1)
    rec.push_frames(_old_frames(version))
    assert rec.drain() == [("run", _old_message(version))] * 2
    assert rec.counters()["rejected_frames"] == 2
    rec.finalize()
    assert rec.verdict(0) == ("failed", "missing telemetry: no frames received for this run")


@pytest.mark.parametrize("version", [1, 2])
def test_the_client_names_the_plugin_version_to_install_once(version: int) -> None:
    from parallelhue.ingest.driver import RunDriver
    from parallelhue.ingest.feed import Feed
    from parallelhue.model.backend import detect_backend
    from parallelhue.model.state import RunModel, StreamState
    from parallelhue.reference import Reconciler

    generator = _generator()
    model = RunModel([StreamState(0, "exact")], "exact", detect_backend("auto", [], None), True)
    driver = RunDriver(model, Feed(model, timeout=1.0), Reconciler(generator.RUN_ID.hex(), 1))
    driver.frames(_old_frames(version))
    driver.apply_events()
    assert model.run_messages == [
        f"{_old_message(version)}: the server's parallelhue-vllm plugin is too old; "
        "run pip install 'parallelhue-vllm>=0.3' in the server's vLLM environment"
    ]
