"""Write seed corpora for the fuzz targets from tests/vectors/*.json.

Usage (from the repository root): python3 rust/fuzz/make_seeds.py
"""

import hashlib
import json
import pathlib
import struct
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = ROOT / "rust" / "fuzz" / "corpus"


def write(target: str, data: bytes) -> None:
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / hashlib.sha1(data).hexdigest()).write_bytes(data)


frames = []
for path in sorted((ROOT / "tests" / "vectors").glob("*.json")):
    doc = json.loads(path.read_text())
    for v in doc["valid"] + doc["invalid"]:
        b = bytes.fromhex(v["hex"])
        if len(b) <= 4096:
            write("decode_frame", b)
        if v in doc["valid"]:
            frames.append(b)

sse = [
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"h\xc3\xa9"},'
    b'"token_ids":[5,6],"finish_reason":null}]}\n\n',
    b": keep-alive\r\n\r\ndata: [DONE]\r\n\r\n",
    b'data: {"choices":[{"index":1,"text":"x","token_ids":[1],"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}\r\r',
    b'event: ping\ndata: 1\ndata: 2\n\n\xef\xbb\xbfdata: {"error":{"message":"x"}}\n\n',
]
for s in sse:
    write("sse_chunks", b"\x03" + s)

sse.append(
    b'data: {"id":"chatcmpl-a","choices":[],"usage":{"completion_tokens":2},'
    b'"metrics":{"speculative_decoding":{"per_step_accepted":[1],"per_step_drafted":[3]}}}\n\n'
)
write("sse_chunks", b"\x03" + sse[-1])

# Reconciler: op 0 = frame (u16 length), 1 = SSE delta (stream, n ids, ids, text
# length, text), 2 = finish SSE (stream, reason), 3 = chunk id (stream, right or
# wrong), 4 = another choice, 5 = usage (stream, flags, list length, counts).
ops = b""
for f in frames[:40]:
    if len(f) < 600:
        ops += b"\x00" + struct.pack("<H", len(f)) + f
write("reconciler", ops)
write("reconciler", ops + b"\x03\x00\x00\x01\x00\x02\x07\x07\x02hi\x02\x00\x00")
write("reconciler", ops + b"\x03\x01\x00\x05\x01\x0b\x01\x01\x02\x01\x00")

# The HTTP telemetry stream: every vector, whole (first byte 0x00: split in
# 1-byte pieces, no preamble added) and with its preamble cut off (0x80 adds one).
stream_doc = json.loads((ROOT / "tests" / "vectors" / "stream" / "telemetry_stream.json").read_text())
for v in stream_doc["vectors"]:
    b = bytes.fromhex(v["hex"])
    write("telemetry_stream", b"\x00" + b)
    if b.startswith(b"PHTS") and len(b) > 32:
        write("telemetry_stream", b"\x85" + b[32:])

# chunk_paths: the chunk JSON alone, as vLLM and the simulated engine send it
# (the scanner's grammar), and shapes only the typed or Value path reads.
for chunk in [
    b'{"id":"chatcmpl-3f1c","object":"chat.completion.chunk","created":1764400000,'
    b'"model":"sim","choices":[{"index":0,"delta":{"content":"\xe4\xb8\x96 hi"},'
    b'"logprobs":null,"finish_reason":null,"token_ids":[1234,5678]}]}',
    b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
    b'"finish_reason":null}],"usage":null}',
    b'{"id":"cmpl-9","object":"text_completion","created":12,"model":"m","choices":'
    b'[{"index":0,"text":"","logprobs":null,"finish_reason":"length","stop_reason":13}],'
    b'"usage":null,"metrics":null}',
    b'{"choices":[{"index":1,"delta":null,"text":"a","token_ids":null},'
    b'{"index":4294967295,"delta":{"content":null,"token_ids":[]}}]}',
    b'{"choices":[{"index":0,"delta":{"content":"b","token_ids":[1,2]},"token_ids":null}]}',
    b'{"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2},'
    b'"metrics":{"speculative_decoding":{"per_step_accepted":[1],"per_step_drafted":[3]}}}',
    b'{"choices": [ {"index":0,"delta":{"content":"a\\nb\\u00e9"}} ]}',
    b'{"error":{"message":"x","code":400}}',
]:
    write("chunk_paths", chunk)

# sse_differential: whole bodies (first byte 0x03: reads of 4 bytes), vLLM-shaped
# and with every kind of trouble for a byte reader; 0x80 cuts at each 0x1f.
trouble = [
    b"data: \xef\xbb\xbf{}\n\n", b"\xef\xbb\xbf: c\r\n\r\n", b"data: \xff\n\n",
    b": \xc0\xaf\n", b'data: {"x":"\xed\xa0\x80"}\n\n', b'data: {"x":"\\ud800"}\n\n',
    b"data: \x00\n\n", b"data: \xc2\xa0[DONE]\x1c\n\n", b"data\r\ndata: 1\r\r",
    b"data: \xe6\x1f\x97\x1f\xa5\n\n", b"event: \xe6\x97\xa5\ndata: 2\n\n",
]
# In-band telemetry events (the plugin's own encoder): frames, then an end item that
# counts them, says frames were dropped, or miscounts; and a body that ends before it.
sys.path.insert(0, str(ROOT / "plugin"))
from parallelhue_vllm import inband  # noqa: E402

chunk = sse[0]
frame_items = b"".join(inband.frame_item(f) for f in frames[:2])
trouble += [
    inband.event(frame_items) + chunk + inband.event(inband.end_item(0, 2, 0, 7)),
    inband.event(frame_items + inband.end_item(inband.STATUS_DROPPED, 2, 3, 0)),
    inband.event(frame_items + inband.end_item(0, 1, 0, 0)) + b"data: [DONE]\n\n",
    inband.event(frame_items) + b"data: [DONE]\n\n",
    b"event: parallelhue\ndata: AQ=\n\n",
]
for s in sse + trouble:
    write("sse_differential", b"\x03" + s)
    write("sse_differential", b"\x80" + s[: len(s) // 2] + b"\x1f" + s[len(s) // 2 :])
write("sse_differential", b"\x00" + b"".join(sse))

# frame_differential: every vector frame as it is (0x00) and with the version and
# body length patched (0x03: the same frame, kept valid when it was).
for path in sorted((ROOT / "tests" / "vectors").glob("*.json")):
    doc = json.loads(path.read_text())
    for v in doc["valid"] + doc["invalid"]:
        b = bytes.fromhex(v["hex"])
        if len(b) <= 4096:
            write("frame_differential", b"\x00" + b)
            write("frame_differential", b"\x03" + b)
