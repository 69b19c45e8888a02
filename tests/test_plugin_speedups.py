"""The optional C accelerator (plugin/speedups/src) against its Python originals.

The hook tests (test_plugin_hooks.py) run every scenario with both; these check
what the stand-ins promise vLLM on their own: the stream's and the queue's
results and errors pass through unchanged, our own failures never reach vLLM,
and nothing leaks.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tracemalloc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from parallelhue_vllm import accelerator, hooks

PLUGIN = Path(__file__).resolve().parents[1] / "plugin"


def load_speedups() -> Any:
    """The accelerator: built in place when the plugin is this checkout's, else the one
    installed beside it (the parallelhue-vllm-speedups wheel, `make plugin-pythons`)."""
    import parallelhue_vllm

    if PLUGIN not in Path(parallelhue_vllm.__file__).resolve().parents:
        try:
            return importlib.import_module("parallelhue_vllm._speedups")
        except ImportError as error:
            if os.environ.get("CI"):
                pytest.fail(f"parallelhue_vllm._speedups is not installed: {error}")
            pytest.skip(f"no accelerator installed: {error}")
    sys.path.insert(0, str(PLUGIN))
    try:
        import build_speedups

        build_speedups.build()
        return importlib.import_module("parallelhue_vllm._speedups")
    except (OSError, ImportError, subprocess.CalledProcessError) as error:
        if os.environ.get("CI"):
            pytest.fail(f"parallelhue_vllm._speedups could not be built: {error}")
        pytest.skip(f"no C compiler: {error}")
    finally:
        sys.path.pop(0)


# (the recorder class, the capture class, the step's take_rows) of one implementation
Kinds = tuple[type, type, Any]
ROLE_TABLE, PLAIN_ROLE = hooks.scheduler._ROLE_TABLE, hooks.scheduler._PLAIN_ROLE
PYTHON_KINDS: Kinds = (
    hooks.standins._StreamRecorder,
    hooks.standins._QueueCapture,
    hooks.standins._take_rows,
)


def c_kinds(module: Any) -> Kinds:
    return module.StreamRecorder, module.CaptureState, module.take_rows


@pytest.fixture(params=["c", "python"])
def kinds(request: pytest.FixtureRequest) -> Kinds:
    if request.param == "python":
        return PYTHON_KINDS
    return c_kinds(load_speedups())


class Stream:
    def __init__(self, results: list[Any]) -> None:
        self.results = results

    def step(self, tokenizer: Any, token_id: int) -> Any:
        result = self.results.pop(0)
        if isinstance(result, BaseException):
            raise result
        return result


def test_recorder_passes_the_stream_through_and_records(kinds: Kinds) -> None:
    recorder_type = kinds[0]
    fragments: list[str] = []
    stream = Stream(["a", None, "", "日", OverflowError("bad id")])
    recorder = recorder_type(stream, fragments)
    assert recorder.stream is stream
    assert [recorder.step(None, i) for i in range(4)] == ["a", None, "", "日"]
    # decode_next returns `step(...) or ""`: that is what is recorded.
    assert fragments == ["a", "", "", "日"]
    with pytest.raises(OverflowError, match="bad id"):
        recorder.step(None, 5)  # the stream's own error reaches vLLM as it would without us
    # vLLM's decode_next then returns "" (it survives this error): recorded as such.
    assert fragments == ["a", "", "", "日", ""]


def test_recorder_does_vllms_stream_reset_and_keeps_recording(kinds: Kinds) -> None:
    """After tokenizers' "invalid prefix" error vLLM replaces its decode stream; the
    recorder makes the same new stream (recover) so it stays in place."""
    recorder_type = kinds[0]
    fragments: list[str] = []
    errors: list[BaseException] = []
    fresh = Stream(["b", "c"])

    def recover(error: BaseException) -> Any:
        errors.append(error)
        return fresh if str(error).startswith("Invalid prefix") else None

    broken = RuntimeError("Invalid prefix encountered while decoding")
    stream = Stream(["a", broken, ValueError("other")])
    recorder = recorder_type(stream, fragments, recover)
    assert recorder.step(None, 1) == "a"
    assert recorder.step(None, 2) == "b"  # the new stream's step for the same token
    assert recorder.stream is fresh and errors == [broken]
    assert recorder.step(None, 3) == "c"
    assert fragments == ["a", "b", "c"]
    other = Stream([ValueError("not a reset")])
    recorder = recorder_type(other, fragments, recover)
    with pytest.raises(ValueError, match="not a reset"):
        recorder.step(None, 4)  # recover gave nothing: the error goes on, "" recorded
    assert recorder.stream is other and fragments[-1] == ""

    def failing(error: BaseException) -> Any:
        raise KeyError("recover broke")

    recorder = recorder_type(Stream([broken]), fragments, failing)
    with pytest.raises(RuntimeError, match="Invalid prefix"):
        recorder.step(None, 5)  # recover's own failure: the stream's error, unchanged
    after_reset = Stream([OverflowError("after reset")])
    recorder = recorder_type(Stream([broken]), fragments, lambda error: after_reset)
    with pytest.raises(OverflowError, match="after reset"):
        recorder.step(None, 6)  # the new stream's own error goes on to vLLM
    assert recorder.stream is after_reset and fragments[-2:] == ["", ""]


def test_reset_stream_is_vllms_recovery(monkeypatch: pytest.MonkeyPatch) -> None:
    """hooks.standins._reset_stream: a new DecodeStream, as vLLM makes it, only after the
    invalid-prefix error."""
    made: list[Any] = []
    fake = SimpleNamespace(DecodeStream=lambda **kwargs: made.append(kwargs) or "stream")
    monkeypatch.setattr(
        hooks.standins.importlib, "import_module", lambda name: {"tokenizers.decoders": fake}[name]
    )
    reset = hooks.standins._reset_stream
    assert reset(False, "r1", ValueError("Invalid prefix encountered")) == "stream"
    assert reset(True, "r1", ValueError("something else")) is None
    assert made == [{"skip_special_tokens": False}]


class Queue:
    def __init__(self) -> None:
        self.outputs: list[Any] = []

    def put(self, output: Any) -> str:
        if output == "explode":
            raise RuntimeError("queue broke")
        self.outputs.append(output)
        return "queued"


class Bucket:
    def __init__(self) -> None:
        self.meta: list[int] = []
        self.ids: list[int] = []
        self.extra: list[Any] = []
        self.fragments: list[str] = []
        self.span_backs: dict[int, list[int]] = {}


def completion_output(text: Any, token_ids: list[int], finish: str | None = None) -> Any:
    completion = SimpleNamespace(
        index=0, text=text, token_ids=token_ids, finish_reason=finish, stop_reason=None
    )
    return SimpleNamespace(outputs=[completion])


class Step:
    """A capture as vLLM uses it, each put followed by the step's take_rows (the end
    of process_outputs): so each output's row is taken before the next put."""

    def __init__(self, capture: Any, seen: list[Any], take: Any) -> None:
        self.capture, self.seen, self.take = capture, seen, take

    def put(self, output: Any) -> Any:
        result = self.capture.put(output)
        assert self.seen[-2:] == [self.capture, output]  # noted, not taken yet
        self.take(self.seen)
        assert self.seen == []
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.capture, name)


def new_capture(
    kinds: Kinds, seen: list[Any], stream: int = 7, bucket: Bucket | None = None,
    events: list[Any] | None = None,
) -> tuple[Any, Queue, Bucket, list[str], list[Any]]:  # fmt: skip
    queue, fragments = Queue(), []
    bucket = Bucket() if bucket is None else bucket
    events = [] if events is None else events
    capture = kinds[1](
        queue, fragments, bucket, stream, 0,
        lambda *args: events.append(("special", args)),
        lambda error: events.append(("failed", repr(error))),
        seen,
    )  # fmt: skip
    return capture, queue, bucket, fragments, events


def make_capture(kinds: Kinds) -> tuple[Any, Queue, Bucket, list[str], list[Any]]:
    seen: list[Any] = []
    capture, queue, bucket, fragments, events = new_capture(kinds, seen)
    return Step(capture, seen, kinds[2]), queue, bucket, fragments, events


def test_capture_takes_the_common_row_and_passes_the_output_on(kinds: Kinds) -> None:
    capture, queue, bucket, fragments, events = make_capture(kinds)
    ids = [4, 5]
    fragments += ["a", "b"]
    output = completion_output("ab", ids)
    assert capture.put(output) in ("queued", None) and queue.outputs == [output]
    assert (bucket.meta, bucket.extra) == ([7, 0, 0, 0, 2, 2, 0], ["ab"])
    assert (bucket.ids, bucket.fragments, fragments) == ([4, 5], ["a", "b"], [])
    ids.append(6)  # vLLM merges later outputs into this list: the bucket holds a copy
    assert bucket.ids == [4, 5]
    assert (capture.offset, events) == (2, [])


def test_capture_claims_tokens_that_ended_inside_a_character(kinds: Kinds) -> None:
    capture, _queue, bucket, fragments, events = make_capture(kinds)
    fragments += ["a", "", ""]
    capture.put(completion_output("a", [1, 2, 3]))
    fragments += ["日"]
    capture.put(completion_output("日", [4]))
    if kinds is PYTHON_KINDS:  # Python hands both rows to hooks' _special_row
        assert [event[1][0] for event in events] == [[1, 2, 3], [4]]
        return
    # C takes the row whose "" tokens nothing claims yet, and counts them pending;
    # the row that claims them needs lead_len from the tokenizer: Python's _special_row.
    assert bucket.meta == [7, 0, 0, 0, 3, 3, 0]
    assert bucket.span_backs == {} and capture.pending_empty == 2
    assert [event[1][0] for event in events] == [[4]]


def test_capture_hands_every_other_row_to_special(kinds: Kinds) -> None:
    capture, queue, bucket, fragments, events = make_capture(kinds)
    fragments += ["x"]
    capture.put(completion_output("x", [3], finish="stop"))  # finished: may have been trimmed
    other = completion_output("y", [4])
    other.outputs[0].index = 1  # not this request's choice
    capture.put(other)
    capture.put(completion_output("", []))  # no tokens
    expected = [([3], "stop", None, "x", 0), ([4], None, None, "y", 1), ([], None, None, "", 0)]
    assert [event[1] for event in events] == expected
    assert bucket.meta == [] and len(queue.outputs) == 3


def test_capture_never_raises_its_own_failures_and_forwards_anything(
    kinds: Kinds,
) -> None:
    capture, queue, bucket, fragments, events = make_capture(kinds)
    fragments += ["a"]
    broken = SimpleNamespace(outputs=[SimpleNamespace(index=0, token_ids=[1], finish_reason=None)])
    capture.put(broken)  # no .text
    error = ValueError("an engine error for the client")
    capture.put(error)
    capture.put("sentinel")
    assert queue.outputs == [broken, error, "sentinel"]
    assert [event[0] for event in events] == ["failed"]
    assert "text" in events[0][1]
    assert bucket.meta == bucket.ids == bucket.extra == bucket.fragments == []
    with pytest.raises(RuntimeError, match="queue broke"):
        capture.put("explode")  # the queue's own error reaches vLLM as it would without us


def test_take_rows_takes_the_noted_outputs_in_put_order(kinds: Kinds) -> None:
    """put only notes (capture, output) and passes the output on; take_rows, at the end
    of the step, takes the rows in the order vLLM put the outputs, skips a capture
    whose telemetry ended and a capture without its output, and empties the list."""
    seen: list[Any] = ["not a capture"]  # a stray item: skipped
    first, queue1, bucket, fragments1, events = new_capture(kinds, seen, stream=1)
    second, queue2, _, fragments2, _ = new_capture(kinds, seen, 2, bucket, events)
    ended, _, _, fragments3, _ = new_capture(kinds, seen, 3, bucket, events)
    fragments2 += ["c"]
    later = completion_output("c", [3])
    assert second.put(later) is not None and queue2.outputs == [later]
    fragments1 += ["a", "b"]
    earlier = completion_output("ab", [1, 2])
    first.put(earlier)
    fragments3 += ["z"]
    ended.put(completion_output("z", [9]))
    ended.active = False  # its request's telemetry ended mid-step (hooks.standins._uninstall)
    seen.append(first)  # a capture whose output could not be noted: skipped
    assert bucket.meta == [] and queue1.outputs == [earlier]  # nothing taken at put
    kinds[2](seen)
    assert seen == [] and events == []
    assert bucket.meta == [2, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 2, 2, 0]
    assert (bucket.ids, bucket.fragments, bucket.extra) == ([3, 1, 2], ["c", "a", "b"], ["c", "ab"])
    assert (first.offset, second.offset, ended.offset) == (2, 1, 0)
    assert fragments1 == fragments2 == [] and fragments3 == ["z"]
    kinds[2](seen)  # nothing noted: nothing taken
    assert len(bucket.meta) == 14
    with pytest.raises(TypeError) as info:
        kinds[2](("a tuple",))
    assert str(info.value) == "take_rows(seen): a list"


# vLLM's output classes as they are (a plain class, a dataclass without slots)
# and as another vLLM could have them: the C capture reads their attributes from
# where CPython keeps them (a slot, 3.11's instance values) when getattr would
# give the same, and through getattr otherwise (layout.h, read_attr).
@dataclasses.dataclass
class PlainCompletion:
    index: int
    text: Any
    token_ids: list[int]
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: Any = None


@dataclasses.dataclass(slots=True)
class SlottedCompletion:
    index: int
    text: Any
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: Any = None


class PropertyCompletion(PlainCompletion):
    @property  # type: ignore[override]
    def text(self) -> str:
        return "from a property"

    @text.setter
    def text(self, value: Any) -> None:
        pass


class PlainOutput:
    def __init__(self, outputs: list[Any]) -> None:
        self.request_id = "r"
        self.outputs = outputs


def capture_rows(kinds: Kinds, outputs: list[tuple[Any, list[str]]]) -> Any:
    """What a capture took from each output (the step's fragments set before each put;
    the `special` of these tests leaves them in place)."""
    capture, queue, bucket, fragments, events = make_capture(kinds)
    for output, pieces in outputs:
        fragments[:] = pieces
        capture.put(output)
    assert queue.outputs == [output for output, _ in outputs]
    return bucket.meta, bucket.ids, bucket.extra, bucket.fragments, events


def reading_cases() -> list[tuple[Any, list[str]]]:
    """Outputs whose fields sit where the C reader must take care."""
    plain = [PlainOutput([PlainCompletion(0, "ab", [1, 2])]) for _ in range(3)]
    made_dict = PlainOutput([PlainCompletion(0, "cd", [3, 4])])
    made_dict.outputs[0].__dict__["text"] = "cd!"  # a __dict__ made: no value array any more
    vars(made_dict)
    deleted = PlainOutput([PlainCompletion(0, "ef", [5, 6])])
    del deleted.outputs[0].text  # not in the instance: getattr's AttributeError (failed)
    class_default = PlainOutput([PlainCompletion(0, "gh", [7, 8])])
    del class_default.outputs[0].finish_reason  # the class's default None, through getattr
    other_index = PlainOutput([PlainCompletion(1, "ij", [9, 10])])  # another choice: special
    finished = PlainOutput([PlainCompletion(0, "kl", [11, 12], finish_reason="stop")])
    slotted = PlainOutput([SlottedCompletion(0, "mn", [13, 14])])
    unset_slot = PlainOutput([SlottedCompletion(0, "op", [15, 16])])
    del unset_slot.outputs[0].text
    prop = PlainOutput([PropertyCompletion(0, "qr", [17, 18])])
    two = ["x", "y"]
    return [(plain[0], two), (plain[1], two), (made_dict, two), (deleted, two), (plain[2], two),
            (class_default, two), (other_index, two), (finished, two), (slotted, two),
            (unset_slot, two), (prop, two), (PlainOutput([]), []), (ValueError("e"), []),
            (PlainOutput([PlainCompletion(0, "st", [19, 20])]), two)]  # fmt: skip


def test_capture_reads_every_kind_of_attribute_as_getattr_does() -> None:
    """C and Python take the same rows and hand the same ones on, whatever the
    classes keep their fields in: instance values, a made __dict__, a deleted
    field, a class default, slots (set and unset), a property over a field."""
    module = load_speedups()
    python = capture_rows(PYTHON_KINDS, reading_cases())
    c = capture_rows(c_kinds(module), reading_cases())
    assert c == python
    meta, ids, texts, _fragments, events = c
    assert texts == ["ab", "ab", "cd!", "ab", "gh", "mn", "from a property", "st"]
    assert [event[0] for event in events] == ["failed", "special", "special", "failed"]
    assert "'PlainCompletion' object has no attribute 'text'" in events[0][1]
    assert [event[1][3:] for event in events[1:3]] == [("ij", 1), ("kl", 0)]
    # CPython 3.13 names an unset slot's class with its module ('test_....SlottedCompletion').
    assert "SlottedCompletion' object has no attribute 'text'" in events[3][1]
    assert meta[3::7] == [0, 2, 4, 6, 8, 10, 12, 14] and ids[-2:] == [19, 20]


def test_capture_follows_a_class_changed_after_its_first_outputs() -> None:
    """A class changed while outputs flow (its version tag changes): the next read
    is the new class's (a property now), in C as in Python."""

    @dataclasses.dataclass
    class Changing:
        index: int
        text: Any
        token_ids: list[int]
        finish_reason: str | None = None
        stop_reason: Any = None

    def run(kinds: Kinds) -> Any:
        capture, _queue, bucket, fragments, _events = make_capture(kinds)
        for _ in range(3):
            fragments += ["a"]
            capture.put(PlainOutput([Changing(0, "a", [1])]))
        last = PlainOutput([Changing(0, "a", [1])])
        Changing.text = property(lambda self: "changed")  # type: ignore[assignment]
        fragments += ["a"]
        capture.put(last)
        del Changing.text  # type: ignore[attr-defined]
        return bucket.extra

    module = load_speedups()
    python = run(PYTHON_KINDS)
    assert run(c_kinds(module)) == python
    assert python == ["a", "a", "a", "changed"]


def test_c_stand_ins_leak_nothing() -> None:
    module = load_speedups()
    fragments: list[str] = []
    recorder = module.StreamRecorder(Stream([]), fragments)
    queue, bucket, seen = Queue(), Bucket(), []
    capture = Step(
        module.CaptureState(queue, fragments, bucket, 1, 0, lambda *a: None, lambda e: None, seen),
        seen,
        module.take_rows,
    )
    pieces = [str(i) for i in range(8)]
    recorder.stream.results = pieces * 4000

    def rounds(count: int) -> None:
        for _ in range(count):
            for _ in range(4):
                recorder.step(None, 1)
            capture.put(completion_output("0123", [1, 2, 3, 4]))
            bucket.meta.clear()
            bucket.ids.clear()
            bucket.extra.clear()
            bucket.fragments.clear()
            queue.outputs.clear()
            capture.put(completion_output("x", [1], finish="stop"))  # special: no fragments
            queue.outputs.clear()

    rounds(100)
    gc.collect()
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    rounds(3000)
    gc.collect()
    after, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert after - before < 16 * 1024, after - before


def test_scheduler_rows_refuses_what_it_does_not_know() -> None:
    module = load_speedups()
    with pytest.raises(TypeError, match=r"scheduler_rows\(results, requests"):
        module.scheduler_rows([], [], {}, [], b"", True, None)
    outputs = SimpleNamespace(outputs=(SimpleNamespace(request_id="x"),))  # not a list
    with pytest.raises(TypeError, match=r"EngineCoreOutputs\.outputs is not a list"):
        module.scheduler_rows([outputs], {}, {}, [], b"\0", True, print)


class SlotOutput:
    """EngineCoreOutput's shape in vLLM (msgspec.Struct: fields are member descriptors)."""

    __slots__ = ("finish_reason", "new_token_ids", "request_id")

    def __init__(self, request_id: str, new_token_ids: list[int]) -> None:
        self.request_id = request_id
        self.new_token_ids = new_token_ids
        self.finish_reason = None


class SlotOutputs:
    __slots__ = ("outputs",)

    def __init__(self, outputs: list[Any]) -> None:
        self.outputs = outputs


def scheduler_rows_of(module: Any, results: list[Any]) -> tuple[list[int], list[int]]:
    """(meta, ids) that scheduler_rows builds for the requests "a" and "b" (no drafts)."""
    bucket = hooks.common._Bucket()
    requests = {rid: module.SchedRequest("r", stream, bucket) for stream, rid in enumerate("ab")}
    special: list[Any] = []
    module.scheduler_rows(results, requests, {}, ROLE_TABLE, PLAIN_ROLE, True,
                          lambda state, output: special.append(output))  # fmt: skip
    assert not special
    return bucket.meta, bucket.ids


def test_scheduler_rows_reads_slots_as_getattr_would() -> None:
    """The C loop reads EngineCoreOutput's slots directly; what it reads is what
    getattr gives: after the class changes (a property replaces a slot), for a
    subclass with its own __getattribute__, for objects with an instance dict,
    and an unset slot raises getattr's AttributeError."""
    module = load_speedups()

    def step(cls: type, token: int) -> list[Any]:
        return [SlotOutputs([cls("a", [token]), cls("b", [token + 1])])]

    assert scheduler_rows_of(module, step(SlotOutput, 5))[1] == [5, 6]
    assert scheduler_rows_of(module, step(SlotOutput, 7))[1] == [7, 8]

    class Changed(SlotOutput):
        __slots__ = ()

    assert scheduler_rows_of(module, step(Changed, 1))[1] == [1, 2]
    made_before = step(Changed, 1)
    Changed.new_token_ids = property(lambda self: [42])  # type: ignore[assignment]
    assert scheduler_rows_of(module, made_before)[1] == [42, 42]

    class Intercepting(SlotOutput):
        __slots__ = ()

        def __getattribute__(self, name: str) -> Any:
            return [99] if name == "new_token_ids" else object.__getattribute__(self, name)

    assert scheduler_rows_of(module, step(Intercepting, 1))[1] == [99, 99]
    plain = [SimpleNamespace(outputs=[SimpleNamespace(request_id="b", new_token_ids=[3],
                                                      finish_reason=None)])]  # fmt: skip
    assert scheduler_rows_of(module, plain) == ([1, 0, 0, 0, 1, 0, 0], [3])
    unset = SlotOutput("a", [1])
    del unset.new_token_ids
    with pytest.raises(AttributeError, match="new_token_ids"):
        scheduler_rows_of(module, [SlotOutputs([unset])])
    assert scheduler_rows_of(module, step(SlotOutput, 11))[1] == [11, 12]


def test_sampled_lengths_are_len_of_each_list() -> None:
    module = load_speedups()
    assert module.sampled_lengths([[1, 2, 3], [], [4], (5, 6)]) == [3, 0, 1, 2]
    with pytest.raises(TypeError, match="object of type 'int' has no len"):
        module.sampled_lengths([[1], 7])
    with pytest.raises(TypeError, match=r"sampled_lengths\(sampled\): a list"):
        module.sampled_lengths(((1,),))


def test_take_lists_moves_the_items_and_leaves_the_lists_empty() -> None:
    module = load_speedups()
    marker = object()
    first, second, empty = [1, marker, "x"], [marker], []
    references = sys.getrefcount(marker)
    taken = module.take_lists(first, second, empty)
    assert taken == ([1, marker, "x"], [marker], [])
    assert all(type(column) is list for column in taken)
    assert taken[0] is not first and first == [] and second == [] and empty == []
    assert sys.getrefcount(marker) == references  # moved, not copied
    first.extend(range(10))  # the emptied lists stay usable
    assert first == list(range(10)) and taken[0] == [1, marker, "x"]
    del taken
    assert sys.getrefcount(marker) == references - 2
    with pytest.raises(TypeError, match=r"take_lists\(\*lists\): lists"):
        module.take_lists([], (1,))


def test_take_lists_and_the_in_place_appends_leak_nothing() -> None:
    module = load_speedups()
    bucket = hooks.common._Bucket()
    requests = {"a": module.SchedRequest("r", 0, bucket)}
    outputs = [SlotOutputs([SlotOutput("a", [1, 2])])]

    def rounds(count: int) -> None:
        for _ in range(count):
            module.scheduler_rows(outputs, requests, {}, ROLE_TABLE, PLAIN_ROLE,
                                  True, print)  # fmt: skip
            module.take_lists(bucket.meta, bucket.ids, bucket.extra)

    rounds(100)
    gc.collect()
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    rounds(3000)
    gc.collect()
    after, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert after - before < 16 * 1024, after - before


# ------------------------------------------------------------------ loading it
def test_pure_python_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALLELHUE_VLLM_PURE_PYTHON", "1")
    assert accelerator.load() == (None, "pure Python (PARALLELHUE_VLLM_PURE_PYTHON=1)")


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (
            ModuleNotFoundError("No module named 'parallelhue_vllm._speedups'"),
            "pure Python (the C accelerator is not installed: pip install the "
            "parallelhue-vllm-speedups wheel built for this Python, see make plugin-dist)",
        ),
        (
            ImportError("_speedups.so: invalid ELF header"),
            "pure Python (the C accelerator failed to load: ImportError: _speedups.so: "
            "invalid ELF header)",
        ),
        (
            SystemError("initialization of _speedups raised unreported exception"),
            "pure Python (the C accelerator failed to load: SystemError: initialization of "
            "_speedups raised unreported exception)",
        ),
    ],
)
def test_an_accelerator_that_does_not_load_falls_back(
    monkeypatch: pytest.MonkeyPatch, error: Exception, reason: str
) -> None:
    monkeypatch.delenv("PARALLELHUE_VLLM_PURE_PYTHON", raising=False)

    def import_module(name: str) -> Any:
        assert name == "parallelhue_vllm._speedups"
        raise error

    monkeypatch.setattr(accelerator.importlib, "import_module", import_module)
    assert accelerator.load() == (None, reason)


@pytest.mark.parametrize(
    ("module", "reason"),
    [
        (
            SimpleNamespace(ABI=0, **dict.fromkeys(accelerator.REQUIRED)),
            "pure Python (the C accelerator has ABI 0, this plugin needs 7)",
        ),
        (
            # the build before the step's rows were taken in one loop (its QueueCapture
            # took each row in put): whatever names it has, it is old
            SimpleNamespace(ABI=6, **dict.fromkeys(accelerator.REQUIRED)),
            "pure Python (the C accelerator has ABI 6, this plugin needs 7)",
        ),
        (
            SimpleNamespace(CaptureState=None, SchedRequest=None),
            "pure Python (the C accelerator has ABI None, this plugin needs 7)",
        ),
        (
            SimpleNamespace(ABI=7, CaptureState=None, SchedRequest=None),
            "pure Python (the C accelerator lacks StreamRecorder, encode_provenance_body, "
            "encode_provenance_frame, encode_provenance_step, encode_text_body, "
            "encode_text_frame, encode_text_step, has_empty, sampled_lengths, scheduler_rows, "
            "take_rows)",
        ),
    ],
)
def test_an_accelerator_from_another_source_is_not_used(
    monkeypatch: pytest.MonkeyPatch, module: Any, reason: str
) -> None:
    monkeypatch.delenv("PARALLELHUE_VLLM_PURE_PYTHON", raising=False)
    monkeypatch.setattr(accelerator.importlib, "import_module", lambda name: module)
    assert accelerator.load() == (None, reason)


def test_the_built_accelerator_is_used() -> None:
    import parallelhue_vllm

    if os.environ.get("PARALLELHUE_EXPECT_INSTALLED") == "1":  # make plugin-pythons
        assert PLUGIN not in Path(parallelhue_vllm.__file__).resolve().parents
    module = load_speedups()
    assert module.ABI == accelerator.EXPECTED_ABI
    assert all(hasattr(module, name) for name in accelerator.REQUIRED)


def implementation_in_a_fresh_process(package_root: Path, **env: str) -> str:
    """hooks.IMPLEMENTATION as a new interpreter importing the plugin from package_root sees it."""
    environment = {k: v for k, v in os.environ.items() if k != "PARALLELHUE_VLLM_PURE_PYTHON"}
    environment.update(env, PYTHONPATH=str(package_root))
    code = (
        "import parallelhue_vllm, parallelhue_vllm.hooks as h; print(parallelhue_vllm.__file__); "
        "print(h.IMPLEMENTATION); print(h.common._speedups is None)"
    )
    # -S: no site-packages, so no other copy of the plugin (an editable install's
    # finder would supply a _speedups this copy lacks); the plugin needs only the stdlib.
    result = subprocess.run(
        [sys.executable, "-S", "-c", code], env=environment, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    where, implementation, pure = result.stdout.splitlines()
    assert where == str(package_root / "parallelhue_vllm" / "__init__.py")
    assert pure == str(implementation.startswith("pure Python"))
    return implementation


def test_a_broken_build_on_disk_never_stops_the_plugin(tmp_path: Path) -> None:
    """A _speedups file that is no shared object at all (a half-copied wheel, another
    platform's build): the plugin imports and runs on its Python code."""
    package = tmp_path / "parallelhue_vllm"
    shutil.copytree(PLUGIN / "parallelhue_vllm", package,
                    ignore=shutil.ignore_patterns("_speedups*.so", "__pycache__"))  # fmt: skip
    suffix = str(sysconfig.get_config_var("EXT_SUFFIX"))
    assert implementation_in_a_fresh_process(tmp_path) == accelerator.NOT_INSTALLED
    (package / f"_speedups{suffix}").write_bytes(b"not an ELF file")
    implementation = implementation_in_a_fresh_process(tmp_path)
    assert implementation.startswith(
        "pure Python (the C accelerator failed to load: ImportError: "
    ), implementation
    assert implementation_in_a_fresh_process(tmp_path, PARALLELHUE_VLLM_PURE_PYTHON="1") == (
        "pure Python (PARALLELHUE_VLLM_PURE_PYTHON=1)"
    )
    built = Path(load_speedups().__file__)
    shutil.copy(built, package / built.name)
    assert implementation_in_a_fresh_process(tmp_path) == f"C accelerator ({package / built.name})"


def test_an_older_build_on_disk_is_refused(tmp_path: Path) -> None:
    """A _speedups built from the previous ABI's source beside these Python files (an
    upgrade that kept an old build): it loads, says ABI 6, and the Python code runs."""
    sys.path.insert(0, str(PLUGIN))
    try:
        import build_speedups
    finally:
        sys.path.pop(0)
    package = tmp_path / "parallelhue_vllm"
    shutil.copytree(PLUGIN / "parallelhue_vllm", package,
                    ignore=shutil.ignore_patterns("_speedups*.so", "__pycache__"))  # fmt: skip
    sources = tmp_path / "src"
    shutil.copytree(build_speedups.SOURCES, sources)
    header = sources / "speedups.h"
    text = header.read_text()
    assert f"#define SPEEDUPS_ABI {accelerator.EXPECTED_ABI}\n" in text
    header.write_text(text.replace(f"#define SPEEDUPS_ABI {accelerator.EXPECTED_ABI}\n",
                                   "#define SPEEDUPS_ABI 6\n"))  # fmt: skip
    suffix = str(sysconfig.get_config_var("EXT_SUFFIX"))
    try:
        build_speedups.compile_to(package / f"_speedups{suffix}", sources, ["-O0"])
    except (OSError, subprocess.CalledProcessError) as error:
        if os.environ.get("CI"):
            pytest.fail(f"the ABI 6 build failed: {getattr(error, 'stderr', error)}")
        pytest.skip("no C compiler")
    assert implementation_in_a_fresh_process(tmp_path) == (
        "pure Python (the C accelerator has ABI 6, this plugin needs 7)"
    )


def _without_a_compiler(tmp_path: Path) -> dict[str, str]:
    """The environment of a server without a C compiler: the system's tools except
    every C compiler and linker."""
    tools = tmp_path / "bin"
    tools.mkdir()
    compilers = ("cc", "gcc", "c89", "c99", "clang", "tcc", "ld", "x86_64-linux-gnu-")
    for directory in ("/usr/bin", "/bin"):
        for tool in Path(directory).iterdir():
            if not tool.name.startswith(compilers) and not os.path.lexists(tools / tool.name):
                (tools / tool.name).symlink_to(tool)
    environment = dict(os.environ, PATH=str(tools), CC="/bin/false", PIP_NO_INPUT="1")
    environment.pop("PARALLELHUE_VLLM_PURE_PYTHON", None)
    return environment


def test_pip_installs_the_plugin_without_a_compiler(tmp_path: Path) -> None:
    """`pip install ./plugin` on a server without a C compiler: the plugin is pure Python
    (no build step at all), and without the accelerator it runs its Python code and says
    how to get it. Installing the accelerator itself there fails loudly, never half-way."""
    environment = _without_a_compiler(tmp_path)
    source = tmp_path / "plugin"  # a clean copy: setuptools writes its build tree there
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns(
        "*.so", "build", "*.egg-info", "__pycache__"))  # fmt: skip
    target = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir", "-q",
         "--target", str(target), str(source)],
        env=environment, capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    installed = sorted(path.name for path in (target / "parallelhue_vllm").iterdir())
    assert not [name for name in installed if name.endswith((".so", ".c", ".h"))], installed
    assert "accelerator.py" in installed and "check.py" in installed
    assert implementation_in_a_fresh_process(target) == accelerator.NOT_INSTALLED
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir", "-q",
         "--target", str(tmp_path / "site2"), str(source / "speedups")],
        env=environment, capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert result.returncode != 0
    assert not (tmp_path / "site2" / "parallelhue_vllm").exists()


# ------------------------------------------------------------- step encoders
def test_c_provenance_step_encoder_gives_wire_py_bytes() -> None:
    """_speedups.encode_provenance_step (the emitter's, test_wire_speedups.py has random
    steps) against wire.py, the one encoder: same bytes for the same columns, same refusals."""
    from parallelhue_vllm import wire

    module = load_speedups()
    meta = [0, 0, 0, 0, 1, 0, 0, 7, 1, 1, 42, 4, 3, 0, 0xFFFF, 3, 2, 0xFFFFFFFF, 2, 3, 2]
    ids = [5, 0xFFFFFFFF, 6, 7, 8, 9, 10]
    roles = [bytes([0]), bytes([1, 1, 1, 3]), bytes([2, 2])]
    assert module.encode_provenance_step(meta, ids, roles) == wire.encode_provenance_step(
        (meta, ids, roles)
    )
    with pytest.raises(ValueError, match="field out of range"):
        module.encode_provenance_step([0, 0, 0, 0, 1, 0x10000, 0], [1], [b"\0"])
    with pytest.raises(ValueError, match="field out of range"):
        wire.encode_provenance_step(([0, 0, 0, 0, 1, 0x10000, 0], [1], [b"\0"]))
    with pytest.raises(ValueError, match="1 roles for 2 tokens"):
        module.encode_provenance_step([0, 0, 0, 0, 2, 0, 0], [1, 2], [b"\0"])
    with pytest.raises(ValueError, match="1 roles for 2 tokens"):
        wire.encode_provenance_step(([0, 0, 0, 0, 2, 0, 0], [1, 2], [b"\0"]))
