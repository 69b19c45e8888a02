"""Where telemetry sockets live, and the safety checks both ends apply to them.

The client binds `<socket_dir>/<run_id>.sock`; the senders (vLLM plugin,
simulated engine) only send to a socket that passes `check_socket_file`. The
directory must be 0700 and the socket 0600, both owned by the current user
and neither a symlink, so another local user can neither read nor forge
telemetry. Every error is one line that names the fix.

One explicit exception, for a server in a container on the same host
(docs/PROTOCOL.md, "Security of the telemetry paths"): a client started
with `--accept-uid` makes its directory 0711 and, for a uid other than
root, its socket 0622 (`shared`); a sender started with
`PARALLELHUE_SOCKET_OWNER_UID=UID` sends to a directory and socket owned by
that uid (`owner`), in those modes or the private ones. Nothing else
relaxes these checks.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import tempfile

__all__ = [
    "ENV_SOCKET_OWNER",
    "SUN_PATH_LIMIT",
    "SocketPathError",
    "check_socket_file",
    "default_socket_dir",
    "ensure_socket_dir",
    "socket_owner",
    "socket_path",
]

# Sender side: the uid that owns the client's socket directory, when not the sender's own.
ENV_SOCKET_OWNER = "PARALLELHUE_SOCKET_OWNER_UID"

# Usable bytes of sockaddr_un.sun_path (the array holds one more for the NUL).
SUN_PATH_LIMIT: int = 103 if sys.platform == "darwin" else 107

_RUN_ID = re.compile(r"[0-9a-f]{32}")
_DIR_HINT = "use --socket-dir / PARALLELHUE_SOCKET_DIR"


class SocketPathError(Exception):
    """A socket directory or socket file that is unsafe or unusable."""


def default_socket_dir() -> str:
    """$PARALLELHUE_SOCKET_DIR, else $XDG_RUNTIME_DIR/parallelhue, else <tmp>/parallelhue-<uid>."""
    explicit = os.environ.get("PARALLELHUE_SOCKET_DIR")
    if explicit:
        return explicit
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "parallelhue")
    return os.path.join(tempfile.gettempdir(), f"parallelhue-{os.geteuid()}")


def _mode_text(mode: int) -> str:
    return f"{stat.S_IMODE(mode):04o}"


def socket_owner(env: dict[str, str] | None = None) -> int | None:
    """Sender side: $PARALLELHUE_SOCKET_OWNER_UID (None: unset, i.e. our own uid)."""
    raw = (os.environ if env is None else env).get(ENV_SOCKET_OWNER, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) >= 2**32 - 1:
        raise SocketPathError(
            f"{ENV_SOCKET_OWNER}={raw!r} is not a uid: give the client's numeric uid, or unset it"
        )
    return int(raw)


def ensure_socket_dir(
    path: str, *, create: bool, shared: bool = False, owner: int | None = None
) -> str:
    """Check (and with `create`, make) a private socket directory; return its absolute path.

    `shared` (the client with --accept-uid): the directory is 0711, so an
    accepted uid can reach the socket in it. `owner` (a sender with
    PARALLELHUE_SOCKET_OWNER_UID): the directory belongs to that uid, 0700 or 0711.
    """
    path = os.path.abspath(path)
    want = 0o711 if shared else 0o700
    uid = os.geteuid() if owner is None else owner
    modes = (0o700, 0o711) if owner is not None else (want,)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        if not create:
            raise SocketPathError(
                f"socket directory {path} does not exist: start the client first or "
                f"{_DIR_HINT} to point at the client's directory"
            ) from None
        parent = os.path.dirname(path)
        try:
            os.makedirs(parent, exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass  # created concurrently: the checks below decide whether it is usable
        except OSError as error:
            raise SocketPathError(
                f"cannot create socket directory {path} ({error.strerror}): {_DIR_HINT} "
                "with a writable path"
            ) from None
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
            # mkdir honours the umask; the mode we want is exactly 0700 (0711).
            os.chmod(path, want)
            info = os.lstat(path)
    else:
        mode = stat.S_IMODE(info.st_mode)
        ours = stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
        if create and ours and mode in (0o700, 0o711) and mode != want:
            # Our own directory, between its two safe modes: --accept-uid decides which.
            os.chmod(path, want)
            info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise SocketPathError(
            f"socket directory {path} is a symlink: {_DIR_HINT} with a real directory"
        )
    if not stat.S_ISDIR(info.st_mode):
        raise SocketPathError(f"socket directory {path} is not a directory: {_DIR_HINT}")
    if info.st_uid != uid:
        if owner is not None:
            raise SocketPathError(
                f"socket directory {path} is owned by uid {info.st_uid}, not {uid} "
                f"({ENV_SOCKET_OWNER}): give the client's uid"
            )
        raise SocketPathError(
            f"socket directory {path} is owned by uid {info.st_uid}, not {os.geteuid()}: "
            f"{_DIR_HINT} with a directory you own"
        )
    if stat.S_IMODE(info.st_mode) not in modes:
        expected = " or ".join(f"{m:04o}" for m in modes)
        raise SocketPathError(
            f"socket directory {path} has mode {_mode_text(info.st_mode)}, expected {expected}: "
            f"run chmod {want:o} {path}"
        )
    return path


def socket_path(socket_dir: str, run_id: str) -> str:
    """`<socket_dir>/<run_id>.sock`, refused when it does not fit sun_path."""
    if not _RUN_ID.fullmatch(run_id):
        raise SocketPathError(f"invalid run id '{run_id}': expected 32 lowercase hex characters")
    path = os.path.join(socket_dir, f"{run_id}.sock")
    size = len(os.fsencode(path))
    if size > SUN_PATH_LIMIT:
        raise SocketPathError(
            f"socket path {path} is {size} bytes, the AF_UNIX limit is {SUN_PATH_LIMIT}: "
            f"{_DIR_HINT} with a shorter path"
        )
    return path


def check_socket_file(path: str, owner: int | None = None) -> None:
    """Sender side: the path is a 0600 socket owned by us, not a symlink (`owner`:
    PARALLELHUE_SOCKET_OWNER_UID, a socket of that uid, 0600 or 0622)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise SocketPathError(
            f"no socket at {path}: the client is not listening there; "
            "give the server the client's PARALLELHUE_SOCKET_DIR"
        ) from None
    if stat.S_ISLNK(info.st_mode):
        raise SocketPathError(f"socket {path} is a symlink: refusing to send telemetry through it")
    if not stat.S_ISSOCK(info.st_mode):
        raise SocketPathError(f"{path} is not a socket: remove it and restart the client")
    if owner is not None:
        if info.st_uid != owner:
            raise SocketPathError(
                f"socket {path} is owned by uid {info.st_uid}, not {owner} "
                f"({ENV_SOCKET_OWNER}): give the client's uid"
            )
        if stat.S_IMODE(info.st_mode) not in (0o600, 0o622):
            raise SocketPathError(
                f"socket {path} has mode {_mode_text(info.st_mode)}, expected 0600 or 0622: "
                "restart the client"
            )
        return
    if info.st_uid != os.geteuid():
        raise SocketPathError(
            f"socket {path} is owned by uid {info.st_uid}, not {os.geteuid()}: "
            "run the client and the server as the same user, or see --accept-uid "
            f"and {ENV_SOCKET_OWNER} (docs/PROTOCOL.md)"
        )
    if stat.S_IMODE(info.st_mode) != 0o600:
        raise SocketPathError(
            f"socket {path} has mode {_mode_text(info.st_mode)}, expected 0600: "
            "restart the client (it creates the socket 0600)"
        )
