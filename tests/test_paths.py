"""Socket directory and socket file checks (plugin/parallelhue_vllm/paths.py)."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from pathlib import Path

import pytest

from parallelhue_vllm import paths
from parallelhue_vllm.paths import SocketPathError

RUN = "0123456789abcdef0123456789abcdef"
HINT = "use --socket-dir / PARALLELHUE_SOCKET_DIR"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


@pytest.fixture
def short_tmp() -> Path:
    # pytest's tmp_path can be long; sockets need a short directory.
    with tempfile.TemporaryDirectory(prefix="ph", dir="/tmp") as name:
        yield Path(name)


def test_sun_path_limit_matches_platform() -> None:
    assert paths.SUN_PATH_LIMIT == (103 if sys.platform == "darwin" else 107)


def test_default_dir_prefers_explicit_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALLELHUE_SOCKET_DIR", "/x/y")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/tmp")
    assert paths.default_socket_dir() == "/x/y"


def test_default_dir_uses_runtime_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PARALLELHUE_SOCKET_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert paths.default_socket_dir() == str(tmp_path / "parallelhue")


def test_default_dir_falls_back_to_short_tmp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARALLELHUE_SOCKET_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/nonexistent-runtime-dir")
    expected = os.path.join(tempfile.gettempdir(), f"parallelhue-{os.geteuid()}")
    assert paths.default_socket_dir() == expected
    # The fallback leaves room for the socket name within the AF_UNIX limit.
    assert len(paths.socket_path(expected, RUN)) <= paths.SUN_PATH_LIMIT


def test_ensure_creates_private_dir_despite_umask(short_tmp: Path) -> None:
    old = os.umask(0o022)
    try:
        target = short_tmp / "a" / "socks"
        result = paths.ensure_socket_dir(str(target), create=True)
    finally:
        os.umask(old)
    assert result == str(target)
    assert (target.stat().st_mode & 0o777) == 0o700


def test_ensure_is_idempotent_and_returns_absolute(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(short_tmp)
    first = paths.ensure_socket_dir("d", create=True)
    second = paths.ensure_socket_dir("d", create=False)
    assert first == second == str(short_tmp / "d")


def test_ensure_missing_without_create(short_tmp: Path) -> None:
    target = short_tmp / "missing"
    with pytest.raises(SocketPathError) as info:
        paths.ensure_socket_dir(str(target), create=False)
    assert str(info.value) == (
        f"socket directory {target} does not exist: start the client first or "
        f"{HINT} to point at the client's directory"
    )


def test_ensure_refuses_wrong_mode(short_tmp: Path) -> None:
    target = short_tmp / "open"
    target.mkdir()
    target.chmod(0o755)
    with pytest.raises(SocketPathError) as info:
        paths.ensure_socket_dir(str(target), create=True)
    assert str(info.value) == (
        f"socket directory {target} has mode 0755, expected 0700: run chmod 700 {target}"
    )


def test_ensure_refuses_symlink(short_tmp: Path) -> None:
    real = short_tmp / "real"
    real.mkdir(mode=0o700)
    link = short_tmp / "link"
    link.symlink_to(real)
    with pytest.raises(SocketPathError) as info:
        paths.ensure_socket_dir(str(link), create=True)
    assert str(info.value) == f"socket directory {link} is a symlink: {HINT} with a real directory"


def test_ensure_refuses_file(short_tmp: Path) -> None:
    target = short_tmp / "file"
    target.write_text("x")
    with pytest.raises(SocketPathError) as info:
        paths.ensure_socket_dir(str(target), create=False)
    assert str(info.value) == f"socket directory {target} is not a directory: {HINT}"


@needs_root
def test_ensure_refuses_foreign_owner(short_tmp: Path) -> None:
    target = short_tmp / "theirs"
    target.mkdir(mode=0o700)
    os.chown(target, 4242, -1)
    with pytest.raises(SocketPathError) as info:
        paths.ensure_socket_dir(str(target), create=False)
    assert str(info.value) == (
        f"socket directory {target} is owned by uid 4242, not {os.geteuid()}: "
        f"{HINT} with a directory you own"
    )


def test_socket_path_length_limit() -> None:
    # Directory length such that the full path is exactly at, then one past, the limit.
    name_len = len(f"/{RUN}.sock")
    at_limit = "/" + "d" * (paths.SUN_PATH_LIMIT - name_len - 1)
    assert len(paths.socket_path(at_limit, RUN)) == paths.SUN_PATH_LIMIT
    too_long = at_limit + "e"
    expected_path = f"{too_long}/{RUN}.sock"
    with pytest.raises(SocketPathError) as info:
        paths.socket_path(too_long, RUN)
    assert str(info.value) == (
        f"socket path {expected_path} is {paths.SUN_PATH_LIMIT + 1} bytes, the AF_UNIX limit "
        f"is {paths.SUN_PATH_LIMIT}: {HINT} with a shorter path"
    )


def test_socket_path_counts_bytes_not_characters() -> None:
    # Two-byte characters: fits in characters, not in bytes.
    name_len = len(f"/{RUN}.sock")
    chars = (paths.SUN_PATH_LIMIT - name_len - 1) // 2 + 1
    directory = "/" + "é" * chars
    assert len(f"{directory}/{RUN}.sock") <= paths.SUN_PATH_LIMIT
    with pytest.raises(SocketPathError, match="the AF_UNIX limit is"):
        paths.socket_path(directory, RUN)


def test_socket_path_rejects_bad_run_id() -> None:
    with pytest.raises(SocketPathError) as info:
        paths.socket_path("/tmp", "ABC")
    assert str(info.value) == "invalid run id 'ABC': expected 32 lowercase hex characters"


def _bound_socket(path: Path, mode: int) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    os.chmod(path, mode)
    return sock


def test_check_socket_accepts_private_socket(short_tmp: Path) -> None:
    path = short_tmp / f"{RUN}.sock"
    with _bound_socket(path, 0o600):
        paths.check_socket_file(str(path))


def test_check_socket_missing(short_tmp: Path) -> None:
    path = short_tmp / f"{RUN}.sock"
    with pytest.raises(SocketPathError) as info:
        paths.check_socket_file(str(path))
    assert str(info.value) == (
        f"no socket at {path}: the client is not listening there; "
        "give the server the client's PARALLELHUE_SOCKET_DIR"
    )


def test_check_socket_wrong_mode(short_tmp: Path) -> None:
    path = short_tmp / f"{RUN}.sock"
    with _bound_socket(path, 0o666), pytest.raises(SocketPathError) as info:
        paths.check_socket_file(str(path))
    assert str(info.value) == (
        f"socket {path} has mode 0666, expected 0600: restart the client (it creates the "
        "socket 0600)"
    )


def test_check_socket_refuses_symlink(short_tmp: Path) -> None:
    real = short_tmp / "real.sock"
    link = short_tmp / f"{RUN}.sock"
    with _bound_socket(real, 0o600):
        link.symlink_to(real)
        with pytest.raises(SocketPathError) as info:
            paths.check_socket_file(str(link))
    assert str(info.value) == f"socket {link} is a symlink: refusing to send telemetry through it"


def test_check_socket_refuses_regular_file(short_tmp: Path) -> None:
    path = short_tmp / f"{RUN}.sock"
    path.write_text("")
    path.chmod(0o600)
    with pytest.raises(SocketPathError) as info:
        paths.check_socket_file(str(path))
    assert str(info.value) == f"{path} is not a socket: remove it and restart the client"


@needs_root
def test_check_socket_refuses_foreign_owner(short_tmp: Path) -> None:
    path = short_tmp / f"{RUN}.sock"
    with _bound_socket(path, 0o600):
        os.chown(path, 4242, -1)
        with pytest.raises(SocketPathError) as info:
            paths.check_socket_file(str(path))
    assert str(info.value) == (
        f"socket {path} is owned by uid 4242, not {os.geteuid()}: "
        "run the client and the server as the same user, or see --accept-uid "
        "and PARALLELHUE_SOCKET_OWNER_UID (docs/PROTOCOL.md)"
    )
