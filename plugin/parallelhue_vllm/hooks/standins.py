"""What the API-server hooks put in place of vLLM's values, on our requests' objects only.

A request's output queue (`_QueueCapture`: its put notes each output, then
calls vLLM's) and a fast detokenizer's decode stream (`_StreamRecorder`:
records each token's fragment); the C accelerator has one of each
(`CaptureState`, `StreamRecorder`). `_take_rows` takes a step's rows from the
noted outputs in one loop; `_uninstall` puts vLLM's own objects back.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from .. import wire
from .common import _Bucket, _speedups, log


class _FrontRequest:
    """A request of ours in the API server, and what the hooks put on its objects."""

    __slots__ = (
        "bucket",
        "capture",
        "detokenizer",
        "fragments",
        "pre_len",
        "queue",
        "recorder",
        "req_state",
        "run",
        "stream",
    )

    def __init__(self, run: str, stream: int, req_state: Any, bucket: _Bucket) -> None:
        self.run = run
        self.stream = stream
        self.req_state = req_state
        self.detokenizer: Any = req_state.detokenizer
        self.queue: Any = req_state.queue  # vLLM's own output queue, put back at the end
        self.bucket = bucket  # the run's rows, ids and fragments of this step
        self.fragments: list[str] = []  # what each token decoded to this step, in order
        # Tokens of this step before a stop-string trim (requests with stop strings
        # only, set at the start of process_outputs; -1: none).
        self.pre_len = -1
        self.recorder: Any = None  # our stand-in for the detokenizer's decode stream
        self.capture: Any = None  # our stand-in for the request's output queue


class _StreamRecorder:
    """Stands in for a fast detokenizer's `stream` (tokenizers.DecodeStream).

    vLLM's FastIncrementalDetokenizer.decode_next returns `stream.step(...) or ""`
    (when spaces_between_special_tokens holds): recording that here gives each
    token's string without touching the detokenizer object's attributes.

    `recover` (see _reset_stream) does vLLM's own recovery from the error after
    which vLLM would replace the stream with a new one: the recorder stays in
    place and keeps recording. After any other error the token is recorded as
    "" (what decode_next returns when vLLM survives the error) and the error
    goes on to vLLM unchanged.
    """

    __slots__ = ("_append", "_recover", "_step", "stream")

    def __init__(self, stream: Any, fragments: list[str], recover: Any = None) -> None:
        self.stream = stream
        self._step = stream.step
        self._append = fragments.append
        self._recover = recover

    def step(self, tokenizer: Any, token_id: int) -> Any:
        try:
            text = self._step(tokenizer, token_id)
        except Exception as error:
            stream: Any = None
            step: Any = None
            if self._recover is not None:
                try:
                    stream = self._recover(error)
                    step = stream.step if stream is not None else None
                except Exception:
                    step = None  # recover's own failure: as if it gave nothing
            if step is None:
                self._append("")
                raise
            self.stream, self._step = stream, step
            try:
                text = step(tokenizer, token_id)
            except Exception:
                self._append("")
                raise
        self._append(text or "")
        return text


def stream_recorder(detokenizer: Any, fragments: list[str]) -> Any:
    """The recorder (the C one when built) to put in place of a fast detokenizer's stream."""
    make = _speedups.StreamRecorder if _speedups is not None else _StreamRecorder
    recover = functools.partial(
        _reset_stream, getattr(detokenizer, "skip_special_tokens", True),
        getattr(detokenizer, "request_id", None),
    )  # fmt: skip
    return make(detokenizer.stream, fragments, recover)


# tokenizers' error after which vLLM's FastIncrementalDetokenizer starts a new
# DecodeStream (vLLM's INVALID_PREFIX_ERR_MSG, the same in 0.26 to 0.33).
_INVALID_PREFIX = "Invalid prefix encountered"


def _reset_stream(skip_special_tokens: Any, request_id: Any, error: BaseException) -> Any:
    """The new decode stream vLLM would make after `error`, or None (another error).

    vLLM 0.26-0.33 (`_protected_step`): a DecodeStream without the prompt, looked
    up on the module as vLLM does. Done by the recorder, vLLM would replace the
    recorder itself and the rest of the request's fragments would go unrecorded.
    """
    if not str(error).startswith(_INVALID_PREFIX):
        return None
    decoders = importlib.import_module("tokenizers.decoders")
    log.warning(
        "Encountered invalid prefix detokenization error for request %s, resetting decode "
        "stream (done by the ParallelHue recorder, as vLLM does).",
        request_id,
    )
    return decoders.DecodeStream(skip_special_tokens=skip_special_tokens)


class _QueueCapture:
    """Stands in for a request's output queue (RequestOutputCollector): notes each
    output (`put`) and keeps what the request's rows need.

    At the end of process_outputs, `_take_rows` takes the step's row from each
    noted RequestOutput vLLM handed to HTTP (the common row there, every other
    one through `special`), in one loop for the whole step.
    """

    __slots__ = (
        "_failed",
        "_fragments",
        "_fragments_extend",
        "_ids_extend",
        "_index",
        "_meta_extend",
        "_put",
        "_seen",
        "_special",
        "_stream",
        "_texts_append",
        "active",
        "offset",
        "pending_empty",
        "queue",
    )

    def __init__(
        self,
        queue: Any,
        fragments: list[str],
        bucket: _Bucket,
        stream: int,
        index: int,
        special: Any,
        failed: Any,
        seen: list[Any],
    ) -> None:
        self.queue = queue
        self._put = queue.put  # bound once, as the C version does
        self._seen = seen
        self._fragments = fragments
        self._meta_extend = bucket.meta.extend
        self._ids_extend = bucket.ids.extend
        self._texts_append = bucket.extra.append
        self._fragments_extend = bucket.fragments.extend
        self._stream = stream
        self._index = index
        self._special = special
        self._failed = failed
        self.offset = 0
        self.pending_empty = 0  # tokens that returned "" and no fragment has claimed yet
        self.active = True  # False once the request's telemetry ended (_uninstall)

    def put(self, output: Any) -> Any:
        """vLLM's queue.put: the output noted in the process's `seen` list (nothing
        else runs per output), then passed on to vLLM's queue. Nothing it adds can
        raise into vLLM: a failure goes to `failed`."""
        try:
            seen = self._seen
            seen.append(self)
            seen.append(output)
        except Exception as error:  # pragma: no cover - only MemoryError can get here
            self._failed(error)
        put = self._put
        return put(output)


def _take_rows(seen: list[Any]) -> None:
    """The rows of a step's noted (capture, output) pairs, in the order vLLM put the
    outputs (_speedups.take_rows does the same in C). `seen` is emptied first; a
    capture without its output (its put could not note it) or no longer active is
    skipped."""
    if type(seen) is not list:
        raise TypeError("take_rows(seen): a list")
    items = seen[:]
    seen.clear()
    at, end = 0, len(items)
    while at < end:
        capture = items[at]
        at += 1
        if not _is_capture(capture):
            continue
        if at >= end or _is_capture(items[at]):
            continue
        output = items[at]
        at += 1
        if capture.active:
            _take_row(capture, output)


def _take_row(capture: _QueueCapture, output: Any) -> None:
    """One noted output's row: the common row here, every other one through `special`."""
    try:
        completions = getattr(output, "outputs", None)
        if type(completions) is list and completions:
            completion = completions[0]
            token_ids = completion.token_ids
            fragments = capture._fragments
            count = len(token_ids)
            # The common row: not finished (only a finished step can have been
            # trimmed after a stop string), every token decoded to text.
            if (
                completion.finish_reason is None
                and completion.index == capture._index
                and 0 < count <= _MAX_TOKENS
                and len(fragments) == count
                and not capture.pending_empty
                and "" not in fragments
            ):
                text = completion.text
                capture._ids_extend(token_ids)  # a copy: outputs are merged later
                capture._fragments_extend(fragments)
                fragments.clear()
                capture._texts_append(text)
                capture._meta_extend((capture._stream, 0, 0, capture.offset, count, count, 0))
                capture.offset += count
            else:
                capture._special(token_ids, completion.finish_reason, completion.stop_reason,
                                 completion.text, completion.index)  # fmt: skip
    except Exception as error:
        capture._failed(error)


def _is_capture(item: Any) -> bool:
    return type(item) is _QueueCapture or (
        _speedups is not None and type(item) is _speedups.CaptureState
    )


def _capture_type() -> type:
    """The capture class for the implementation in use (the C one: its put in C)."""
    if _speedups is None:
        return _QueueCapture
    made: type = _speedups.CaptureState
    return made


_MAX_TOKENS = wire.MAX_TOKENS_PER_RECORD


def _record_decode_next(detokenizer: Any, fragments: list[str]) -> None:
    """For detokenizers without a decode stream: a per-instance decode_next (private dict)."""
    _own_dict(detokenizer)
    decode = detokenizer.decode_next
    append = fragments.append

    def decode_next(next_token_id: int) -> str:
        text: str = decode(next_token_id)
        append(text)
        return text

    detokenizer.decode_next = decode_next


def _own_dict(obj: Any) -> None:
    """Give a vLLM object a private attribute dict before the hooks add attributes to it.

    CPython 3.11+ stores instance attributes against keys shared by all
    instances of a class; adding a new name to one instance adds it to those
    shared keys, and from then on method calls on EVERY instance (other users'
    requests included) take a slower, unspecialized path. A private dict keeps
    the shared keys as vLLM made them.
    """
    obj.__dict__ = dict(obj.__dict__)


def _uninstall(state: _FrontRequest) -> None:
    """Put vLLM's own objects back (ours also hold references to them)."""
    detokenizer: Any = state.detokenizer
    recorder: Any = state.recorder
    if recorder is not None and recorder is getattr(detokenizer, "stream", None):
        detokenizer.stream = state.recorder.stream
    if state.capture is not None:
        state.capture.active = False  # outputs it noted this step are not taken
        if getattr(state.req_state, "queue", None) is state.capture:
            state.req_state.queue = state.queue
    if state.recorder is None:  # the per-instance decode_next (private dict)
        getattr(detokenizer, "__dict__", {}).pop("decode_next", None)
