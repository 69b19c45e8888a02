"""The simulated engine's parts: vocabulary, detokenizer, scheduler, stop strings, collector."""

from __future__ import annotations

import asyncio

import pytest

from parallelhue.sim.config import FaultConfig, SimConfig, acceptance_for_stream
from parallelhue.sim.engine import Collector, Engine, SimRequest, request_seed
from parallelhue.sim.metrics import SimMetrics
from parallelhue.sim.vocab import CORPUS, build_vocabulary
from parallelhue_vllm import wire

VOCAB = build_vocabulary()


def make_request(
    engine: Engine,
    *,
    stream: int = 0,
    max_tokens: int = 40,
    stop: tuple[str, ...] = (),
    acceptance: float = 0.7,
    seed: int = 1,
    run_id: str | None = "ab" * 16,
    start: int | None = None,
) -> SimRequest:
    return SimRequest(
        internal_id=f"chatcmpl-x{stream}-00000000",
        external_id=f"chatcmpl-x{stream}",
        run_id=run_id,
        stream=stream,
        start_position=engine.start_position(seed) if start is None else start,
        seed=seed,
        acceptance=acceptance,
        max_tokens=max_tokens,
        stop=stop,
        num_prompt_tokens=3,
    )


class Capture:
    """Collects what the engine hands to telemetry, per kind."""

    def __init__(self) -> None:
        self.provenance: list[tuple[int, list[wire.ProvenanceRecord]]] = []
        self.text: list[tuple[int, list[wire.TextRecord]]] = []

    def on_provenance(self, run_id: str, step: int, records: list[wire.Record]) -> None:
        self.provenance.append((step, [r for r in records if isinstance(r, wire.ProvenanceRecord)]))

    def on_text(self, run_id: str, step: int, records: list[wire.Record]) -> None:
        self.text.append((step, [r for r in records if isinstance(r, wire.TextRecord)]))


def make_engine(config: SimConfig | None = None) -> tuple[Engine, Capture]:
    capture = Capture()
    config = config or SimConfig()
    engine = Engine(
        config,
        VOCAB,
        SimMetrics(config.model, config.draft_len),
        provenance_sink=capture.on_provenance,
        text_sink=capture.on_text,
    )
    return engine, capture


def run_to_end(engine: Engine, limit: int = 10_000) -> int:
    steps = 0
    while engine.active and steps < limit:
        engine.step()
        steps += 1
    return steps


def drain_collector(collector: Collector) -> tuple[str, list[int], str | None]:
    text, ids, finish, _ = collector.take()
    return text, ids, finish


# --------------------------------------------------------------------- vocabulary


def test_cycle_decodes_to_the_corpus_and_splits_characters() -> None:
    joined = b"".join(VOCAB.token_bytes[token] for token in VOCAB.cycle_ids)
    assert joined == CORPUS.encode() * 3
    # Fragments re-assemble the same bytes, and some tokens end inside a character.
    assert b"".join(VOCAB.cycle_fragments) == joined
    empty = [i for i, fragment in enumerate(VOCAB.cycle_fragments) if not fragment]
    assert empty, "no token ends inside a multi-byte character"
    # A 4-byte emoji is split over tokens somewhere in the cycle.
    assert any(
        VOCAB.cycle_span_back[i] > 0 and any(ord(char) > 0xFFFF for char in fragment.decode())
        for i, fragment in enumerate(VOCAB.cycle_fragments)
    )


def test_span_back_counts_the_preceding_empty_fragments() -> None:
    pending = 0
    for fragment, span_back in zip(VOCAB.cycle_fragments, VOCAB.cycle_span_back, strict=True):
        if fragment:
            assert span_back == pending
            fragment.decode("utf-8")  # each fragment is whole characters
            pending = 0
        else:
            assert span_back == 0
            pending += 1


def test_start_positions_are_character_boundaries() -> None:
    for start in VOCAB.starts:
        assert start == 0 or VOCAB.cycle_fragments[start - 1] != b""


def test_corpus_covers_the_scripts_the_grid_must_show() -> None:
    for sample in ("投機", "推测", "🚀", "👩\u200d💻", "e\u0301", "ø", "한국어"):
        assert sample in CORPUS


def test_prompt_tokens_are_byte_tokens() -> None:
    ids = VOCAB.encode_bytes("hé".encode())
    assert VOCAB.decode(ids) == "hé".encode()
    assert len(ids) == 3


# ----------------------------------------------------------------------- engine


def test_roles_follow_the_rejection_sampling_rules() -> None:
    engine, capture = make_engine(SimConfig(draft_len=3, no_draft_rate=0.2))
    for stream in range(6):
        engine.add(make_request(engine, stream=stream, max_tokens=200, acceptance=0.6, seed=stream))
    run_to_end(engine)
    seen_bonus = seen_target = seen_plain_later = False
    first_step: dict[int, bool] = {}
    for _, records in capture.provenance:
        for record in records:
            roles = record.roles
            if record.drafts_scheduled == 0:
                assert roles == [wire.ROLE_PLAIN]
                if record.stream in first_step:
                    seen_plain_later = True
            else:
                assert record.drafts_scheduled == 3
                accepted = roles.count(wire.ROLE_ACCEPTED)
                assert roles[:accepted] == [wire.ROLE_ACCEPTED] * accepted
                if not record.trimmed:
                    last = roles[-1]
                    assert last == (wire.ROLE_BONUS if accepted == 3 else wire.ROLE_TARGET)
                    seen_bonus |= last == wire.ROLE_BONUS
                    seen_target |= last == wire.ROLE_TARGET
            if record.stream not in first_step:
                # The first step after prefill has no drafts.
                assert record.drafts_scheduled == 0
                first_step[record.stream] = True
    assert seen_bonus and seen_target and seen_plain_later


def test_one_record_per_request_per_step_and_contiguous_offsets() -> None:
    engine, capture = make_engine()
    for stream in range(4):
        engine.add(make_request(engine, stream=stream, max_tokens=33, seed=stream))
    run_to_end(engine)
    ends = [0] * 4
    for _step, records in capture.provenance:
        streams = [r.stream for r in records]
        assert len(streams) == len(set(streams))
        for record in records:
            assert record.offset == ends[record.stream]
            ends[record.stream] += len(record.token_ids)
    assert ends == [33] * 4
    assert [step for step, _ in capture.provenance] == sorted({s for s, _ in capture.provenance})


def test_max_tokens_trims_the_last_step_and_finishes_with_length() -> None:
    engine, capture = make_engine(SimConfig(draft_len=8, no_draft_rate=0.0))
    request = make_request(engine, max_tokens=5, acceptance=1.0)
    engine.add(request)
    run_to_end(engine)
    records = [r for _, rs in capture.provenance for r in rs]
    # Step 1: one plain token; step 2 would be 9 tokens, cut to the 4 that remain.
    assert [len(r.token_ids) for r in records] == [1, 4]
    last = records[-1]
    assert last.trimmed and last.finished and last.finish_reason == wire.FINISH_LENGTH
    assert last.roles == [wire.ROLE_ACCEPTED] * 4
    text = [r for _, rs in capture.text for r in rs][-1]
    assert text.finished and text.finish_reason == wire.FINISH_LENGTH
    assert not text.text_truncated
    assert drain_collector(request.collector)[2] == "length"


def test_text_records_carry_the_detokenizer_fragments_and_the_http_delta() -> None:
    engine, capture = make_engine()
    request = make_request(engine, max_tokens=120)
    engine.add(request)
    run_to_end(engine)
    text_records = [r for _, rs in capture.text for r in rs]
    provenance = [r for _, rs in capture.provenance for r in rs]
    assert [t.token_id for r in text_records for t in r.tokens] == [
        token for r in provenance for token in r.token_ids
    ]
    fragments = b"".join(t.fragment for r in text_records for t in r.tokens)
    http = b"".join(r.http_delta for r in text_records)
    assert fragments == http
    text, ids, _finish = drain_collector(request.collector)
    assert text.encode() == http
    assert ids == [token for r in provenance for token in r.token_ids]


def test_text_and_ids_are_deterministic_for_a_seed() -> None:
    def generate(seed: int) -> tuple[str, list[int], list[list[int]]]:
        engine, capture = make_engine()
        request = make_request(engine, max_tokens=80, seed=seed)
        engine.add(request)
        run_to_end(engine)
        text, ids, _ = drain_collector(request.collector)
        roles = [r.roles for _, rs in capture.provenance for r in rs]
        return text, ids, roles

    assert generate(7) == generate(7)
    assert generate(7)[1] != generate(8)[1]


def test_request_seed_differs_per_stream_and_prompt() -> None:
    assert request_seed(0, 1, "p") == request_seed(0, 1, "p")
    assert len({request_seed(0, s, "p") for s in range(16)}) == 16
    assert request_seed(0, 1, "p") != request_seed(0, 1, "q")


def test_default_acceptance_spreads_over_streams() -> None:
    rates = [acceptance_for_stream(None, s) for s in range(16)]
    assert all(0.35 <= r <= 0.95 for r in rates)
    assert len({round(r, 3) for r in rates}) == 16
    assert acceptance_for_stream([0.1, 0.9], 3) == 0.9
    assert acceptance_for_stream(0.5, 9) == 0.5


def test_zero_draft_length_emits_plain_tokens_only() -> None:
    engine, capture = make_engine(SimConfig(draft_len=0))
    engine.add(make_request(engine, max_tokens=10))
    run_to_end(engine)
    records = [r for _, rs in capture.provenance for r in rs]
    assert len(records) == 10
    assert all(r.roles == [wire.ROLE_PLAIN] and r.drafts_scheduled == 0 for r in records)


def test_metrics_count_drafts_and_accepted_tokens_per_position() -> None:
    engine, capture = make_engine(SimConfig(draft_len=4))
    for stream in range(3):
        engine.add(make_request(engine, stream=stream, max_tokens=300, seed=stream))
    run_to_end(engine)
    records = [r for _, rs in capture.provenance for r in rs]
    metrics = engine.metrics
    drafted = [r for r in records if r.drafts_scheduled]
    assert metrics.drafts == len(drafted)
    assert metrics.draft_tokens == 4 * len(drafted)
    accepted = [r.roles.count(wire.ROLE_ACCEPTED) for r in drafted]
    # A trimmed last step loses its tail: count from untrimmed records, as the scheduler did.
    assert metrics.accepted_tokens >= sum(accepted)
    assert metrics.accepted_per_position[0] >= metrics.accepted_per_position[3]
    assert metrics.generation_tokens == 900
    assert sum(metrics.accepted_per_position) == metrics.accepted_tokens


# ------------------------------------------------------------------ stop strings


def first_text(engine: Engine, tokens: int, seed: int = 1) -> str:
    probe, _ = make_engine()
    request = make_request(probe, max_tokens=tokens, seed=seed)
    probe.add(request)
    run_to_end(probe)
    return drain_collector(request.collector)[0]


def test_stop_string_ends_text_before_it_and_trims_surplus_tokens() -> None:
    full = first_text(make_engine()[0], 200)
    stop = full[40:43]
    index = full.index(stop)
    engine, capture = make_engine()
    request = make_request(engine, max_tokens=200, stop=(stop,))
    engine.add(request)
    run_to_end(engine)
    text, ids, finish = drain_collector(request.collector)
    assert finish == "stop"
    assert request.collector.stop_reason == stop
    assert text == full[:index]
    text_records = [r for _, rs in capture.text for r in rs]
    last = text_records[-1]
    assert last.finished and last.text_truncated and last.finish_reason == wire.FINISH_STOP
    kept_tokens = [t for r in text_records for t in r.tokens]
    assert ids == [t.token_id for t in kept_tokens]
    # The last kept token is the one that completed the stop string.
    with_last = b"".join(t.fragment for t in kept_tokens).decode()
    without_last = b"".join(t.fragment for t in kept_tokens[:-1]).decode()
    assert len(without_last) < index + len(stop) <= len(with_last)
    assert with_last.startswith(full[:index] + stop)
    assert last.tokens_trimmed == (last.trimmed_tokens > 0)
    # The scheduler emitted the trimmed tokens and then one more step before the abort.
    provenance = [r for _, rs in capture.provenance for r in rs]
    scheduled = sum(len(r.token_ids) for r in provenance)
    stop_step_end = last.offset + len(last.tokens) + last.trimmed_tokens
    assert any(r.offset == stop_step_end for r in provenance)
    assert scheduled > stop_step_end


def test_stop_strings_hold_back_the_last_characters_until_finished() -> None:
    engine, capture = make_engine()
    request = make_request(engine, max_tokens=60, stop=("\u0000never", "zz"))
    engine.add(request)
    sent = 0
    full = first_text(make_engine()[0], 60)
    while engine.active:
        engine.step()
        text, _, finish = drain_collector(request.collector)
        sent += len(text)
        if finish is None:
            produced = len(request.output_text)
            assert sent == max(0, produced - 5)  # max(len(stop)) - 1 characters held back
    assert sent == len(full)
    assert [r for _, rs in capture.text for r in rs][-1].finish_reason == wire.FINISH_LENGTH


# --------------------------------------------------------------------- collector


def test_collector_merges_outputs_while_the_consumer_lags() -> None:
    engine, _ = make_engine()
    request = make_request(engine, max_tokens=50)
    engine.add(request)
    texts: list[str] = []
    ids: list[int] = []
    for _ in range(3):
        engine.step()
    text, token_ids, finish, steps = request.collector.take()
    assert steps == 3
    texts.append(text)
    ids.extend(token_ids)
    run_to_end(engine)
    text, token_ids, finish, steps = request.collector.take()
    texts.append(text)
    ids.extend(token_ids)
    assert finish == "length"
    assert len(ids) == 50
    assert "".join(texts) == first_text(make_engine()[0], 50)


def test_collector_writes_directly_until_the_writer_reports_a_backlog() -> None:
    async def scenario() -> tuple[list[tuple[str, list[int]]], int, bool]:
        engine, _ = make_engine()
        request = make_request(engine, max_tokens=50)
        engine.add(request)
        written: list[tuple[str, list[int]]] = []

        def direct(text: str, token_ids: list[int], finish: str | None) -> bool:
            written.append((text, token_ids))
            return len(written) < 2  # the second write fills the connection

        request.collector.direct = direct
        for _ in range(5):
            engine.step()
        return written, request.collector.steps, request.collector.event.is_set()

    written, merged_steps, woken = asyncio.run(scenario())
    assert len(written) == 2
    assert merged_steps == 3  # steps 3..5 wait, merged, for the writer task
    assert woken


def test_fault_config_parse_and_errors() -> None:
    config = FaultConfig.parse("drop:0.5, sse-byte, delay:20, max-per-fault:1")
    assert (config.drop, config.sse_byte, config.delay_ms, config.max_per_fault) == (
        0.5,
        True,
        20.0,
        1,
    )
    assert config.datagram_faults
    assert not FaultConfig.parse("reasoning").datagram_faults
    with pytest.raises(ValueError, match=r"^unknown fault 'bogus': choose from "):
        FaultConfig.parse("bogus")
    with pytest.raises(ValueError) as error:
        FaultConfig.parse("drop:x")
    assert str(error.value) == "fault drop needs a number, got 'x'"
    with pytest.raises(ValueError) as error:
        FaultConfig.parse("drop:2")
    assert str(error.value) == "fault drop must be a probability in 0..1, got 2.0"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"draft_len": 17}, "draft length must be 0..16, got 17"),
        ({"acceptance": 1.5}, "acceptance must be in 0..1, got 1.5"),
        ({"acceptance": []}, "acceptance list is empty: give at least one rate in 0..1"),
        ({"step_ms": -1.0}, "step time must be 0..10000 ms, got -1.0"),
        ({"port": 70000}, "port must be 0..65535, got 70000"),
    ],
)
def test_sim_config_validation_messages(kwargs: dict[str, object], message: str) -> None:
    config = SimConfig(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError) as error:
        config.validate()
    assert str(error.value) == message


def test_sse_interval_merges_the_steps_between_chunks() -> None:
    async def scenario() -> list[tuple[str, list[int], str | None]]:
        engine, _ = make_engine()
        request = make_request(engine, max_tokens=50)
        engine.add(request)
        written: list[tuple[str, list[int], str | None]] = []

        def direct(text: str, token_ids: list[int], finish: str | None) -> bool:
            written.append((text, token_ids, finish))
            return True

        request.collector.direct = direct
        request.collector.interval = 3600.0  # nothing but the finish may end the wait
        run_to_end(engine)
        return written

    written = asyncio.run(scenario())
    # The first step goes out at once; every later step is merged into the final chunk.
    assert len(written) == 2
    assert len(written[0][1]) == 1
    assert written[1][2] == "length"
    assert len(written[0][1]) + len(written[1][1]) == 50
    assert written[0][0] + written[1][0] == first_text(make_engine()[0], 50)


def test_finished_requests_are_counted_once_whatever_the_reason() -> None:
    engine, _ = make_engine()
    full = first_text(make_engine()[0], 100)
    engine.add(make_request(engine, stream=0, max_tokens=100, stop=(full[30:33],)))
    engine.add(make_request(engine, stream=1, max_tokens=7, seed=5))
    run_to_end(engine)
    assert engine.metrics.requests_finished == 2
