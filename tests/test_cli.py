"""Bad input from flags or the environment: one exact line on stderr, exit 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from parallelhue import cli
from parallelhue.cli.config import ConfigError, parse_replay, parse_run

_CLEARED = (
    "PARALLELHUE_ENDPOINT",
    "PARALLELHUE_MODEL",
    "PARALLELHUE_PROMPT",
    "PARALLELHUE_PROMPT_FILE",
    "PARALLELHUE_MAX_TOKENS",
    "PARALLELHUE_CONCURRENCY",
    "PARALLELHUE_MODE",
    "PARALLELHUE_TIMEOUT",
    "PARALLELHUE_BACKEND",
    "PARALLELHUE_API_KEY",
    "PARALLELHUE_VIEW",
    "PARALLELHUE_SEED",
    "PARALLELHUE_TEMPERATURE",
    "PARALLELHUE_RECONCILER",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "PARALLELHUE_API",
    "PARALLELHUE_COLOR",
    "PARALLELHUE_PALETTE",
    "NO_COLOR",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PARALLELHUE_SOCKET_DIR", tempfile.mkdtemp(prefix="phc", dir="/tmp"))


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out, err


FLAG_CASES = [
    (["hi", "--concurrency", "0"], "--concurrency must be an integer from 1 to 1024, got '0'"),
    (["hi", "--concurrency", "x"], "--concurrency must be an integer from 1 to 1024, got 'x'"),
    (["hi", "--max-tokens", "-5"], "--max-tokens must be an integer from 1 to 1000000, got '-5'"),
    (["hi", "--mode", "fast"], "--mode must be one of exact, auto, chunk, got 'fast'"),
    (["hi", "--view", "tv"], "--view must be one of stream, grid, plain, got 'tv'"),
    (["hi", "--timeout", "0"], "--timeout must be a number greater than 0 to 86400, got '0'"),
    (["hi", "--timeout", "nan"], "--timeout must be a number greater than 0 to 86400, got 'nan'"),
    (["hi", "--temperature", "-1"], "--temperature must be a number from 0 to 100, got '-1'"),
    (["hi", "--seed", "1.5"], "--seed must be an integer from 0 to 4294967295, got '1.5'"),
    (["hi", "--reconciler", "go"], "--reconciler must be one of rust, python, got 'go'"),
    (
        ["hi", "--backend", "qwen"],
        "--backend must be auto, generic or a speculative method (ngram, ngram_gpu, suffix, "
        "draft_model, eagle, eagle3, mtp, medusa, mlp_speculator, dflash, dspark), got 'qwen'",
    ),
    (
        ["hi", "--endpoint", "ftp://x/v1/chat/completions"],
        "--endpoint must be an http(s) URL: a base URL (http://host:8000 or http://host:8000/v1) "
        "or a full .../v1/chat/completions or .../v1/completions URL, "
        "got 'ftp://x/v1/chat/completions'",
    ),
    (
        ["hi", "--endpoint", "http://user:secret@h:1/v1/models"],
        "--endpoint must be a base URL ending in an API version (http://host:8000/v1) or a full "
        "URL ending in /v1/chat/completions or /v1/completions, got 'http://***@h:1/v1/models'",
    ),
    (
        ["hi", "--endpoint", "http://h:8000/v1/chat/completions", "--api", "completions"],
        "--endpoint ends in /chat/completions, which is the chat API, but --api completions was "
        "given: give the base URL (.../v1) with --api, or drop --api",
    ),
    (["hi", "--api", "responses"], "--api must be one of chat, completions, got 'responses'"),
    (["hi", "--color", "rainbow"], "--color must be one of step, role, got 'rainbow'"),
    (
        ["hi", "--palette", "neon"],
        "--palette must be one of standard, colorblind, got 'neon'",
    ),
    (
        ["hi", "--extra-body", "{top_p: 1}"],
        "--extra-body is not valid JSON (Expecting property name enclosed in double quotes at "
        """line 1 column 2): give a JSON object, e.g. '{"top_p": 0.9}'""",
    ),
    (
        ["hi", "--extra-body", "[1]"],
        """--extra-body must be a JSON object, got a list: give a JSON object, e.g. """
        """'{"top_p": 0.9}'""",
    ),
    (
        ["hi", "--extra-body", '{"stream": false, "top_p": 0.5}'],
        "--extra-body may not set stream: parallelhue sets stream, stream_options, "
        "return_token_ids, request_id, n, timings_per_token itself "
        "(they make the stream verifiable)",
    ),
    (
        ["hi", "--header", "NoColon"],
        "--header needs NAME:VALUE with a token NAME (e.g. --header 'X-Team: infra'), "
        "got 'NoColon'",
    ),
    (
        ["hi", "--header", "Bad Name: x"],
        "--header needs NAME:VALUE with a token NAME (e.g. --header 'X-Team: infra'), "
        "got 'Bad Name:…'",
    ),
    (
        ["hi", "--header", "X-Request-Id: mine"],
        "--header X-Request-Id is set by parallelhue itself on every request: drop it",
    ),
    (
        ["hi", "--header", "X-Secret: ab\x01cd"],
        "--header X-Secret: the value contains a control character",
    ),
    (["hi", "--stop", ""], "--stop needs a non-empty string"),
    (["hi", "--system", "  "], "--system is empty: give the system prompt's text"),
    (
        ["hi", "--system", "be brief", "--api", "completions"],
        "--system needs the chat API: give a .../v1/chat/completions endpoint or --api chat",
    ),
    (
        ["hi", "--json", "--measurement", "-"],
        "--json and --measurement - both write to stdout: give --measurement a file name",
    ),
    (["hi", "--export", "out.png"], "--export must end in .svg or .html or .htm, got 'out.png'"),
    (["hi", "--socket-dir", ""], "--socket-dir needs a directory path"),
    (["hi", "--no-attach"], "--no-attach only applies with --tmux"),
    ([], "no prompt: give it as an argument, with --prompt, --prompt-file or PARALLELHUE_PROMPT"),
    (["  "], "the prompt is empty: give some text"),
    (["a", "--prompt", "b"], "give the prompt either as an argument or with --prompt, not both"),
    (["hi", "--frobnicate"], "unknown option --frobnicate (see parallelhue --help)"),
    # Item 34: an unknown option is named alone, never with the prompt after it.
    (["--frobnicate", "hi"], "unknown option --frobnicate (see parallelhue --help)"),
    (["--frobnicate=3", "hi"], "unknown option --frobnicate (see parallelhue --help)"),
    (
        ["--session", "hi"],
        "--session was the predecessor's internal tmux option: --tmux makes the panes itself",
    ),
    (
        ["hi", "there"],
        "unexpected argument 'there': one prompt only, quote a prompt with spaces "
        "(see parallelhue --help)",
    ),
    (
        ["hi", "--view", "stream", "--concurrency", "3"],
        "--view stream shows one stream, but 3 streams were asked for: "
        "use --view grid or --concurrency 1",
    ),
    (
        ["hi", "--api-key", "bad key"],
        "--api-key contains whitespace or control characters: check the key",
    ),
]


@pytest.mark.parametrize(("args", "message"), FLAG_CASES)
def test_bad_flag_is_one_line_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(args, capsys)
    assert code == 2
    assert err == f"parallelhue: error: {message}\n"
    assert out == ""


ENV_CASES = [
    (
        "PARALLELHUE_CONCURRENCY",
        "lots",
        "PARALLELHUE_CONCURRENCY must be an integer from 1 to 1024, got 'lots'",
    ),
    (
        "PARALLELHUE_MAX_TOKENS",
        "0",
        "PARALLELHUE_MAX_TOKENS must be an integer from 1 to 1000000, got '0'",
    ),
    (
        "PARALLELHUE_MODE",
        "EXACT",
        "PARALLELHUE_MODE must be one of exact, auto, chunk, got 'EXACT'",
    ),
    (
        "PARALLELHUE_TIMEOUT",
        "-3",
        "PARALLELHUE_TIMEOUT must be a number greater than 0 to 86400, got '-3'",
    ),
    (
        "PARALLELHUE_ENDPOINT",
        "localhost:8000",
        "PARALLELHUE_ENDPOINT must be an http(s) URL: a base URL (http://host:8000 or "
        "http://host:8000/v1) or a full .../v1/chat/completions or .../v1/completions URL, "
        "got 'localhost:8000'",
    ),
    (
        "OPENAI_BASE_URL",
        "http://h:1/openai",
        "OPENAI_BASE_URL must be a base URL ending in an API version (http://host:8000/v1) or a "
        "full URL ending in /v1/chat/completions or /v1/completions, got 'http://h:1/openai'",
    ),
    ("PARALLELHUE_API", "x", "PARALLELHUE_API must be one of chat, completions, got 'x'"),
    ("PARALLELHUE_COLOR", "x", "PARALLELHUE_COLOR must be one of step, role, got 'x'"),
    (
        "PARALLELHUE_PALETTE",
        "x",
        "PARALLELHUE_PALETTE must be one of standard, colorblind, got 'x'",
    ),
    (
        "PARALLELHUE_BACKEND",
        "fast",
        "PARALLELHUE_BACKEND must be auto, generic or a speculative method (ngram, ngram_gpu, "
        "suffix, draft_model, eagle, eagle3, mtp, medusa, mlp_speculator, dflash, dspark), "
        "got 'fast'",
    ),
    (
        "PARALLELHUE_API_KEY",
        "a\nb",
        "PARALLELHUE_API_KEY contains whitespace or control characters: check the key",
    ),
    (
        "OPENAI_API_KEY",
        "a b",
        "OPENAI_API_KEY contains whitespace or control characters: check the key",
    ),
    ("PARALLELHUE_VIEW", "x", "PARALLELHUE_VIEW must be one of stream, grid, plain, got 'x'"),
    (
        "PARALLELHUE_SEED",
        "-1",
        "PARALLELHUE_SEED must be an integer from 0 to 4294967295, got '-1'",
    ),
    ("PARALLELHUE_RECONCILER", "c", "PARALLELHUE_RECONCILER must be one of rust, python, got 'c'"),
    (
        "PARALLELHUE_TEMPERATURE",
        "hot",
        "PARALLELHUE_TEMPERATURE must be a number from 0 to 100, got 'hot'",
    ),
]


@pytest.mark.parametrize(("name", "value", "message"), ENV_CASES)
def test_bad_environment_is_one_line_exit_2(
    name: str,
    value: str,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(name, value)
    code, _out, err = run_cli(["hi"], capsys)
    assert code == 2
    assert err == f"parallelhue: error: {message}\n"


def test_flag_wins_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALLELHUE_CONCURRENCY", "not a number")
    config = parse_run(["hi", "--concurrency", "3"], stdout_tty=False)
    assert config.concurrency == 3
    assert config.prompts == ["hi", "hi", "hi"]


def test_environment_values_are_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALLELHUE_ENDPOINT", "http://127.0.0.1:9/v1/completions")
    monkeypatch.setenv("PARALLELHUE_MODE", "chunk")
    monkeypatch.setenv("PARALLELHUE_MAX_TOKENS", "7")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    monkeypatch.setenv("PARALLELHUE_PROMPT", "from env")
    config = parse_run([], stdout_tty=True)
    assert config.endpoint == "http://127.0.0.1:9/v1/completions"
    assert (config.mode, config.max_tokens, config.api_key) == ("chunk", 7, "sk-openai")
    assert config.prompts == ["from env"]
    assert config.view == "stream"
    # OPENAI_API_KEY wins over PARALLELHUE_API_KEY, as in the predecessor.
    monkeypatch.setenv("PARALLELHUE_API_KEY", "sk-parallelhue")
    assert parse_run([], stdout_tty=True).api_key == "sk-openai"
    monkeypatch.delenv("OPENAI_API_KEY")
    assert parse_run([], stdout_tty=True).api_key == "sk-parallelhue"


def test_concurrency_above_64_warns(capsys: pytest.CaptureFixture[str]) -> None:
    config = parse_run(["hi", "--concurrency", "65"], stdout_tty=True)
    assert config.view == "grid"
    assert config.warnings == [
        "--concurrency 65 is above 64: every stream runs, but only the first 64 get panes "
        "(the rest are overview lines)"
    ]


def test_prompt_file_fans_out(tmp_path: pytest.TempPathFactory) -> None:
    path = os.path.join(str(tmp_path), "prompts.txt")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("one\n\ntwo\nthree\n")
    config = parse_run(["--prompt-file", path], stdout_tty=False)
    assert config.concurrency == 3
    assert config.prompts == ["one", "two", "three"]
    config = parse_run(["--prompt-file", path, "--concurrency", "5"], stdout_tty=False)
    assert config.prompts == ["one", "two", "three", "one", "two"]
    with pytest.raises(ConfigError) as error:
        parse_run(["--prompt-file", path, "--concurrency", "2"], stdout_tty=False)
    assert str(error.value) == (
        "--prompt-file holds 3 prompts but --concurrency is 2: "
        "raise --concurrency to 3 or leave it out"
    )


def test_prompt_file_errors(tmp_path: pytest.TempPathFactory) -> None:
    missing = os.path.join(str(tmp_path), "missing.txt")
    with pytest.raises(ConfigError) as error:
        parse_run(["--prompt-file", missing], stdout_tty=False)
    assert str(error.value) == f"--prompt-file: no such file {missing}"
    bad_json = os.path.join(str(tmp_path), "p.json")
    with open(bad_json, "w", encoding="utf-8") as handle:
        handle.write('{"a": 1}')
    with pytest.raises(ConfigError) as error:
        parse_run(["--prompt-file", bad_json], stdout_tty=False)
    assert str(error.value) == f"--prompt-file: {bad_json} must hold a JSON list of strings"
    empty = os.path.join(str(tmp_path), "empty.txt")
    with open(empty, "w", encoding="utf-8") as handle:
        handle.write("\n  \n")
    with pytest.raises(ConfigError) as error:
        parse_run(["--prompt-file", empty], stdout_tty=False)
    assert str(error.value) == f"--prompt-file: {empty} holds no prompts (one per line)"


def test_demo_flags() -> None:
    from parallelhue.cli.demo import parse_demo

    with pytest.raises(ConfigError) as error:
        parse_demo(["--concurrency", "65"], stdout_tty=True)
    assert str(error.value) == "--concurrency must be an integer from 1 to 64, got '65'"
    with pytest.raises(ConfigError) as error:
        parse_demo(["--acceptance", "1.5"], stdout_tty=True)
    assert str(error.value) == "--acceptance must be a number from 0 to 1, got '1.5'"
    with pytest.raises(ConfigError) as error:
        parse_demo(["--draft-len", "0"], stdout_tty=True)
    assert str(error.value) == "--draft-len must be an integer from 1 to 16, got '0'"
    demo = parse_demo([], stdout_tty=True)
    assert (demo.run.concurrency, demo.run.view, demo.draft_len) == (16, "grid", 4)


def test_replay_flags(tmp_path: pytest.TempPathFactory) -> None:
    with pytest.raises(ConfigError) as error:
        parse_replay([], stdout_tty=False)
    assert str(error.value) == "replay needs a recording: parallelhue replay FILE"
    with pytest.raises(ConfigError) as error:
        parse_replay(["/nonexistent/rec.gz"], stdout_tty=False)
    assert str(error.value) == "replay: no such file /nonexistent/rec.gz"
    path = os.path.join(str(tmp_path), "r.gz")
    open(path, "wb").close()
    with pytest.raises(ConfigError) as error:
        parse_replay([path, "--speed", "0"], stdout_tty=False)
    assert str(error.value) == "--speed must be a number greater than 0 to 1000, got '0'"
    assert parse_replay([path, "--speed", "max"], stdout_tty=False).speed == float("inf")


def test_socket_path_too_long_is_an_error_in_every_mode(
    capsys: pytest.CaptureFixture[str],
) -> None:
    long_dir = tempfile.mkdtemp(prefix="p" * 90, dir="/tmp")
    os.chmod(long_dir, 0o700)
    for mode in ("chunk", "auto", "exact"):
        code, _out, err = run_cli(
            ["hi", "--mode", mode, "--socket-dir", long_dir, "--model", "m"], capsys
        )
        assert code == 2
        assert err.startswith("parallelhue: error: socket path ")
        assert "the AF_UNIX limit is" in err
        assert "use --socket-dir / PARALLELHUE_SOCKET_DIR with a shorter path" in err
        assert err.count("\n") == 1


def test_python_dash_m_reports_without_traceback() -> None:
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(os.path.dirname(__file__), "..", "python"), env.get("PYTHONPATH", "")]
    )
    result = subprocess.run(
        [sys.executable, "-m", "parallelhue", "hi", "--concurrency", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr == (
        "parallelhue: error: --concurrency must be an integer from 1 to 1024, got '0'\n"
    )


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run_cli(["--help"], capsys)
    assert code == 0
    assert "parallelhue demo" in out and "--reconciler" in out


def test_demo_fault_spec_is_validated() -> None:
    from parallelhue.cli.demo import parse_demo

    with pytest.raises(ConfigError) as error:
        parse_demo(["--fault", "drop:2"], stdout_tty=False)
    assert str(error.value) == "--fault: fault drop must be a probability in 0..1, got 2.0"
    assert parse_demo(["--fault", "sse-byte"], stdout_tty=False).faults == "sse-byte"


def test_command_line_prompt_wins_over_prompt_file_variable(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = os.path.join(str(tmp_path), "p.txt")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("from file\n")
    monkeypatch.setenv("PARALLELHUE_PROMPT_FILE", path)
    assert parse_run(["typed"], stdout_tty=False).prompts == ["typed"]
    assert parse_run([], stdout_tty=False).prompts == ["from file"]
    with pytest.raises(ConfigError) as error:
        parse_run(["typed", "--prompt-file", path], stdout_tty=False)
    assert str(error.value) == "give either a prompt or --prompt-file, not both"


# --- defects of issue 12 and the new flags ---------------------------------------------------


@pytest.mark.parametrize("command", ["demo", "replay"])
def test_subcommand_help_exits_0(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Defect 1: `parallelhue demo --help` and `replay --help` were rejected with exit 2.
    code, out, err = run_cli([command, "--help"], capsys)
    assert (code, err) == (0, "")
    assert out.startswith(f"usage: parallelhue {command}")


def test_help_states_the_concurrency_range_that_is_accepted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Defect 14: the help said "1-64" while 1024 was accepted.
    from parallelhue.cli.settings import HARD_CONCURRENCY_LIMIT

    _code, out, _err = run_cli(["--help"], capsys)
    line = next(x for x in out.splitlines() if x.lstrip().startswith("--concurrency"))
    assert f"1-{HARD_CONCURRENCY_LIMIT} " in line
    parse_run(["hi", "--concurrency", str(HARD_CONCURRENCY_LIMIT)], stdout_tty=False)
    with pytest.raises(ConfigError) as error:
        parse_run(["hi", "--concurrency", str(HARD_CONCURRENCY_LIMIT + 1)], stdout_tty=False)
    assert f"from 1 to {HARD_CONCURRENCY_LIMIT}," in str(error.value)


@pytest.mark.parametrize(
    ("given", "api", "expected"),
    [
        ("http://h:8000", None, "http://h:8000/v1/chat/completions"),
        ("http://h:8000/", "completions", "http://h:8000/v1/completions"),
        ("http://h:8000/v1", None, "http://h:8000/v1/chat/completions"),
        ("https://h/proxy/v1/", "completions", "https://h/proxy/v1/completions"),
        ("http://h:8000/v1/completions", None, "http://h:8000/v1/completions"),
        ("http://h:8000/v1/chat/completions/", "chat", "http://h:8000/v1/chat/completions"),
        ("https://h/api/v1beta", None, "https://h/api/v1beta/chat/completions"),
    ],
)
def test_endpoint_takes_base_urls_as_the_openai_sdk_does(
    given: str, api: str | None, expected: str
) -> None:
    args = ["hi", "--endpoint", given] + (["--api", api] if api else [])
    assert parse_run(args, stdout_tty=False).endpoint == expected


def test_endpoint_variables_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (
        parse_run(["hi"], stdout_tty=False).endpoint == "http://127.0.0.1:8000/v1/chat/completions"
    )
    monkeypatch.setenv("OPENAI_BASE_URL", "http://openai-base:1/v1")
    monkeypatch.setenv("PARALLELHUE_API", "completions")
    assert parse_run(["hi"], stdout_tty=False).endpoint == "http://openai-base:1/v1/completions"
    monkeypatch.setenv("PARALLELHUE_ENDPOINT", "http://ph:2")
    assert parse_run(["hi"], stdout_tty=False).endpoint == "http://ph:2/v1/completions"
    config = parse_run(["hi", "--endpoint", "http://flag:3/v1", "--api", "chat"], stdout_tty=False)
    assert config.endpoint == "http://flag:3/v1/chat/completions"


def test_request_knobs_reach_the_body() -> None:
    from parallelhue.ingest.request import build_body
    from parallelhue.ingest.streams import StreamRequest

    config = parse_run(
        ["hi", "--stop", "END", "--stop", "\n\n", "--ignore-eos", "--system", "be brief",
         "--extra-body", '{"top_p": 0.5, "min_tokens": 3, "seed": 99}', "--seed", "7",
         "--header", "X-Team: infra", "--header", "Authorization: Bearer other"],
        stdout_tty=False,
    )  # fmt: skip
    body = build_body(config, "m", StreamRequest(2, "ph1_x_2", "hi", 9))
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert body["stop"] == ["END", "\n\n"]
    assert body["ignore_eos"] is True
    assert (body["top_p"], body["min_tokens"]) == (0.5, 3)
    assert body["seed"] == 9  # the stream's own seed wins over --extra-body
    assert body["request_id"] == "ph1_x_2" and body["return_token_ids"] is True
    assert config.headers == (("X-Team", "infra"), ("Authorization", "Bearer other"))
    completions = parse_run(["hi", "--api", "completions"], stdout_tty=False)
    body = build_body(completions, "m", StreamRequest(0, "ph1_x_0", "hi", 0))
    assert body["prompt"] == "hi" and "messages" not in body and "stop" not in body


def test_prompt_file_byte_order_mark_is_not_sent(tmp_path: pytest.TempPathFactory) -> None:
    # Defect 14: a UTF-8 BOM at the start of the prompt file became part of prompt 0.
    path = os.path.join(str(tmp_path), "bom.txt")
    with open(path, "wb") as handle:
        handle.write("\ufefffirst\nsecond\n".encode())
    assert parse_run(["--prompt-file", path], stdout_tty=False).prompts == ["first", "second"]


def test_replay_of_a_directory_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    # Defect 10: `replay /tmp` said "no such file".
    code, _out, err = run_cli(["replay", "/tmp"], capsys)
    assert code == 2
    assert err == "parallelhue: error: replay: /tmp is a directory, give a recording file\n"


def test_dumb_terminal_gets_the_plain_view(monkeypatch: pytest.MonkeyPatch) -> None:
    # Defect 7: TERM=dumb was ignored (alternate screen, cursor moves, colors).
    monkeypatch.setenv("TERM", "dumb")
    config = parse_run(["hi", "--concurrency", "4"], stdout_tty=True)
    assert (config.view, config.no_color) == ("plain", True)
    with pytest.raises(ConfigError) as error:
        parse_run(["hi", "--concurrency", "4", "--view", "grid"], stdout_tty=True)
    assert str(error.value) == (
        "--view grid moves the cursor, but TERM=dumb cannot: use --view plain or set TERM"
    )


def test_measurement_dash_is_stdout_not_a_file(tmp_path: pytest.TempPathFactory) -> None:
    # Defect 14: `--measurement -` created a file named "-".
    config = parse_run(["hi", "--measurement", "-"], stdout_tty=True)
    assert config.measurement == "-" and config.stdout_reserved
    assert parse_run(["hi", "--json"], stdout_tty=True).stdout_reserved
