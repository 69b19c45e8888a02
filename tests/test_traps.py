"""vLLM's role traps (plugin/parallelhue_vllm/traps.py): a notice, never a guess.

Stand-ins for vLLM objects follow the code paths of the release where each
trap appears (the real classes are exercised by tests/vllm/test_traps_real.py):
the Rust frontend (every release), a diffusion engine (no autoregressive
token per step), dspark's adaptive verification in the speculative config
(0.28), trace replay (0.29), `fly` rejection sampling, a streaming-input
request, and an EngineCoreOutput carrying `error` that process_outputs
finishes without make_request_output (0.33). Each ends, on the client, as a
failed stream with the notice's precise reason in both reconcilers.
"""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import Any

import pytest

from parallelhue.reference import Reconciler
from parallelhue.reference.decode import Frame
from parallelhue_vllm import __version__, traps, wire
from parallelhue_vllm.adapters import _wrap_add_request, _wrap_process_outputs
from plugin_standins import (  # the shared vLLM stand-ins
    RUN,
    FakeDetokenizer,
    FakeProcessor,
    FakeRequestState,
    FinishReason,
    frames_of,
    make_frontend,
    make_scheduler,
    raw_frames,
    receiver,
    reconcilers,
    rid,
    sched_step,
)

__all__ = ["receiver"]  # the fixture, imported for pytest

PIECES = {1: "a", 4: "b", 10: "c"}


# ------------------------------------------------------------ pure functions
def test_adaptive_verification_is_detected_from_the_config() -> None:
    spec = SimpleNamespace(method="dspark", enable_adaptive_verification=True)
    assert traps.roles_unverifiable(spec) == (
        "roles not derivable: dspark adaptive verification is on "
        "(enable_adaptive_verification), so the worker may verify fewer drafts than "
        "were scheduled and a bonus cannot be told from a correction"
    )
    assert traps.roles_unverifiable(SimpleNamespace(method="dspark")) is None  # vLLM 0.32
    assert (
        traps.roles_unverifiable(
            SimpleNamespace(method="dspark", enable_adaptive_verification=False)
        )
        is None
    )
    assert traps.roles_unverifiable(None) is None


def test_engine_errors_and_streaming_input_are_named() -> None:
    error = SimpleNamespace(code="grammar_compile_error", message="unbalanced brace")
    assert traps.engine_error(SimpleNamespace(error=error)) == (
        "the engine ended the request with an error (grammar_compile_error: unbalanced "
        "brace); its last output did not pass the telemetry hooks"
    )
    assert traps.engine_error(SimpleNamespace(error=None)) is None
    assert traps.engine_error(SimpleNamespace()) is None  # vLLM 0.32 has no `error`
    assert traps.streaming_input(SimpleNamespace(streaming_input=True)) is not None
    assert traps.streaming_input(SimpleNamespace(streaming_input=False)) is None
    assert traps.streaming_input(SimpleNamespace()) is None
    no_tokens = SimpleNamespace(new_token_ids=[], error=error)
    assert traps.finished_without_tokens(no_tokens, True) == (
        "the engine finished the request with an error (grammar_compile_error: unbalanced "
        "brace) in a step without tokens; the scheduler's records cannot close it"
    )
    assert traps.finished_without_tokens(no_tokens, False) is None
    assert traps.finished_without_tokens(SimpleNamespace(new_token_ids=[5]), True) is None


RUST_MESSAGE = (
    "VLLM_USE_RUST_FRONTEND=1: vLLM's Rust frontend serves HTTP, where the API-server hooks "
    "never run, so no text record can back the tokens; unset it for exact telemetry"
)


def test_the_rust_frontend_is_read_as_vllm_would_or_safer() -> None:
    assert traps.rust_frontend({}) is None
    assert traps.rust_frontend({"VLLM_USE_RUST_FRONTEND": "0"}) is None
    assert traps.rust_frontend({"VLLM_USE_RUST_FRONTEND": ""}) is None
    assert traps.rust_frontend({"VLLM_USE_RUST_FRONTEND": "1"}) == RUST_MESSAGE
    # vLLM would fail on a non-integer; the plugin refuses rather than guess.
    assert traps.rust_frontend({"VLLM_USE_RUST_FRONTEND": "true"}) == RUST_MESSAGE.replace(
        "=1:", "=true:"
    )


def test_other_traps_are_named() -> None:
    assert traps.no_autoregressive_sampling(SimpleNamespace(num_sampled_tokens_per_step=1)) is None
    assert traps.no_autoregressive_sampling(SimpleNamespace()) is None  # not in the stand-ins
    assert traps.no_autoregressive_sampling(SimpleNamespace(num_sampled_tokens_per_step=0)) == (
        "roles not derivable: the engine samples 0 autoregressive tokens per step (a diffusion "
        "or pooling model), so its scheduled tokens are not drafts a target verifies"
    )
    assert traps.trace_replay(SimpleNamespace(trace_decode_token_ids=None)) is None
    assert traps.trace_replay(None) is None
    assert traps.trace_replay(SimpleNamespace(trace_decode_token_ids=[5, 6])) == (
        "roles not derivable: the request replays trace_decode_token_ids, so the engine emits "
        "the trace's tokens and a draft counts as accepted when it equals the trace, not "
        "because the target verified it"
    )


# ------------------------------------------------------------ scheduler side
def notices(frames: list[bytes]) -> dict[int, tuple[int, str]]:
    from parallelhue.reference import decode_frame

    found = {}
    for frame in map(decode_frame, frames):
        for record in frame.records:
            if isinstance(record, wire.NoticeRecord):
                found[record.stream] = (record.code, record.message)
    return found


def test_the_rust_frontend_gets_a_notice_from_both_sides(
    receiver: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_USE_RUST_FRONTEND", "1")
    scheduler, update, sched = make_scheduler()
    sched_step(scheduler, update, {rid(0): ([1], [])})
    sched_step(scheduler, update, {rid(0): ([4, 10], [4])})
    from_scheduler = raw_frames(receiver, sched)
    assert notices(from_scheduler) == {0: (wire.NOTICE_HOOK_BYPASSED, RUST_MESSAGE)}
    assert len(from_scheduler) == 2  # the hello and the notice: no provenance
    processor, process, front = make_frontend()
    processor.add(rid(0), FakeRequestState(rid(0), FakeDetokenizer(PIECES)))  # type: ignore[attr-defined]
    process(processor, [output(rid(0), [1], "a")])
    from_frontend = raw_frames(receiver, front)
    assert notices(from_frontend) == {0: (wire.NOTICE_HOOK_BYPASSED, RUST_MESSAGE)}
    assert len(from_frontend) == 2


def test_a_diffusion_engine_sends_a_notice_instead_of_roles(receiver: socket.socket) -> None:
    scheduler, update, telemetry = make_scheduler()
    scheduler.num_sampled_tokens_per_step = 0  # type: ignore[attr-defined]
    sched_step(scheduler, update, {rid(0): ([1], [])})
    frames = raw_frames(receiver, telemetry)
    assert notices(frames) == {0: (wire.NOTICE_ROLES_UNVERIFIABLE,
                                   traps.no_autoregressive_sampling(scheduler))}  # fmt: skip
    assert len(frames) == 2


def test_only_the_trace_replay_request_gets_a_notice(receiver: socket.socket) -> None:
    from parallelhue.reference import decode_frame

    scheduler, update, telemetry = make_scheduler()
    replay = SimpleNamespace(trace_decode_token_ids=[4, 10])
    sampling = {rid(0): replay, rid(1): SimpleNamespace(trace_decode_token_ids=None)}
    sched_step(scheduler, update, {rid(0): ([1], []), rid(1): ([1], [])}, sampling)
    sched_step(scheduler, update, {rid(0): ([4, 10], [4]), rid(1): ([4, 10], [4])})
    frames = raw_frames(receiver, telemetry)
    assert notices(frames) == {0: (wire.NOTICE_ROLES_UNVERIFIABLE, traps.trace_replay(replay))}
    streams = {
        record.stream
        for frame in map(decode_frame, frames)
        for record in frame.records
        if isinstance(record, wire.ProvenanceRecord)
    }
    assert streams == {1}


@pytest.mark.parametrize(
    ("method", "verification"),
    [
        ("standard", wire.VERIFICATION_STANDARD),
        ("fly", wire.VERIFICATION_FLY),
        ("synthetic", wire.VERIFICATION_SYNTHETIC),
        ("block", wire.VERIFICATION_UNKNOWN),
    ],
)
def test_hello_says_how_drafts_are_verified(
    receiver: socket.socket, method: str, verification: int
) -> None:
    scheduler, update, telemetry = make_scheduler()
    scheduler.vllm_config.speculative_config.rejection_sample_method = method
    sched_step(scheduler, update, {rid(0): ([5, 6], [5])})
    frames = frames_of(receiver, telemetry)
    assert frames[0].hello is not None
    assert frames[0].hello.verification == verification
    rec = Reconciler(RUN, 1)
    rec.push_frame(_hello_bytes(frames[0]))
    names = {1: "standard", 2: "synthetic", 3: "fly", 4: "unknown"}
    assert rec.sources()[0]["verification"] == names[verification]


def _hello_bytes(frame: Frame) -> bytes:
    assert frame.hello is not None
    return wire.encode_hello(frame.header, frame.hello)


def adaptive_scheduler_frames(receiver: socket.socket, adaptive: bool) -> list[bytes]:
    scheduler, update, telemetry = make_scheduler(method="dspark", k=3)
    scheduler.vllm_config.speculative_config.enable_adaptive_verification = adaptive
    r0 = rid(0)
    sched_step(scheduler, update, {r0: ([1], [])})
    # All three scheduled drafts "accepted": with adaptive verification the worker may
    # have verified only one of them, so the 4th token need not be a bonus.
    scheduler.finish[r0] = FinishReason.LENGTH
    sched_step(scheduler, update, {r0: ([4, 10, 11, 12], [4, 10, 11])})
    return raw_frames(receiver, telemetry)


def test_adaptive_verification_sends_a_notice_instead_of_roles(receiver: socket.socket) -> None:
    from parallelhue.reference import decode_frame

    frames = [decode_frame(f) for f in adaptive_scheduler_frames(receiver, adaptive=True)]
    assert [f.kind for f in frames] == [wire.KIND_HELLO, wire.KIND_NOTICE]
    notice = frames[1].records[0]
    assert isinstance(notice, wire.NoticeRecord)
    assert (notice.stream, notice.code) == (0, wire.NOTICE_ROLES_UNVERIFIABLE)
    assert notice.message.startswith("roles not derivable: dspark adaptive verification is on")


def test_without_adaptive_verification_the_same_steps_carry_roles(
    receiver: socket.socket,
) -> None:
    from parallelhue.reference import decode_frame

    frames = [decode_frame(f) for f in adaptive_scheduler_frames(receiver, adaptive=False)]
    assert [f.kind for f in frames] == [wire.KIND_HELLO] + [wire.KIND_PROVENANCE] * 2
    last = frames[2].records[0]
    assert isinstance(last, wire.ProvenanceRecord)
    assert last.roles == [wire.ROLE_ACCEPTED] * 3 + [wire.ROLE_BONUS]


def test_an_engine_error_in_a_step_without_tokens_is_a_notice(receiver: socket.socket) -> None:
    from parallelhue.reference import decode_frame

    scheduler, update, telemetry = make_scheduler()
    r0 = rid(0)
    sched_step(scheduler, update, {r0: ([1], [])})
    scheduler.keep[r0] = 0
    scheduler.finish[r0] = SimpleNamespace(name="ERROR")  # type: ignore[assignment]
    sched_step(scheduler, update, {r0: ([], [])})
    frames = [decode_frame(f) for f in raw_frames(receiver, telemetry)]
    assert [f.kind for f in frames] == [wire.KIND_HELLO, wire.KIND_PROVENANCE, wire.KIND_NOTICE]
    notice = frames[2].records[0]
    assert isinstance(notice, wire.NoticeRecord)
    assert notice.code == wire.NOTICE_HOOK_BYPASSED
    assert notice.message == (
        "the engine finished the request with an error in a step without tokens; "
        "the scheduler's records cannot close it"
    )


# ------------------------------------------------------------- frontend side
class ErrorProcessor(FakeProcessor):
    """vLLM 0.33's process_outputs: an output carrying `error` is queued as an exception
    and the request finished, without make_request_output."""

    def process_outputs(self, engine_core_outputs: list[Any], *args: Any) -> None:
        for output in engine_core_outputs:
            if getattr(output, "error", None) is not None:
                self.request_states.pop(output.request_id, None)
                continue
            FakeProcessor.process_outputs(self, [output])


def output(request_id: str, tokens: list[int], http_text: str, **extra: Any) -> Any:
    return SimpleNamespace(
        request_id=request_id,
        new_token_ids=list(tokens),
        fed=len(tokens),
        keep=None,
        http_text=http_text,
        finish_reason=extra.get("finish"),
        stop_reason=None,
        error=extra.get("error"),
    )


def error_frontend_frames(receiver: socket.socket) -> list[bytes]:
    _, _, telemetry = make_frontend()
    processor = ErrorProcessor()
    process = _wrap_process_outputs(ErrorProcessor.process_outputs, telemetry)
    add = _wrap_add_request(FakeProcessor.add_request, telemetry)
    r0 = rid(0)
    state = FakeRequestState(r0, FakeDetokenizer(PIECES))
    add(processor, SimpleNamespace(request_id=r0, state=state), None)
    process(processor, [output(r0, [1], "a")])
    error = SimpleNamespace(code="kv_load_failure", message="KV blocks lost")
    process(processor, [output(r0, [], "", finish=FinishReason.ABORT, error=error)])
    assert telemetry.requests == {}  # nothing left waiting
    return raw_frames(receiver, telemetry)


def test_an_error_output_outside_make_request_output_is_a_notice(
    receiver: socket.socket,
) -> None:
    from parallelhue.reference import decode_frame

    frames = [decode_frame(f) for f in error_frontend_frames(receiver)]
    assert [f.kind for f in frames] == [wire.KIND_HELLO, wire.KIND_TEXT, wire.KIND_NOTICE]
    assert frames[2].records == [
        wire.NoticeRecord(
            0,
            wire.NOTICE_HOOK_BYPASSED,
            "the engine ended the request with an error (kv_load_failure: KV blocks lost); "
            "its last output did not pass the telemetry hooks",
        )
    ]


def test_a_streaming_input_request_is_not_tracked(receiver: socket.socket) -> None:
    from parallelhue.reference import decode_frame

    processor, process, telemetry = make_frontend()
    r0 = rid(0)
    state = FakeRequestState(r0, FakeDetokenizer(PIECES))
    state.streaming_input = True  # type: ignore[attr-defined]
    processor.add(r0, state)  # type: ignore[attr-defined]
    process(processor, [output(r0, [1], "a")])
    process(processor, [output(r0, [4], "b", finish=FinishReason.STOP)])
    frames = [decode_frame(f) for f in raw_frames(receiver, telemetry)]
    assert [f.kind for f in frames] == [wire.KIND_HELLO, wire.KIND_NOTICE]
    assert frames[1].records == [
        wire.NoticeRecord(
            0,
            wire.NOTICE_HOOK_BYPASSED,
            "streaming-input request: its outputs pass StreamingInputOutputCollector across "
            "input chunks, which the telemetry hooks do not follow",
        )
    ]


# ------------------------------------------------------ what the client shows
def _scheduler_hello(source: int, method: str = "ngram") -> bytes:
    return wire.encode_hello(
        wire.Header(bytes.fromhex(RUN), source, 0, 0, 0),
        wire.Hello(wire.SOURCE_SCHEDULER, wire.ENGINE_VLLM, wire.DERIVATION_DRAFT_IDS, False, 3,
                   __version__, "0.32.0", method, wire.VERIFICATION_STANDARD),
    )  # fmt: skip


@pytest.mark.parametrize("cls", reconcilers())
def test_client_fails_the_errored_stream_with_the_engines_reason(
    receiver: socket.socket, cls: Any
) -> None:
    """The frontend's notice reaches the reconciler beside a scheduler that emitted the
    first token and never closed the request; the SSE ended without a finish reason."""
    text_frames = error_frontend_frames(receiver)
    rec = cls(RUN, 1)
    source = 0x5C
    rec.push_frame(_scheduler_hello(source))
    first = wire.ProvenanceRecord(0, 0, [1], [wire.ROLE_PLAIN], 0)
    rec.push_frame(
        wire.encode_records(
            wire.KIND_PROVENANCE, wire.Header(bytes.fromhex(RUN), source, 1, 1, 0), [first]
        )
    )
    rec.push_frames(text_frames)
    rec.push_sse_id(0, f"chatcmpl-ph1_{RUN}_0")
    rec.push_sse(0, "a", [1])
    rec.finish_sse(0, None)
    rec.finalize()
    verdict = rec.verdict(0)
    assert verdict[0] == "failed"
    assert verdict[1] is not None
    assert verdict[1].startswith(
        "not exact: the engine ended the request with an error (kv_load_failure: KV blocks "
        "lost); its last output did not pass the telemetry hooks (notice 7 from source "
    )
    assert ("exact", 0) not in rec.drain()


@pytest.mark.parametrize("cls", reconcilers())
def test_client_fails_every_adaptive_stream_with_the_notice(
    receiver: socket.socket, cls: Any
) -> None:
    sched = adaptive_scheduler_frames(receiver, adaptive=True)
    rec = cls(RUN, 1)
    rec.push_frames(sched)
    front = 0xF0
    run = bytes.fromhex(RUN)
    rec.push_frame(
        wire.encode_hello(
            wire.Header(run, front, 0, 0, 0),
            wire.Hello(wire.SOURCE_FRONTEND, wire.ENGINE_VLLM, wire.DERIVATION_NONE, False, 0,
                       __version__, "0.32.0", "", wire.VERIFICATION_NONE),
        )
    )  # fmt: skip
    tokens = [wire.TextToken(t, PIECES.get(t, "x").encode()) for t in (1, 4, 10, 11, 12)]
    record = wire.TextRecord(0, 0, tokens, b"abcxx", finished=True, finish_reason=2)
    rec.push_frame(wire.encode_records(wire.KIND_TEXT, wire.Header(run, front, 1, 1, 0), [record]))
    rec.push_sse_id(0, f"chatcmpl-ph1_{RUN}_0")
    rec.push_sse(0, "abcxx", [1, 4, 10, 11, 12])
    rec.finish_sse(0, "length")
    rec.finalize()
    verdict = rec.verdict(0)
    assert verdict[0] == "failed"
    assert verdict[1] is not None
    assert verdict[1].startswith(
        "not exact: roles not derivable: dspark adaptive verification is on"
    )
    assert "(notice 6 from source " in verdict[1]
    assert ("exact", 0) not in rec.drain()


@pytest.mark.parametrize("cls", reconcilers())
def test_client_never_calls_a_rust_frontend_stream_exact(
    receiver: socket.socket, monkeypatch: pytest.MonkeyPatch, cls: Any
) -> None:
    """With the notice: the stream fails with its reason. Without it (the scheduler's
    provenance and the SSE only, as a plugin that missed the Rust frontend would give):
    two witnesses are never EXACT."""
    run = bytes.fromhex(RUN)
    plain = wire.ProvenanceRecord(0, 0, [1], [wire.ROLE_PLAIN], 0)
    for noticed in (True, False):
        rec = cls(RUN, 1)
        if noticed:
            monkeypatch.setenv("VLLM_USE_RUST_FRONTEND", "1")
            scheduler, update, sched = make_scheduler()
            sched_step(scheduler, update, {rid(0): ([1], [])})
            rec.push_frames(raw_frames(receiver, sched))
        else:
            rec.push_frame(_scheduler_hello(0x5C))
            header = wire.Header(run, 0x5C, 1, 1, 0)
            rec.push_frame(wire.encode_records(wire.KIND_PROVENANCE, header, [plain]))
        rec.push_sse_id(0, f"chatcmpl-ph1_{RUN}_0")
        rec.push_sse(0, "a", [1])
        rec.finish_sse(0, "length")
        rec.finalize()
        verdict = rec.verdict(0)
        assert verdict[0] != "exact", (noticed, verdict)
        assert ("exact", 0) not in rec.drain()
        if noticed:
            assert verdict[0] == "failed"
            assert verdict[1] is not None
            assert verdict[1].startswith(f"not exact: {RUST_MESSAGE} (notice 7 from source ")
