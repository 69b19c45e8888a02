"""Item 2 of issue 26: every flag and variable of the predecessor (hikarioyama/ParallelHue:
its cli.py, client.py and tmux_launch.py) works with its meaning and default; what
changed is listed in the README ("From the predecessor"). One test per flag and
variable, named after it."""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import pytest

from client_fakes import FakeServer
from parallelhue import cli, session
from parallelhue.cli.config import ConfigError, parse_run
from test_cli import _CLEARED

_PREDECESSOR_VARIABLES = (
    "PARALLELHUE_FREQUENCY_PENALTY",
    "PARALLELHUE_PRESENCE_PENALTY",
    "PARALLELHUE_REPEAT_PENALTY",
    "PARALLELHUE_FORCE_FULL_LENGTH",
    "PARALLELHUE_START_DELAY",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*_CLEARED, *_PREDECESSOR_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PARALLELHUE_SOCKET_DIR", tempfile.mkdtemp(prefix="php", dir="/tmp"))
    monkeypatch.setattr(session, "GRACE_SECONDS", 0.1)


def _bodies(args: list[str], capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """The request bodies a chunk-mode run sends to a fake server."""
    with FakeServer() as server:
        code = cli.main(["hi", "--endpoint", server.url, "--mode", "chunk", *args])
        bodies = list(server.requests)
    _out, err = capsys.readouterr()
    assert code == 0, err
    return bodies


def _config(args: list[str], env: dict[str, str] | None = None) -> Any:
    return parse_run(["hi", *args], env=env or {}, stdout_tty=False)


# --- variables of client.py --------------------------------------------------------------


def test_default_temperature_is_the_predecessors_0_8(capsys: pytest.CaptureFixture[str]) -> None:
    assert _bodies([], capsys)[0]["temperature"] == 0.8
    # --extra-body's temperature stands when none is given; a given one wins over it.
    body = _bodies(["--extra-body", '{"temperature": 0.3}'], capsys)[0]
    assert body["temperature"] == 0.3
    assert (
        _bodies(["--temperature", "0", "--extra-body", '{"temperature": 0.3}'], capsys)[0][
            "temperature"
        ]
        == 0
    )


def test_parallelhue_temperature(capsys: pytest.CaptureFixture[str]) -> None:
    assert _config([], {"PARALLELHUE_TEMPERATURE": "0.25"}).temperature == 0.25


@pytest.mark.parametrize(
    ("variable", "field", "value"),
    [
        ("PARALLELHUE_FREQUENCY_PENALTY", "frequency_penalty", 0.3),
        ("PARALLELHUE_PRESENCE_PENALTY", "presence_penalty", -0.5),
        ("PARALLELHUE_REPEAT_PENALTY", "repeat_penalty", 1.2),
    ],
)
def test_penalty_variables_are_sent(
    variable: str,
    field: str,
    value: float,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert field not in _bodies([], capsys)[0]  # unset: left out (the server's default)
    monkeypatch.setenv(variable, f" {value} ")
    assert _bodies([], capsys)[0][field] == value
    flag = "--" + field.replace("_", "-")
    assert _bodies([flag, "0.1"], capsys)[0][field] == 0.1  # the flag wins


@pytest.mark.parametrize(
    ("variable", "raw", "message"),
    [
        ("PARALLELHUE_FREQUENCY_PENALTY", "3", "PARALLELHUE_FREQUENCY_PENALTY must be a number "
         "from -2 to 2, got '3'"),
        ("PARALLELHUE_PRESENCE_PENALTY", "x", "PARALLELHUE_PRESENCE_PENALTY must be a number "
         "from -2 to 2, got 'x'"),
        ("PARALLELHUE_REPEAT_PENALTY", "-1", "PARALLELHUE_REPEAT_PENALTY must be a number "
         "from 0 to 100, got '-1'"),
        ("PARALLELHUE_START_DELAY", "soon", "PARALLELHUE_START_DELAY must be a number from 0 "
         "to 3600, got 'soon'"),
        ("PARALLELHUE_FORCE_FULL_LENGTH", "maybe", "PARALLELHUE_FORCE_FULL_LENGTH must be 1 or "
         "0 (or true/false, yes/no, on/off), got 'maybe'"),
    ],
)  # fmt: skip
def test_bad_predecessor_values_are_one_line(variable: str, raw: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        _config([], {variable: raw})
    assert str(error.value) == message


def test_force_full_length(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ignore_eos, min_tokens = max_tokens, temperature 0 unless one is given."""
    monkeypatch.setenv("PARALLELHUE_FORCE_FULL_LENGTH", "1")
    body = _bodies(["--max-tokens", "9"], capsys)[0]
    assert (body["ignore_eos"], body["min_tokens"], body["temperature"]) == (True, 9, 0)
    assert _bodies(["--temperature", "0.7"], capsys)[0]["temperature"] == 0.7
    monkeypatch.setenv("PARALLELHUE_FORCE_FULL_LENGTH", "0")
    body = _bodies([], capsys)[0]
    assert "min_tokens" not in body and "ignore_eos" not in body
    monkeypatch.delenv("PARALLELHUE_FORCE_FULL_LENGTH")
    assert _bodies(["--force-full-length"], capsys)[0]["min_tokens"] == 128


def test_start_delay(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """No request before the delay has passed (a lower bound, not a speed figure)."""
    monkeypatch.setenv("PARALLELHUE_START_DELAY", "0.5")
    with FakeServer() as server:
        began = time.monotonic()
        code = cli.main(["hi", "--endpoint", server.url, "--mode", "chunk", "--view", "plain"])
        elapsed = time.monotonic() - began
    _out, err = capsys.readouterr()
    assert code == 0
    assert elapsed >= 0.5
    assert "parallelhue: the first request starts 0.5 s after the screen (--start-delay)" in err
    assert _config(["--start-delay", "2"]).start_delay == 2.0


def test_openai_api_key_wins_over_parallelhue_api_key() -> None:
    env = {"OPENAI_API_KEY": "sk-openai", "PARALLELHUE_API_KEY": "sk-ph"}
    assert _config([], env).api_key == "sk-openai"
    assert _config([], {"PARALLELHUE_API_KEY": "sk-ph"}).api_key == "sk-ph"
    assert _config(["--api-key", "sk-flag"], env).api_key == "sk-flag"


# --- flags and variables of cli.py -----------------------------------------------------------


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://127.0.0.1:8000/v1/chat/completions",  # its default
        "http://h:8000/chat/completions",
        "http://h:8000/openai/chat/completions",
        "http://h:8000/openai/completions",
    ],
)
def test_endpoint_as_the_predecessor_took_it(endpoint: str) -> None:
    assert _config(["--endpoint", endpoint]).endpoint == endpoint
    assert _config([], {"PARALLELHUE_ENDPOINT": endpoint}).endpoint == endpoint


def test_an_endpoint_without_v1_is_used_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer() as server:  # answers /models and completions under any prefix
        code = cli.main(["hi", "--endpoint", server.url + "/openai/chat/completions",
                         "--mode", "chunk", "--view", "plain"])  # fmt: skip
        assert server.requests[0]["messages"] == [{"role": "user", "content": "hi"}]
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Hello world!" in out


def test_predecessor_defaults() -> None:
    config = _config([])
    assert config.endpoint == "http://127.0.0.1:8000/v1/chat/completions"
    assert (config.max_tokens, config.concurrency, config.mode) == (128, 1, "auto")
    assert (config.timeout, config.backend, config.tmux) == (60.0, "auto", False)
    assert config.seed == 0  # request i sends seed i, as its stream_index was


@pytest.mark.parametrize(
    ("flag", "variable", "value", "field", "expected"),
    [
        ("--model", "PARALLELHUE_MODEL", "m1", "model", "m1"),
        ("--prompt", "PARALLELHUE_PROMPT", "p", "prompts", ["p"]),
        ("--max-tokens", "PARALLELHUE_MAX_TOKENS", "7", "max_tokens", 7),
        ("--concurrency", "PARALLELHUE_CONCURRENCY", "3", "concurrency", 3),
        ("--mode", "PARALLELHUE_MODE", "exact", "mode", "exact"),
        ("--backend", "PARALLELHUE_BACKEND", "mtp", "backend", "mtp"),
        ("--backend", "PARALLELHUE_BACKEND", "dspark", "backend", "dspark"),
        ("--backend", "PARALLELHUE_BACKEND", "generic", "backend", "generic"),
        ("--api-key", "PARALLELHUE_API_KEY", "sk-1", "api_key", "sk-1"),
    ],
)
def test_flag_and_variable(flag: str, variable: str, value: str, field: str, expected: Any) -> None:
    given = ["--prompt", value] if flag == "--prompt" else ["hi", flag, value]
    assert getattr(parse_run(given, env={}, stdout_tty=False), field) == expected
    argv = [] if flag == "--prompt" else ["hi"]
    assert getattr(parse_run(argv, env={variable: value}, stdout_tty=False), field) == expected


def test_socket_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    from parallelhue_vllm.paths import default_socket_dir

    assert _config(["--socket-dir", "/tmp/phs"]).socket_dir == "/tmp/phs"
    # The variable is read where the plugin reads it too (one default for both sides).
    monkeypatch.setenv("PARALLELHUE_SOCKET_DIR", "/tmp/phs2")
    assert _config([]).socket_dir is None
    assert default_socket_dir() == "/tmp/phs2"


def test_timeout_flag() -> None:
    assert _config(["--timeout", "5"]).timeout == 5.0


def test_positional_prompt() -> None:
    assert parse_run(["tell me"], env={}, stdout_tty=False).prompts == ["tell me"]


def test_tmux_without_tmux_falls_back_to_this_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tempfile.mkdtemp(prefix="phpath")
    monkeypatch.setenv("PATH", empty)
    config = _config(["--tmux", "--no-attach"])
    assert (config.tmux, config.no_attach) == (False, False)
    assert config.warnings == [
        "--tmux: tmux is not on PATH: showing the run in this terminal instead"
    ]
    with FakeServer() as server:
        code = cli.main(["hi", "--endpoint", server.url, "--mode", "chunk", "--tmux"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "parallelhue: warning: --tmux: tmux is not on PATH" in err
    assert "Hello world!" in out


def test_no_tmux_cancels_tmux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", os.environ["PATH"])
    assert _config(["--tmux", "--no-tmux"]).tmux is False
    assert _config(["--no-tmux"]).tmux is False


def test_no_attach_needs_tmux() -> None:
    with pytest.raises(ConfigError) as error:
        _config(["--no-attach"])
    assert str(error.value) == "--no-attach only applies with --tmux"


@pytest.mark.parametrize(
    "flag", ["--worker-index", "--summary-follow", "--session", "--summary-start-epoch",
             "--summary-timeout"],
)  # fmt: skip
def test_internal_tmux_flags_name_their_replacement(flag: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_run([flag, "3", "hi"], env={}, stdout_tty=False)
    assert str(error.value) == (
        f"{flag} was the predecessor's internal tmux option: --tmux makes the panes itself"
    )


def test_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _config([], {"NO_COLOR": "1"}).no_color is True
    assert _config([], {"NO_COLOR": ""}).no_color is False
