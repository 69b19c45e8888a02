"""--record, replay, --export and --measurement, end to end through the demo."""

from __future__ import annotations

import gzip
import json
import os
import re
import tempfile
from collections.abc import Callable

import pytest

from parallelhue import cli
from parallelhue.ingest.record import Recording, read_recording, write_recording
from test_cli import _CLEARED


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PARALLELHUE_SOCKET_DIR", tempfile.mkdtemp(prefix="phc", dir="/tmp"))


def refused_replay(path: str, capsys: pytest.CaptureFixture[str]) -> str:
    """Replay a file the CLI must refuse: exit code 2, nothing on stdout; the error line."""
    code = cli.main(["replay", path, "--view", "plain"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    return err


def test_demo_records_exports_and_measures(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = str(tmp_path)
    record = os.path.join(directory, "run.phr")
    svg = os.path.join(directory, "run.svg")
    measurement = os.path.join(directory, "m.json")
    code = cli.main(
        ["demo", "--concurrency", "3", "--max-tokens", "20", "--step-ms", "2",
         "--reconciler", "python", "--view", "plain", "--record", record,
         "--export", svg, "--measurement", measurement]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    original = re.findall(r"^#(\d+) {2,}(\S+)", out, re.M)  # the summary table's rows
    assert original == [(str(i), "EXACT") for i in range(3)]

    with open(svg, encoding="utf-8") as handle:
        picture = handle.read()
    assert picture.startswith("<svg") and "SIMULATED" in picture and "EXACT" in picture

    with open(measurement, encoding="utf-8") as handle:
        data = json.load(handle)
    assert data["simulated"] is True
    assert data["engine_note"].startswith("SIMULATED ENGINE")
    assert data["hardware"]["logical_cpus"] == os.cpu_count()
    assert data["request"]["concurrency"] == 3 and data["request"]["max_tokens"] == 20
    assert data["n"]["streams"] == 3
    assert data["results"]["labels"] == {"EXACT TOKEN PROVENANCE": 3}
    assert data["results"]["sse_tokens"] == 60

    code = cli.main(["replay", record, "--speed", "max", "--view", "plain",
                     "--reconciler", "python"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    replayed = re.findall(r"^#(\d+) {2,}(\S+)", out, re.M)
    assert replayed == original


def tampered_replay(
    tmp_path: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    streams: int,
    tamper: Callable[[Recording], None],
) -> tuple[int, str]:
    """Record a demo run of `streams` streams, tamper with the recording, replay it:
    the exit code and stderr."""
    record = os.path.join(str(tmp_path), "run.phr")
    code = cli.main(
        ["demo", "--concurrency", str(streams), "--max-tokens", "12", "--step-ms", "1",
         "--reconciler", "python", "--view", "plain", "--record", record]
    )  # fmt: skip
    assert code == 0
    capsys.readouterr()
    recording = read_recording(record)
    tamper(recording)
    tampered = os.path.join(str(tmp_path), "tampered.phr")
    write_recording(tampered, recording)
    code = cli.main(["replay", tampered, "--speed", "max", "--view", "plain",
                     "--reconciler", "python"])  # fmt: skip
    return code, capsys.readouterr()[1]


def test_replay_reports_a_changed_verdict(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    def drop_frames(recording: Recording) -> None:
        # Drop every telemetry frame: the replay cannot prove anything now.
        recording.events = [event for event in recording.events if event[1] != "frame"]

    assert tampered_replay(tmp_path, capsys, 1, drop_frames) == (
        1,
        "parallelhue: replay differs from the recording: stream 0 was exact, "
        "replayed failed (missing telemetry: no frames received for this run)\n",
    )


def test_replay_reports_a_footer_with_fewer_verdicts_than_streams(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    def drop_a_verdict(recording: Recording) -> None:
        # A footer that leaves a stream out compares nothing for it: a difference.
        assert recording.footer is not None
        recording.footer["verdicts"] = recording.footer["verdicts"][:1]

    assert tampered_replay(tmp_path, capsys, 2, drop_a_verdict) == (
        1,
        "parallelhue: replay differs from the recording: its footer has 1 verdicts for 2 streams\n",
    )


def test_replay_rejects_a_file_that_is_not_a_recording(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    path = os.path.join(str(tmp_path), "junk.phr")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("hello")
    err = refused_replay(path, capsys)
    assert err == (
        f"parallelhue: error: replay: {path} is not a ParallelHue recording "
        "(Not a gzipped file (b'he'))\n"
    )


def test_recording_is_compact_and_holds_no_secrets(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    record = os.path.join(str(tmp_path), "run.phr")
    code = cli.main(
        ["demo", "--concurrency", "2", "--max-tokens", "30", "--step-ms", "1",
         "--reconciler", "python", "--view", "plain", "--record", record]
    )  # fmt: skip
    capsys.readouterr()
    assert code == 0
    with gzip.open(record, "rb") as handle:
        assert handle.read(6) == b"PHREC\x04"  # recording format 4
    recording = read_recording(record)
    header, footer, events = recording.header, recording.footer, recording.events
    assert footer is not None
    assert header["num_streams"] == 2 and header["simulated"] is True
    assert "api_key" not in header and "endpoint" not in header
    kinds = {event[1] for event in events}
    assert kinds == {"start", "sse", "sse_id", "sse_usage", "finish", "frame", "finalize"}
    assert sum(len(event[4]) for event in events if event[1] == "sse") == 60
    assert footer["verdicts"] == [["exact", None], ["exact", None]]
    times = [event[0] for event in events]
    assert times == sorted(times)


def test_replay_in_the_grid_view(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    record = os.path.join(str(tmp_path), "run.phr")
    assert cli.main(
        ["demo", "--concurrency", "2", "--max-tokens", "10", "--step-ms", "1",
         "--reconciler", "python", "--view", "plain", "--record", record]
    ) == 0  # fmt: skip
    capsys.readouterr()
    html = os.path.join(str(tmp_path), "replay.html")
    code = cli.main(["replay", record, "--view", "grid", "--speed", "50",
                     "--reconciler", "python", "--export", html])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "#1 EXACT TOKEN PROVENANCE" in re.sub(r"\x1b\[[0-9;]*m", "", out)
    with open(html, encoding="utf-8") as handle:
        page = handle.read()
    assert page.lstrip().lower().startswith("<!doctype html") and "EXACT TOKEN PROVENANCE" in page


def _have_native() -> bool:
    try:
        from parallelhue._native import Reconciler  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _have_native(), reason="parallelhue._native not built (make native)")
def test_rust_recording_replays_on_python_and_back(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    record = os.path.join(str(tmp_path), "run.phr")
    code = cli.main(
        ["demo", "--concurrency", "3", "--max-tokens", "24", "--step-ms", "1",
         "--reconciler", "rust", "--view", "plain", "--record", record]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    original = re.findall(r"^(?:#\d+ |stream \d+: ).*$", out, re.M)  # table rows and notes
    assert len(original) >= 3
    for kind in ("python", "rust"):
        code = cli.main(["replay", record, "--speed", "max", "--view", "plain",
                         "--reconciler", kind])  # fmt: skip
        out, err = capsys.readouterr()
        assert code == 0, err
        replayed = re.findall(r"^(?:#\d+ |stream \d+: ).*$", out, re.M)
        # Same verdicts, steps, roles and recorded times, whichever reconciler replays.
        assert replayed == original


def test_a_version_1_recording_is_refused_in_one_line(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    path = os.path.join(str(tmp_path), "old.phr")
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(json.dumps({"parallelhue_recording": 1, "run_id": "0" * 32}) + "\n")
        handle.write(json.dumps([0.0, "start", 0]) + "\n")
    err = refused_replay(path, capsys)
    assert err == (
        f"parallelhue: error: replay: {path} has recording format 1 (JSON lines), "
        "this build reads 3: record the run again\n"
    )


def test_a_recording_cut_short_is_refused_in_one_line(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    record = os.path.join(str(tmp_path), "run.phr")
    assert cli.main(
        ["demo", "--concurrency", "1", "--max-tokens", "8", "--step-ms", "1",
         "--reconciler", "python", "--view", "plain", "--record", record]
    ) == 0  # fmt: skip
    capsys.readouterr()
    with gzip.open(record, "rb") as handle:
        data = handle.read()
    cut = os.path.join(str(tmp_path), "cut.phr")
    with gzip.open(cut, "wb") as handle:
        handle.write(data[:-3])
    err = refused_replay(cut, capsys)
    assert re.fullmatch(
        rf"parallelhue: error: replay: {re.escape(cut)}: the recording is cut short "
        r"inside the item at byte \d+\n",
        err,
    ), err
