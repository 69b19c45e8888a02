"""`Session(shapes=...)`: one run whose requests each have their own path and body
fields (what tests/vllm/driver.py drives the real client with), on both paths."""

from __future__ import annotations

import asyncio

import pytest

from parallelhue.cli.config import parse_run
from parallelhue.headless import HeadlessView
from parallelhue.session import RequestShape, Session, SessionResult
from parallelhue.sim import SimConfig, SimServer

SHAPES = [
    RequestShape("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}],
                                          "max_tokens": 5}),
    RequestShape("/v1/completions", {"prompt": "b", "max_tokens": 9}),
    RequestShape("/v1/elsewhere", {"prompt": "c", "max_tokens": 7}),
]  # fmt: skip


def run_shapes(reconciler: str, shapes: list[RequestShape], streams: int) -> SessionResult:
    async def go() -> SessionResult:
        server = SimServer(SimConfig(step_ms=1.0))
        url = await server.start()
        try:
            config = parse_run(
                ["--endpoint", url + "/v1/completions", "--concurrency", str(streams),
                 "--max-tokens", "64", "--mode", "auto", "--reconciler", reconciler,
                 "--view", "plain", "--", "run prompt"],
                env={}, stdout_tty=False,
            )  # fmt: skip
            session = Session(config, HeadlessView, simulated=True, shapes=shapes, grace=3.0)
            return await session.run()
        finally:
            await server.stop()

    return asyncio.run(go())


@pytest.mark.parametrize("reconciler", ["rust", "python"])
def test_each_request_goes_to_its_path_with_its_fields(reconciler: str) -> None:
    model = run_shapes(reconciler, SHAPES, 3).model
    first, second, third = model.streams
    # Its own max_tokens (not the run's 64), each exact on its own path.
    assert (first.verdict, first.sse_tokens, first.finish_reason) == ("exact", 5, "length")
    assert (second.verdict, second.sse_tokens, second.finish_reason) == ("exact", 9, "length")
    # Its own path: the simulated engine has no /v1/elsewhere.
    assert third.error is not None and "HTTP 404" in third.error, third.error
    assert third.sse_tokens == 0


def test_one_shape_per_request_or_a_clear_error() -> None:
    config = parse_run(["--concurrency", "2", "--", "x"], env={}, stdout_tty=False)
    with pytest.raises(ValueError) as error:
        Session(config, HeadlessView, shapes=SHAPES)
    assert str(error.value) == "3 request shapes for 2 requests"
