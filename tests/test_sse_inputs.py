"""SSE chunk JSON -> the reconciler's SSE inputs, in every reading path.

The Rust extraction (`rust/core/src/sse/`: `parser.rs` + `inputs.rs`, seen through
`parallelhue._native.sse_inputs`) and the Python reference
(`parallelhue.reference.sse`) must accept and refuse the same chunks with the
same messages and give the same inputs; a chunk they refuse (token ids that
are not u32 integers, a lone surrogate, any shape error) ends that stream
with that reason in every reader, and the other streams go on.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import workloads
from client_fakes import FakeServer, _chunk, _sse
from parallelhue import cli
from parallelhue.reference.sse import ChunkInputs, SseError

sse_inputs = workloads.native_test_kit("sse_inputs")
needs_native = pytest.mark.skipif(sse_inputs is None, reason="needs the test kit: make native")

PROPERTY = workloads.property_settings()
JSON_ERROR = "invalid JSON in SSE data: "


def reference(payloads: list[str]) -> list[Any]:
    """Per payload: (inputs, finish_reason so far) or ("error", message)."""
    extraction = ChunkInputs()
    out: list[Any] = []
    for payload in payloads:
        try:
            out.append((extraction.extract_payload(payload), extraction.finish_reason))
        except SseError as error:
            out.append(("error", str(error)))
    return out


def native(payloads: list[str]) -> list[Any]:
    """The same through the Rust reader's event-stream parser and extraction."""
    assert sse_inputs is not None
    raw = [payload.encode("utf-8", "surrogatepass") for payload in payloads]
    out: list[Any] = []
    for event in sse_inputs(raw):
        if event[0] == "error":
            out.append(("error", event[1]))
        else:
            out.append(([tuple(item) for item in event[0]], event[1]))
    return out


def same(reference_out: list[Any], native_out: list[Any]) -> bool:
    """Equal, except that two JSON syntax errors need only agree that they are one
    (serde_json and Python's json word them differently)."""
    if len(reference_out) != len(native_out):
        return False
    for ref, nat in zip(reference_out, native_out, strict=True):
        json_errors = [
            r[0] == "error" and r[1].startswith(JSON_ERROR) for r in (ref, nat) if len(r) == 2
        ]
        if any(json_errors):
            if not (ref[0] == nat[0] == "error" and all(json_errors) and len(json_errors) == 2):
                return False
        elif ref != nat:
            return False
    return True


def _chat(content: Any = "x", ids: Any = (1,), **choice: Any) -> str:
    base: dict[str, Any] = {"index": 0, "delta": {"content": content}, "token_ids": list(ids)}
    base.update(choice)
    return json.dumps({"id": "chatcmpl-a", "choices": [base]})


# Each: the payloads of one stream, and what both extractions must give.
SHAPE = "invalid SSE chunk: "
U32 = "must be an integer in 0..=4294967295"
CASES: list[tuple[str, list[str], list[Any]]] = [
    (
        "token id not an integer",
        [_chat(ids=["x"])],
        [("error", f"{SHAPE}choices[0].token_ids[0] {U32}")],
    ),
    ("token id null", [_chat(ids=[1, None])], [("error", f"{SHAPE}choices[0].token_ids[1] {U32}")]),
    ("token id 1.5", [_chat(ids=[1.5])], [("error", f"{SHAPE}choices[0].token_ids[0] {U32}")]),
    ("token id 1.0", [_chat(ids=[1.0])], [("error", f"{SHAPE}choices[0].token_ids[0] {U32}")]),
    ("token id true", [_chat(ids=[True])], [("error", f"{SHAPE}choices[0].token_ids[0] {U32}")]),
    ("token id 2**32", [_chat(ids=[2**32])], [("error", f"{SHAPE}choices[0].token_ids[0] {U32}")]),
    (
        "token id beyond u64",
        [_chat(ids=[2**70])],
        [("error", f"{SHAPE}choices[0].token_ids[0] {U32}")],
    ),
    ("token id -1", [_chat(ids=[-1])], [("error", f"{SHAPE}choices[0].token_ids[0] {U32}")]),
    (
        "token id -0 (a double for serde_json)",
        ['{"choices":[{"index":0,"token_ids":[-0]}]}'],
        [("error", f"{SHAPE}choices[0].token_ids[0] {U32}")],
    ),
    (
        "token_ids not an array",
        [_chat(ids=(), token_ids="1")],
        [("error", f"{SHAPE}choices[0].token_ids must be an array of integers or null")],
    ),
    (
        "delta token_ids when the choice has none",
        ['{"id":"a","choices":[{"index":0,"delta":{"content":"h","token_ids":[4]}}]}'],
        [([("sse_id", "a"), ("sse", "h", [4])], None)],
    ),
    (
        "the choice's null token_ids win over the delta's",
        ['{"id":"a","choices":[{"index":0,"token_ids":null,"delta":{"token_ids":[4]}}]}'],
        [([("sse_id", "a")], None)],
    ),
    ("lone surrogate in content", ['{"choices":[{"index":0,"text":"\\ud800"}]}'], ["json"]),
    ("lone trailing surrogate", ['{"choices":[],"id":"\\udc00x"}'], ["json"]),
    (
        "a surrogate pair is one character",
        ['{"id":"a","choices":[{"index":0,"text":"\\ud83d\\ude00"}]}'],
        [([("sse_id", "a"), ("sse", "\U0001f600", [])], None)],
    ),
    ("NaN", ['{"choices":[],"x":NaN}'], ["json"]),
    ("Infinity", ['{"choices":[],"x":-Infinity}'], ["json"]),
    ("1e400", ['{"choices":[],"x":1e400}'], ["json"]),
    ("a 400-digit integer", ['{"choices":[],"x":1' + "0" * 400 + "}"], ["json"]),
    (
        "a 300-digit integer is a double",
        ['{"id":"a","choices":[],"x":1' + "0" * 300 + "}"],
        [([("sse_id", "a")], None)],
    ),
    (
        "127 levels of nesting",
        ['{"id":"a","choices":[],"x":' + "[" * 126 + "]" * 126 + "}"],
        [([("sse_id", "a")], None)],
    ),
    ("128 levels of nesting", ['{"choices":[],"x":' + "[" * 127 + "]" * 127 + "}"], ["json"]),
    (
        "duplicate keys: the last one wins",
        ['{"id":"a","choices":[{"index":0,"text":"p","text":"q"}],"id":"b"}'],
        [([("sse_id", "b"), ("sse", "q", [])], None)],
    ),
    (
        "nested nulls are absent fields",
        [
            '{"id":null,"choices":[{"index":0,"delta":null,"text":null,"finish_reason":null}],'
            '"usage":null,"metrics":{"speculative_decoding":null}}'
        ],
        [([("sse_id", "")], None)],
    ),
    ("missing choices", ['{"id":"a"}'], [("error", f"{SHAPE}choices must be present")]),
    (
        "missing index",
        ['{"choices":[{"text":"x"}]}'],
        [("error", f"{SHAPE}choices[0].index must be present")],
    ),
    (
        "index -1",
        ['{"choices":[{"index":-1}]}'],
        [("error", f"{SHAPE}choices[0].index must be an integer in 0..=4294967295")],
    ),
    ("not an object", ["[1]"], [("error", f"{SHAPE}the data must be a JSON object")]),
    (
        "content not a string",
        [_chat(content=5)],
        [("error", f"{SHAPE}choices[0].delta.content must be a string or null")],
    ),
    (
        "finish_reason not a string",
        [_chat(finish_reason=1)],
        [("error", f"{SHAPE}choices[0].finish_reason must be a string or null")],
    ),
    (
        "usage count negative",
        ['{"choices":[],"usage":{"completion_tokens":-2}}'],
        [("error", f"{SHAPE}usage.completion_tokens must be a non-negative integer")],
    ),
    (
        "per-step counts not integers",
        ['{"choices":[],"metrics":{"speculative_decoding":{"per_step_accepted":[1,"2"]}}}'],
        [("error", f"{SHAPE}metrics.speculative_decoding.per_step_accepted[1] {U32}")],
    ),
    (
        "metrics not an object",
        ['{"choices":[],"metrics":3}'],
        [("error", f"{SHAPE}metrics must be an object or null")],
    ),
    (
        "llama-server's timings follow their chunk's delta (other timing fields skipped)",
        [
            '{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}],'
            '"timings":{"prompt_ms":1.5,"predicted_n":3,"draft_n":4,"draft_n_accepted":2}}',
            '{"id":"c","choices":[],"timings":{"predicted_n":4}}',
            '{"id":"c","choices":[],"timings":{"predicted_ms":2.5}}',
            '{"id":"c","choices":[],"timings":null}',
        ],
        [
            ([("sse_id", "c"), ("sse", "x", []), ("sse_counts", "timings", 3, 4, 2)], None),
            ([("sse_counts", "timings", 4, None, None)], None),
            ([], None),
            ([], None),
        ],
    ),
    (
        "vLLM's summary counts follow the usage input",
        [
            '{"id":"c","choices":[],"usage":{"completion_tokens":4},"metrics":{'
            '"speculative_decoding":{"num_spec_steps":1,"num_draft_tokens":3,'
            '"num_accepted_draft_tokens":2,"per_step_accepted":[2],"per_step_drafted":[3],'
            '"acceptance_histogram":[0,0,1,0]}}}'
        ],
        [
            (
                [
                    ("sse_id", "c"),
                    ("sse_usage", 4, [2], [3]),
                    ("sse_counts", "spec", 1, 3, 2),
                ],
                None,
            )
        ],
    ),
    (
        "timings not an object",
        ['{"choices":[],"timings":[1]}'],
        [("error", f"{SHAPE}timings must be an object or null")],
    ),
    (
        "a timings counter not an integer",
        ['{"choices":[],"timings":{"draft_n":1.5}}'],
        [("error", f"{SHAPE}timings.draft_n must be a non-negative integer")],
    ),
    (
        "a summary count negative",
        ['{"choices":[],"metrics":{"speculative_decoding":{"num_draft_tokens":-1}}}'],
        [
            (
                "error",
                f"{SHAPE}metrics.speculative_decoding.num_draft_tokens must be a non-negative "
                "integer",
            )
        ],
    ),
    (
        "server error object",
        ['{"error":{"message":"boom","code":500}}'],
        [("error", "server error in SSE stream: boom")],
    ),
    (
        "error without a message",
        ['{"object":"error","code":7}'],
        [("error", 'server error in SSE stream: {"code":7,"object":"error"}')],
    ),
    (
        "a second choice and another index are reported once, never mixed in",
        [
            '{"id":"a","choices":[{"index":0,"text":"x"},{"index":0,"text":"y"}]}',
            '{"id":"a","choices":[{"index":3,"text":"z","finish_reason":"length"}]}',
        ],
        [([("sse_id", "a"), ("sse_choice", 0), ("sse", "x", [])], None), ([], None)],
    ),
    (
        "choice 0's content after its finish_reason is refused; an empty choice 0 is not",
        [
            _chat(content="a", ids=[1], finish_reason="length"),
            '{"id":"chatcmpl-a","choices":[{"index":0,"delta":{},"finish_reason":null}]}',
            _chat(content="", ids=[2]),
        ],
        [
            ([("sse_id", "chatcmpl-a"), ("sse", "a", [1])], "length"),
            ([], "length"),
            ("error", f"{SHAPE}choice 0 has content after its finish_reason"),
        ],
    ),
    (
        "the id is pushed once, then when it changes; usage with the per-step metrics",
        [
            _chat(content="a", ids=[1]),
            _chat(content="", ids=[], finish_reason="stop"),
            '{"id":"chatcmpl-b","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1},'
            '"metrics":{"speculative_decoding":{"per_step_accepted":[0],"per_step_drafted":[3]}}}',
        ],
        [
            ([("sse_id", "chatcmpl-a"), ("sse", "a", [1])], None),
            ([], "stop"),
            ([("sse_id", "chatcmpl-b"), ("sse_usage", 1, [0], [3])], "stop"),
        ],
    ),
]


@pytest.mark.parametrize(("name", "payloads", "expected"), CASES, ids=[c[0] for c in CASES])
def test_reference_extraction(name: str, payloads: list[str], expected: list[Any]) -> None:
    got = reference(payloads)
    if expected == ["json"]:
        assert got[0][0] == "error" and got[0][1].startswith(JSON_ERROR), got
    else:
        assert got == expected


@needs_native
@pytest.mark.parametrize(("name", "payloads", "expected"), CASES, ids=[c[0] for c in CASES])
def test_rust_extraction_agrees(name: str, payloads: list[str], expected: list[Any]) -> None:
    assert same(reference(payloads), native(payloads)), (reference(payloads), native(payloads))


# Random chunks: mostly the shapes vLLM sends, with odd values mixed in.
_odd = st.sampled_from([None, True, 1.5, -1, 2**32, 2**70, "x", [], {}, "\ud800", -0.0, 1e300])
_ids = st.one_of(st.lists(st.integers(0, 2**32 - 1), max_size=4), st.lists(_odd, max_size=2), _odd)
_text = st.one_of(st.text(max_size=6), _odd)
_choice = st.fixed_dictionaries(
    {"index": st.one_of(st.integers(0, 2), _odd)},
    optional={
        "delta": st.one_of(st.fixed_dictionaries({}, optional={"content": _text}), _odd),
        "text": _text,
        "token_ids": _ids,
        "finish_reason": st.one_of(st.sampled_from(["stop", "length", None]), _odd),
    },
)
_chunk_value = st.fixed_dictionaries(
    {"choices": st.one_of(st.lists(_choice, max_size=3), _odd)},
    optional={
        "id": st.one_of(st.sampled_from(["chatcmpl-a", "chatcmpl-b"]), _odd),
        "usage": st.one_of(
            st.fixed_dictionaries(
                {}, optional={"completion_tokens": st.one_of(st.integers(0, 9), _odd)}
            ),
            _odd,
        ),
        "metrics": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "speculative_decoding": st.one_of(
                        st.fixed_dictionaries(
                            {},
                            optional={
                                "per_step_accepted": _ids,
                                "per_step_drafted": _ids,
                                "num_spec_steps": st.one_of(st.integers(0, 9), _odd),
                                "num_draft_tokens": st.one_of(st.integers(0, 9), _odd),
                            },
                        ),
                        _odd,
                    )
                },
            ),
            _odd,
        ),
        "timings": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "predicted_n": st.one_of(st.integers(0, 9), _odd),
                    "draft_n": st.one_of(st.integers(0, 9), _odd),
                    "draft_n_accepted": st.one_of(st.integers(0, 9), _odd),
                    "predicted_ms": st.floats(0, 9),
                },
            ),
            _odd,
        ),
    },
)  # fmt: skip


def _dump(value: Any) -> str:
    return json.dumps(value)  # escapes: a lone surrogate can only arrive as \\ud800


@needs_native
@PROPERTY
@given(chunks=st.lists(_chunk_value.map(_dump), min_size=1, max_size=6))
def test_random_chunks_give_the_same_inputs_in_both_extractions(chunks: list[str]) -> None:
    ref, nat = reference(chunks), native(chunks)
    assert same(ref, nat), (chunks, ref, nat)


# ------------------------------------------------------------ every reading path


class _BadChunkServer(FakeServer):
    """Stream "bad:<json value>" sends token_ids [value]; "surrogate" a lone
    surrogate escape in its text; anything else the healthy stream."""

    async def _complete(
        self, prompt: str, writer: asyncio.StreamWriter, request_id: str = "x"
    ) -> None:
        if not (prompt.startswith("bad:") or prompt == "surrogate"):
            await super()._complete(prompt, writer, request_id)
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        )
        first = {"id": "chatcmpl-x", "choices": [{"index": 0, "delta": {"content": "a"},
                                                  "token_ids": [1]}]}  # fmt: skip
        if prompt == "surrogate":
            bad = '{"choices":[{"index":0,"delta":{"content":"b\\ud800"},"token_ids":[2]}]}'
        else:
            ids = prompt[4:]
            bad = f'{{"choices":[{{"index":0,"delta":{{"content":"b"}},"token_ids":[{ids}]}}]}}'
        writer.write(_sse(first) + _sse(bad) + _sse("[DONE]") + _chunk(b""))
        await writer.drain()


# --reconciler python reads SSE in Python (reference extraction); --reconciler
# rust reads in the Rust HTTP thread, with or without a recording (the tap).
PATHS = [["--reconciler", "python"], ["--reconciler", "rust", "--record", "{record}"],
         ["--reconciler", "rust"]]  # fmt: skip


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Rust SSE thread: Unix")
@needs_native
@pytest.mark.parametrize("path", range(len(PATHS)), ids=["python", "rust-recorded", "rust"])
@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ('"x"', f"{SHAPE}choices[0].token_ids[0] {U32}"),
        ("null", f"{SHAPE}choices[0].token_ids[0] {U32}"),
        ("1.5", f"{SHAPE}choices[0].token_ids[0] {U32}"),
        ("true", f"{SHAPE}choices[0].token_ids[0] {U32}"),
        ("99999999999999999999999", f"{SHAPE}choices[0].token_ids[0] {U32}"),
        ("-3", f"{SHAPE}choices[0].token_ids[0] {U32}"),
        ("surrogate", JSON_ERROR),
    ],
)
def test_a_bad_chunk_fails_its_stream_with_its_reason_in_every_path(
    path: int, value: str, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompt = "surrogate" if value == "surrogate" else f"bad:{value}"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"{prompt}\nok\n", encoding="utf-8")
    args = [arg.replace("{record}", str(tmp_path / "run.phrec")) for arg in PATHS[path]]
    with _BadChunkServer() as server:
        code = cli.main(
            ["--prompt-file", str(prompts), "--endpoint", server.url + "/v1/chat/completions",
             "--view", "plain", "--mode", "chunk", *args]
        )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 1
    # The run's message, after any line confirming the recording.
    first_line = next(line for line in err.splitlines() if " written to " not in line)
    assert first_line.startswith(
        f"parallelhue: 1 of 2 streams failed; stream 0: bad SSE data: {reason}"
    )
    assert "Hello world!" in out  # the healthy stream read to its end
