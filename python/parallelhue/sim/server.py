"""SimServer: the simulated engine behind an OpenAI-compatible streaming API."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import resource
import secrets
import socket
import time
from typing import Any

import parallelhue_vllm
from parallelhue_vllm import inband, paths, route, wire
from parallelhue_vllm.destination import Destination
from parallelhue_vllm.emitter import Emitter
from parallelhue_vllm.hub import Claim, Hub, HubError, HubFull

from .config import SimConfig, acceptance_for_stream
from .engine import ContentFaultHook, Engine, SimRequest, request_seed
from .faults import ContentFaults, FaultProxy, send_as_other_uid
from .http import HttpError, HttpRequest, HttpResponder, serve_connection
from .metrics import SimMetrics
from .params import Params, json_dumps, parse_params
from .stock import LlamaStream, vllm_metrics
from .stream_faults import StreamFaults
from .vocab import Vocabulary, build_vocabulary

__all__ = ["ENGINE_VERSION", "OWNED_BY", "SimServer"]

log = logging.getLogger("parallelhue.sim")

ENGINE_VERSION = "sim-1"
OWNED_BY = "parallelhue-simulated"
SPEC_METHOD = "simulated"
# Bytes waiting in a connection's write buffer beyond which outputs are merged
# (the consumer lags), as vLLM's collector merges when its consumer is slow.
BACKLOG_BYTES = 16_384
# A run without requests for this long is ended in the emitters (sockets closed).
RUN_IDLE_SECONDS = 30.0

_VOCAB: Vocabulary | None = None


def shared_vocabulary() -> Vocabulary:
    """Built once per process (a few milliseconds), shared by every server."""
    global _VOCAB
    if _VOCAB is None:
        _VOCAB = build_vocabulary()
    return _VOCAB


class SimServer:
    """The embedded simulated engine. `url = await start()`, then `await stop()`.

    Runs in the caller's event loop: the scheduler is one task (a few
    microseconds per request per step, plus one SSE chunk written per stream);
    telemetry is encoded and sent by the emitters' own threads.
    """

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self.config.validate()
        self.metrics = SimMetrics(self.config.model, self.config.draft_len)
        self.vocab = shared_vocabulary()
        self.scheduler_emitter: Emitter | None = None
        self.frontend_emitter: Emitter | None = None
        self.fault_proxy: FaultProxy | None = None
        self.content_faults: ContentFaults | None = None
        self.other_uid_results: dict[str, str] = {}
        # The hub of in-band telemetry (--telemetry http|both): the plugin's own code.
        self.hub: Hub | None = None
        # (run, stream) -> the request that has it: a second one gets no telemetry,
        # as the plugin's hooks refuse it.
        self._owners: dict[tuple[str, int], str] = {}
        self._api_key_hashes = [hashlib.sha256(k.encode()).digest() for k in self.config.api_keys]
        self._runs: set[str] = set()
        self._run_requests: dict[str, int] = {}  # requests in flight per run
        self._server: asyncio.Server | None = None
        self._engine_task: asyncio.Task[None] | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._created = int(time.time())
        self.engine = self._build_engine()
        self.url = ""

    # --------------------------------------------------------------- lifecycle
    def _build_engine(self) -> Engine:
        config = self.config
        faults = config.faults
        hook: ContentFaultHook | None = None
        if faults is not None:
            self.content_faults = ContentFaults(faults)
            hook = self.content_faults
        provenance_sink = None
        text_sink = None
        if config.telemetry:
            emitter_dir = config.socket_dir
            if faults is not None and faults.datagram_faults:
                self.fault_proxy = FaultProxy(faults, config.socket_dir or _default_dir())
                emitter_dir = self.fault_proxy.proxy_dir
            if config.telemetry_mode != "socket":
                # Its own scope: several simulated engines in one process never mix.
                self.hub = Hub(secrets.token_hex(8), base=config.hub_dir, limits=config.hub_limits)
            destination = Destination(
                emitter_dir,
                config.send_timeout,
                client_sockets=config.telemetry_mode != "http",
                hub_dir=self.hub.dir if self.hub is not None else None,
                use_env_scope=False,
            )
            scheduler_destination = destination
            if config.remote_engine_hub_dir is not None:
                scheduler_destination = Destination(
                    None,
                    config.send_timeout,
                    client_sockets=False,
                    hub_dir=config.remote_engine_hub_dir,
                    use_env_scope=False,
                )
            self.scheduler_emitter = self._emitter(
                wire.SOURCE_SCHEDULER, emitter_dir, scheduler_destination
            )
            self.frontend_emitter = self._emitter(wire.SOURCE_FRONTEND, emitter_dir, destination)
            scheduler_submit = self.scheduler_emitter.submit
            frontend_submit = self.frontend_emitter.submit

            def provenance_sink(run_id: str, step: int, records: list[wire.Record]) -> None:
                scheduler_submit(run_id, wire.KIND_PROVENANCE, step, records)

            def text_sink(run_id: str, step: int, records: list[wire.Record]) -> None:
                frontend_submit(run_id, wire.KIND_TEXT, step, records)

        return Engine(
            config,
            self.vocab,
            self.metrics,
            provenance_sink=provenance_sink,
            text_sink=text_sink,
            content_faults=hook,
        )

    def _emitter(self, role: int, socket_dir: str | None, destination: Destination) -> Emitter:
        # Only the scheduler announces speculative decoding (protocol 2).
        draft_len = self.config.draft_len if role == wire.SOURCE_SCHEDULER else 0
        return Emitter(
            role=role,
            engine=wire.ENGINE_SIMULATED,
            engine_version=ENGINE_VERSION,
            plugin_version=parallelhue_vllm.__version__,
            spec_method=SPEC_METHOD if draft_len else "",
            num_speculative_tokens=draft_len,
            role_derivation=wire.DERIVATION_DRAFT_IDS if draft_len else wire.DERIVATION_NONE,
            async_scheduling=False,
            verification=wire.VERIFICATION_STANDARD if draft_len else wire.VERIFICATION_NONE,
            socket_dir=socket_dir,
            queue_size=self.config.emitter_queue_size,
            # The sender thread may wait for a busy receiver: the queue absorbs
            # bursts, the engine loop never waits.
            send_timeout=self.config.send_timeout,
            destination=destination,
        )

    async def start(self) -> str:
        """Listen and start the scheduler; returns the base URL."""
        config = self.config
        if self.hub is not None:
            try:
                self.hub.start()
            except HubError as error:
                raise OSError(str(error)) from None
        try:
            self._server = await asyncio.start_server(
                self._on_connection, config.host, config.port, reuse_address=True
            )
        except socket.gaierror as error:
            raise OSError(
                f"cannot resolve host {config.host} ({error.strerror}): check --host"
            ) from None
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise OSError(
                    f"port {config.port} on {config.host} is in use: choose another --port"
                ) from None
            raise OSError(
                f"cannot listen on {config.host}:{config.port} ({error.strerror}): "
                "check --host and --port"
            ) from None
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://{config.host}:{port}"
        self._engine_task = asyncio.create_task(self.engine.run(), name="phsim-engine")
        log.info(
            "SIMULATED engine listening on %s (draft_len=%d, step_ms=%s, telemetry=%s)",
            self.url,
            config.draft_len,
            config.step_ms,
            config.telemetry_mode if config.telemetry else "off",
        )
        return self.url

    async def stop(self) -> None:
        """Stop listening, end open streams, flush telemetry."""
        self.engine.stop()
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._engine_task is not None:
            await asyncio.gather(self._engine_task, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        loop = asyncio.get_running_loop()
        for emitter in (self.scheduler_emitter, self.frontend_emitter):
            if emitter is not None:
                await loop.run_in_executor(None, emitter.close, 1.0)
        if self.fault_proxy is not None:
            await loop.run_in_executor(None, self.fault_proxy.close)
        if self.hub is not None:
            await loop.run_in_executor(None, self.hub.close)

    def telemetry_stats(self) -> dict[str, dict[str, int]]:
        """Emitter counters per source, and the fault proxy's when there is one."""
        result: dict[str, dict[str, int]] = {}
        if self.scheduler_emitter is not None:
            result["scheduler"] = self.scheduler_emitter.stats()
        if self.frontend_emitter is not None:
            result["frontend"] = self.frontend_emitter.stats()
        if self.fault_proxy is not None:
            result["faults"] = dict(self.fault_proxy.stats)
        if self.hub is not None:
            result["hub"] = self.hub.stats()
        return result

    def stats(self) -> dict[str, object]:
        """Engine-side figures (GET /sim/stats): steps, step records, telemetry, CPU."""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "simulated": True,
            "steps": self.engine.step_count,
            "step_records": self.engine.step_records,
            "active_seconds": self.engine.active_seconds,
            "full_batch_seconds": self.engine.full_batch_seconds,
            "full_batch_steps": self.engine.full_batch_steps,
            "full_batch_records": self.engine.full_batch_records,
            "active_requests": len(self.engine.active),
            "generation_tokens": self.metrics.generation_tokens,
            "telemetry": self.telemetry_stats(),
            "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "peak_rss_kib": usage.ru_maxrss,
        }

    # ------------------------------------------------------------------- HTTP
    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await serve_connection(reader, writer, self._route)
        except asyncio.CancelledError:
            pass
        finally:
            self._connections.discard(task)

    async def _route(self, request: HttpRequest, responder: HttpResponder) -> None:
        path = request.path.rstrip("/") or "/"
        routes: dict[str, tuple[str, ...]] = {
            "/v1/models": ("GET",),
            "/health": ("GET",),
            "/metrics": ("GET",),
            "/v1/chat/completions": ("POST",),
            "/v1/completions": ("POST",),
            "/sim/stats": ("GET",),
        }
        if self.config.stock is None:  # a stock server has no plugin, so no probe route
            routes[route.PROBE_PATH] = ("GET", "HEAD")
        if path.startswith("/v1") and request.method != "OPTIONS" and not self._authorized(request):
            # vLLM's --api-key middleware answers exactly this.
            await responder.send(401, b'{"error":"Unauthorized"}')
            return
        methods = routes.get(path)
        if methods is None:
            raise HttpError(
                404, f"no route {request.path}: the simulated engine serves {', '.join(routes)}"
            )
        if request.method not in methods:
            raise HttpError(
                405, f"{request.path} takes {' or '.join(methods)}, not {request.method}"
            )
        if path == "/health":
            await responder.send(200, b"", "text/plain")
        elif path == "/metrics" and self.config.stock == "llamacpp":
            # llama-server without --metrics.
            raise HttpError(501, "This server does not support metrics endpoint.")
        elif path == "/metrics":
            body = self.metrics.render().encode()
            await responder.send(200, body, "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/sim/stats":
            await responder.send(200, json_dumps(self.stats()).encode())
        elif path == "/v1/models":
            await responder.send(200, self._models_body())
        elif path == route.PROBE_PATH:
            probe = route.probe(self.hub, engine="simulated", off_reason=self._telemetry_off())
            await responder.send(200, json_dumps(probe).encode(), head=request.method == "HEAD")
        else:
            await self._generate(request, responder, chat=path == "/v1/chat/completions")

    def _authorized(self, request: HttpRequest) -> bool:
        if not self._api_key_hashes:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(token.encode()).digest()
        matched = False
        for expected in self._api_key_hashes:
            matched |= secrets.compare_digest(digest, expected)
        return matched

    def _telemetry_off(self) -> str:
        if not self.config.telemetry:
            return "exact telemetry is off on this server (started with --no-telemetry)"
        return (
            "in-band telemetry is off on this server: start the SIMULATED engine with "
            "--telemetry http or both"
        )

    def _models_body(self) -> bytes:
        model = {
            "id": self.config.model,
            "object": "model",
            "created": self._created,
            "owned_by": OWNED_BY,
            "root": self.config.model,
            "parent": None,
            "max_model_len": self.config.max_model_len,
        }
        return json_dumps({"object": "list", "data": [model]}).encode()

    def _new_request(self, params: Params) -> SimRequest:
        external_id = ("chatcmpl-" if params.chat else "cmpl-") + params.base_id
        internal_id = f"{external_id}-{secrets.token_hex(4)}"
        parsed = wire.parse_request_id(internal_id)
        run_id: str | None = None
        stream = 0
        if parsed is not None:
            run_id, stream = parsed
            if self.config.telemetry:
                self._ensure_run(run_id)
            else:
                run_id = None
        seed = request_seed(params.seed, stream, params.prompt)
        prompt_tokens = len(params.prompt.encode("utf-8"))
        if prompt_tokens + params.max_tokens > self.config.max_model_len:
            raise HttpError(
                400,
                f"prompt ({prompt_tokens} tokens) plus max_tokens ({params.max_tokens}) "
                f"exceeds the model length {self.config.max_model_len}",
            )
        if self.config.stock == "llamacpp" and params.stop:
            raise HttpError(400, "stop strings are not simulated with --stock llamacpp")
        request = SimRequest(
            internal_id=internal_id,
            external_id=external_id,
            run_id=run_id,
            stream=stream,
            start_position=self.engine.start_position(seed),
            seed=seed,
            acceptance=acceptance_for_stream(self.config.acceptance, stream),
            max_tokens=params.max_tokens,
            stop=params.stop,
            num_prompt_tokens=prompt_tokens,
        )
        if self.config.stock == "llamacpp":
            request.token_texts = []
        faults = self.config.faults
        if faults is not None and faults.merge > 1 and stream == faults.target_stream:
            request.collector.merge_every = faults.merge
        return request

    def _ensure_run(self, run_id: str) -> None:
        if run_id in self._runs:
            return
        self._runs.add(run_id)
        if self.fault_proxy is not None:
            self.fault_proxy.add_run(run_id)
        faults = self.config.faults
        if faults is not None and faults.other_uid:
            self.other_uid_results[run_id] = self._forge_other_uid(run_id)

    def _forge_other_uid(self, run_id: str) -> str:
        """Send a forged provenance frame for stream 0 as uid 65534.

        If a receiver accepted it, stream 0 would fail (a second scheduler
        source); a receiver that checks credentials drops it.
        """
        try:
            target = paths.socket_path(self.config.socket_dir or _default_dir(), run_id)
        except paths.SocketPathError as error:
            return f"error: {error}"
        header = wire.Header(
            bytes.fromhex(run_id), 0x0BAD_0BAD_0BAD_0BAD, 0, 0, time.monotonic_ns()
        )
        hello = wire.Hello(
            wire.SOURCE_SCHEDULER,
            wire.ENGINE_SIMULATED,
            wire.DERIVATION_NONE,
            False,
            0,
            "x",
            "x",
            "",
            wire.VERIFICATION_NONE,
        )
        record = wire.ProvenanceRecord(0, 0, [1], [wire.ROLE_PLAIN], 0)
        data_header = wire.Header(header.run_id, header.source_id, 1, 1, header.timestamp_ns)
        frames = [
            wire.encode_hello(header, hello),
            wire.encode_records(wire.KIND_PROVENANCE, data_header, [record]),
        ]
        result = send_as_other_uid(target, frames)
        log.info("SIMULATED fault other-uid: %s", result)
        return result

    async def _generate(self, request: HttpRequest, responder: HttpResponder, chat: bool) -> None:
        params = parse_params(request, chat, self.config)
        sim_request = self._new_request(params)
        if self.config.log_requests:
            log.info("SIMULATED request %s", sim_request.internal_id)
        run_id = sim_request.run_id
        owner = self._own(sim_request)
        claim = self._claim(request, params, sim_request) if owner is not None else None
        self.engine.add(sim_request)
        if run_id is not None:
            self._run_requests[run_id] = self._run_requests.get(run_id, 0) + 1
        try:
            if params.stream:
                await self._stream(params, sim_request, responder, claim)
            else:
                await self._complete(params, sim_request, responder)
        except (ConnectionError, asyncio.CancelledError):
            self.engine.abort(sim_request)
            raise
        finally:
            if claim is not None:
                claim.close()
            if owner is not None and self._owners.get(owner) == sim_request.internal_id:
                del self._owners[owner]
            if run_id is not None:
                self._request_done(run_id)

    def _own(self, request: SimRequest) -> tuple[str, int] | None:
        """Take (run, stream) for the request, as the plugin's hooks do (None: not
        ours, or another live request has it: it gets no telemetry)."""
        if request.run_id is None or self.hub is None:
            return None
        key = (request.run_id, request.stream)
        if key in self._owners:
            log.warning(
                "SIMULATED: two requests claim stream %d of run %s; the later one gets no "
                "telemetry",
                request.stream,
                request.run_id,
            )
            request.run_id = None
            return None
        self._owners[key] = request.internal_id
        for emitter in (self.scheduler_emitter, self.frontend_emitter):
            if emitter is not None:
                emitter.begin_request(request.run_id, request.stream, request.internal_id)
        return key

    def _claim(self, request: HttpRequest, params: Params, sim_request: SimRequest) -> Claim | None:
        """The request's in-band claim, when it asked and streams (the plugin's
        middleware, endpoint.py, does the same in vLLM)."""
        asked = request.headers.get(inband.HEADER.lower())
        if asked is None or self.hub is None or not params.stream:
            return None
        if asked.strip() != str(inband.STREAM_VERSION):
            log.warning("SIMULATED: in-band telemetry version %r is not served", asked)
            return None
        try:
            claim = self.hub.claim()
        except HubFull as error:
            log.warning("SIMULATED: request served without telemetry: %s", error)
            return None
        claim.bind(sim_request.internal_id)
        return claim

    def _request_done(self, run_id: str) -> None:
        left = self._run_requests[run_id] - 1
        self._run_requests[run_id] = left
        if left == 0:
            asyncio.get_running_loop().call_later(RUN_IDLE_SECONDS, self._end_idle_run, run_id)

    def _end_idle_run(self, run_id: str) -> None:
        """Forget a run nobody used for RUN_IDLE_SECONDS (its sockets are closed)."""
        if self._run_requests.get(run_id) != 0:
            return
        del self._run_requests[run_id]
        self._runs.discard(run_id)
        for emitter in (self.scheduler_emitter, self.frontend_emitter):
            if emitter is not None:
                emitter.end_run(run_id)

    async def _stream(
        self,
        params: Params,
        request: SimRequest,
        responder: HttpResponder,
        claim: Claim | None = None,
    ) -> None:
        if self.config.stock == "llamacpp":
            await self._stream_llama(params, request, responder)
            return
        chat = params.chat
        model = self.config.model
        created = self._created
        external_id = request.external_id
        object_name = "chat.completion.chunk" if chat else "text_completion"
        head = (
            f'{{"id":"{external_id}","object":"{object_name}",'
            f'"created":{created},"model":"{model}","choices":[{{"index":0,'
        )
        return_ids = params.return_token_ids
        prompt_ids = self.vocab.encode_bytes(params.prompt.encode("utf-8"))
        prompt_ids_json = ",".join(map(str, prompt_ids))
        extra = [(inband.HEADER, str(inband.STREAM_VERSION))] if claim is not None else []
        await responder.start_stream(
            "text/event-stream", chunked=responder.keep_alive, extra_headers=extra
        )
        pump = (
            asyncio.create_task(self._inband_pump(claim, responder)) if claim is not None else None
        )
        if chat:
            first = (
                head + '"delta":{"role":"assistant","content":""},"logprobs":null,'
                '"finish_reason":null}]'
            )
            if return_ids:
                first += f',"prompt_token_ids":[{prompt_ids_json}]'
            responder.write(f"data: {first}}}\n\n".encode())
        collector = request.collector
        faults = self.content_faults
        completion_tokens = 0
        first_chunk = True
        write = responder.write
        transport = responder.writer.transport

        def format_chunk(text: str, token_ids: list[int], finish_reason: str | None) -> bytes:
            nonlocal completion_tokens, first_chunk
            completion_tokens += len(token_ids)
            reasoning = ""
            if faults is not None:
                text, token_ids, reasoning = faults.sse(request, text, token_ids)
            finish_json = "null" if finish_reason is None else f'"{finish_reason}"'
            stop_json = "null"
            if finish_reason is not None and collector.stop_reason is not None:
                stop_json = json_dumps(collector.stop_reason)
            text_json = json_dumps(text)
            if chat:
                delta = f'"delta":{{"content":{text_json}'
                if reasoning:
                    delta += f',"reasoning_content":{json_dumps(reasoning)}'
                chunk = (
                    f'{head}{delta}}},"logprobs":null,"finish_reason":{finish_json},'
                    f'"stop_reason":{stop_json}'
                )
            else:
                chunk = (
                    f'{head}"text":{text_json},"logprobs":null,"finish_reason":{finish_json},'
                    f'"stop_reason":{stop_json}'
                )
                if return_ids and first_chunk:
                    chunk += f',"prompt_token_ids":[{prompt_ids_json}]'
            if return_ids:
                chunk += f',"token_ids":[{",".join(map(str, token_ids))}]'
            first_chunk = False
            return f"data: {chunk}}}]}}\n\n".encode()

        def direct(text: str, token_ids: list[int], finish_reason: str | None) -> bool:
            # Called from the engine step: never raise into it.
            try:
                if transport.is_closing():
                    return False
                write(format_chunk(text, token_ids, finish_reason))
                return transport.get_write_buffer_size() < BACKLOG_BYTES
            except Exception:
                return False

        collector.direct = direct
        collector.interval = self.config.sse_interval_ms / 1000.0
        try:
            while True:
                await collector.event.wait()
                collector.event.clear()
                if collector.pending:
                    text, token_ids, finish_reason, _steps = collector.take()
                    write(format_chunk(text, token_ids, finish_reason))
                if collector.finish_reason is not None:
                    break
                # The connection lags (or closed): merge outputs until it drained.
                await responder.writer.drain()
                if transport.is_closing():
                    raise ConnectionResetError("client closed the stream")
                if collector.pending:
                    text, token_ids, finish_reason, _steps = collector.take()
                    write(format_chunk(text, token_ids, finish_reason))
                    if finish_reason is not None:
                        break
                collector.direct = direct
        finally:
            collector.direct = None
            collector.cancel_flush()
            if pump is not None:
                pump.cancel()
        if params.include_usage:
            write(self._usage_event(request, object_name, len(prompt_ids), completion_tokens))
        if claim is not None:
            # The frames of the final step, then the end item (bounded wait).
            write(await claim.finish())
        write(b"data: [DONE]\n\n")
        await responder.end_stream()

    def _usage_event(
        self, request: SimRequest, object_name: str, prompt_tokens: int, completion_tokens: int
    ) -> bytes:
        """The usage chunk after the last choice chunk (vLLM's metrics when playing stock vLLM)."""
        external_id = request.external_id
        created = self._created
        model = self.config.model
        metrics = ""
        if self.config.stock == "vllm":
            metrics = vllm_metrics(request, self.config.draft_len, self.config.faults)
        usage = (
            f'{{"id":"{external_id}","object":"{object_name}","created":{created},'
            f'"model":"{model}","choices":[],"usage":{{"prompt_tokens":{prompt_tokens},'
            f'"total_tokens":{prompt_tokens + completion_tokens},'
            f'"completion_tokens":{completion_tokens}}}{metrics}}}'
        )
        return f"data: {usage}\n\n".encode()

    async def _stream_llama(
        self, params: Params, request: SimRequest, responder: HttpResponder
    ) -> None:
        """llama-server's stream (--stock llamacpp, stock.py): a chunk per token."""
        stream = LlamaStream(
            request,
            chat=params.chat,
            model=self.config.model,
            created=self._created,
            prompt_tokens=len(params.prompt.encode("utf-8")),
            include_usage=params.include_usage,
            timings=params.timings_per_token,
            faults=self.config.faults,
        )
        await responder.start_stream("text/event-stream", chunked=responder.keep_alive)
        collector = request.collector
        collector.direct = None  # every step wakes this task, which writes per token
        write = responder.write
        while True:
            await collector.event.wait()
            collector.take()
            stream.chunks(write)
            await responder.writer.drain()
            if responder.writer.transport.is_closing():
                raise ConnectionResetError("client closed the stream")
            if collector.finish_reason is not None:
                break
        write(stream.final(collector.finish_reason))
        await responder.end_stream()

    async def _inband_pump(self, claim: Claim, responder: HttpResponder) -> None:
        """The claim's frames as events, between the engine's chunks (each write is
        whole events, so they never land inside one)."""
        faults = self.config.faults
        stream_faults = (
            StreamFaults(faults) if faults is not None and faults.stream_faults else None
        )
        transport = responder.writer.transport
        while not claim.closed:
            await claim.news()
            events = claim.take()
            if events and not transport.is_closing():
                responder.write(events)
            if stream_faults is not None and stream_faults.apply(claim) == "close":
                transport.abort()  # lost: no end item, no last chunk
                return

    async def _complete(
        self, params: Params, request: SimRequest, responder: HttpResponder
    ) -> None:
        collector = request.collector
        texts: list[str] = []
        token_ids: list[int] = []
        while True:
            await collector.event.wait()
            text, ids, finish_reason, _steps = collector.take()
            texts.append(text)
            token_ids.extend(ids)
            if finish_reason is not None:
                break
        text = "".join(texts)
        prompt_ids = self.vocab.encode_bytes(params.prompt.encode("utf-8"))
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        choice["stop_reason"] = collector.stop_reason
        if params.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if params.return_token_ids:
            choice["token_ids"] = token_ids
            if not params.chat:
                choice["prompt_token_ids"] = prompt_ids
        body: dict[str, Any] = {
            "id": request.external_id,
            "object": "chat.completion" if params.chat else "text_completion",
            "created": self._created,
            "model": self.config.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "total_tokens": len(prompt_ids) + len(token_ids),
                "completion_tokens": len(token_ids),
            },
        }
        if params.chat and params.return_token_ids:
            body["prompt_token_ids"] = prompt_ids
        await responder.send(200, json_dumps(body).encode())


def _default_dir() -> str:
    return os.path.abspath(paths.default_socket_dir())
