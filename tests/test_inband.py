"""In-band telemetry's wire format (docs/PROTOCOL.md, "In-band telemetry"): the
reference decoder against the normative vectors (the Rust decoder reads the same
file in `rust/core/src/telemetry/inband.rs`), the encoder round trip, the envelopes between
emitters and hubs, and the claims that keep a request's frames for its response."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from parallelhue_vllm import inband, wire
from parallelhue_vllm.hub import Hub, HubLimits

VECTORS = Path(__file__).resolve().parent / "vectors" / "inband"
DOC = json.loads((VECTORS / "inband.json").read_text(encoding="utf-8"))


def meaning(item: bytes | inband.End) -> dict[str, object]:
    if isinstance(item, bytes):
        return {"kind": "frame", "hex": item.hex()}
    return {
        "kind": "end",
        "status": item.status,
        "frames": item.frames,
        "dropped": item.dropped,
        "waited_us": item.waited_us,
        "reason": inband.lost_reason(item),
    }


@pytest.mark.parametrize("case", DOC["cases"], ids=[c["name"] for c in DOC["cases"]])
def test_reference_decoder_passes_the_vectors(case: dict[str, object]) -> None:
    data = str(case["data"])
    if "error" in case:
        with pytest.raises(inband.InbandError) as error:
            inband.decode_event(data)
        assert str(error.value) == case["error"]
    else:
        assert [meaning(i) for i in inband.decode_event(data)] == case["items"]


def test_every_refusal_and_reason_of_the_spec_has_a_vector() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "PROTOCOL.md").read_text()
    section = text[text.index("## In-band telemetry") :]
    section = section[: section.index("### Isolation")]
    templates = re.findall(r"\| `((?:in-band telemetry|telemetry lost): [^`]+)` \|", section)
    assert len(templates) == 16
    said = [str(c["error"]) for c in DOC["cases"] if "error" in c] + [
        str(i["reason"]) for c in DOC["cases"] for i in c.get("items", []) if i.get("reason")
    ]
    # Three refusals come from the reader's rules across events (tests/test_sse_body.py).
    across = ("an event after its end item", "the end item counts", "end item status")
    for template in templates:
        if any(part in template for part in across):
            continue
        pattern = ".+".join(re.escape(part) for part in re.split(r"\{[^}]+\}", template))
        assert any(re.fullmatch(pattern, e) for e in said), f"no vector for {template!r}"


def test_vectors_are_generated_from_the_script() -> None:
    script = VECTORS / "generate.py"
    assert subprocess.run([sys.executable, str(script), "--check"]).returncode == 0


def test_encoded_events_decode_to_their_items() -> None:
    frames = [b"PHUE" + bytes([i]) * 70 for i in range(3)]
    items = b"".join(inband.frame_item(f) for f in frames) + inband.end_item(0, 3, 0, 42)
    raw = inband.event(items)
    assert raw.startswith(b"event: parallelhue\ndata: ") and raw.endswith(b"\n\n")
    data = raw.split(b"data: ", 1)[1].rstrip(b"\n").decode()
    decoded = inband.decode_event(data)
    assert decoded[:3] == frames
    assert decoded[3] == inband.End(0, 3, 0, 42)


def test_envelopes_round_trip_and_split_into_datagrams() -> None:
    big = b"x" * 60_000
    envelopes = [inband.Envelope(b"req-%d" % i, 1, i % 3, i, big) for i in range(8)]
    datagrams = inband.encode_envelopes(envelopes)
    assert len(datagrams) > 1
    assert all(len(d) <= inband.MAX_ENVELOPE_DATAGRAM for d in datagrams)
    back = [e for d in datagrams for e in inband.parse_envelopes(d) or []]
    assert back == envelopes
    assert inband.parse_envelopes(b"PHUE" + bytes(20)) is None
    assert inband.parse_envelopes(datagrams[0][:-1]) is None  # cut inside a frame


def test_record_extent_reads_offset_count_and_finished() -> None:
    record = wire.encode_record(
        wire.KIND_PROVENANCE,
        wire.ProvenanceRecord(4, 10, [1, 2, 3], [0, 0, 0], 0, finished=True, finish_reason=1),
    )
    assert inband.record_extent(record) == (4, 13, True)


def _envelope(key: bytes, role: int, flags: int, tokens: int, frame: bytes) -> bytes:
    return inband.encode_envelopes([inband.Envelope(key, role, flags, tokens, frame)])[0]


async def _claim_flow(tmp_path: Path) -> None:
    hub = Hub("ab12", base=str(tmp_path / "hubs"), limits=HubLimits(wait_seconds=0.3))
    mine = hub.claim()
    other = hub.claim()
    assert mine.bind("cmpl-ph1_x-aaaa")
    assert not other.bind("cmpl-ph1_x-aaaa"), "a request id is bound once"
    frame = b"PHUE" + bytes(60)
    hub._route([(_envelope(b"cmpl-ph1_x-aaaa", wire.SOURCE_FRONTEND, 0, 3, frame), 0)])
    hub._route([(_envelope(b"cmpl-ph1_x-bbbb", wire.SOURCE_SCHEDULER, 0, 3, frame), 0)])
    assert hub.stats()["unclaimed"] == 1
    events = mine.take()
    assert events.count(b"event: parallelhue") == 1 and mine.frames == 1
    assert other.take() == b""
    # The frontend finished at 5 tokens; the scheduler covered 3: the end waits, then
    # says the scheduler's frames are missing.
    hub._route(
        [(_envelope(b"cmpl-ph1_x-aaaa", wire.SOURCE_FRONTEND, inband.FLAG_FINISHED, 5, frame), 0)]
    )
    hub._route([(_envelope(b"cmpl-ph1_x-aaaa", wire.SOURCE_SCHEDULER, 0, 3, frame), 0)])
    tail = await mine.finish()
    items = [
        i
        for e in tail.split(b"\n\n")
        if e
        for i in inband.decode_event(e.split(b"data: ", 1)[1].decode())
    ]
    end = items[-1]
    assert isinstance(end, inband.End)
    assert (end.status, end.frames) == (inband.STATUS_MISSING_SCHEDULER, 3)
    assert end.waited_us >= 250_000
    assert hub.stats()["open_claims"] == 1  # `other` is still open
    other.close()
    assert hub.stats()["open_claims"] == 0 and hub.stats()["buffered_bytes"] == 0


def test_claims_keep_only_their_own_request_and_say_what_is_missing(tmp_path: Path) -> None:
    asyncio.run(_claim_flow(tmp_path))


async def _coverage(tmp_path: Path) -> None:
    hub = Hub("ab13", base=str(tmp_path / "hubs"))
    claim = hub.claim()
    claim.bind("r1")
    frame = b"PHUE" + bytes(60)
    hub._route([(_envelope(b"r1", wire.SOURCE_FRONTEND, inband.FLAG_FINISHED, 5, frame), 0)])
    assert not claim.complete()
    # The scheduler's frames reach the frontend's last token: complete without its close
    # (a stop string ended the request in the frontend; the engine may never step again).
    hub._route([(_envelope(b"r1", wire.SOURCE_SCHEDULER, 0, 6, frame), 0)])
    assert claim.complete()
    tail = await claim.finish()
    assert tail.count(b"event: parallelhue") == 2


def test_a_claim_is_complete_once_the_scheduler_covers_the_final_text(tmp_path: Path) -> None:
    asyncio.run(_coverage(tmp_path))


async def _overflow(tmp_path: Path) -> None:
    hub = Hub("ab14", base=str(tmp_path / "hubs"), limits=HubLimits(buffer_bytes=1000))
    claim = hub.claim()
    claim.bind("r1")
    frame = b"PHUE" + bytes(500)
    for _ in range(4):
        hub._route([(_envelope(b"r1", wire.SOURCE_SCHEDULER, 0, 1, frame), 0)])
    assert claim.poisoned and claim.take() == b"" and hub.stats()["buffered_bytes"] == 0
    tail = await claim.finish()
    end = inband.decode_event(tail.split(b"data: ", 1)[1].rstrip(b"\n").decode())[-1]
    assert isinstance(end, inband.End)
    assert (end.status, end.frames, end.dropped) == (inband.STATUS_DROPPED, 0, 4)


def test_an_overflowing_claim_keeps_nothing_more_and_counts_the_loss(tmp_path: Path) -> None:
    asyncio.run(_overflow(tmp_path))
