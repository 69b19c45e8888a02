"""Role colors and per-position acceptance end to end, with the simulated engine.

Both need contract C2 from the reconcilers: span events with an 8th element (the
token role) and per-draft-position counts in the stats. A reconciler that does not
report them yet makes its case a strict xfail (an unexpected pass fails); one that
does runs it as an ordinary test, so C2 landing needs no change here.
"""

from __future__ import annotations

import json
import os
import re
import tempfile

import pytest

from parallelhue import cli
from test_cli import _CLEARED


def _has_c2(kind: str) -> bool:
    """The reconciler reports contract C2's per-position counts (its span roles come
    with them): the tests then run as ordinary tests, with no mark to remove."""
    run_id = "0" * 32
    try:
        if kind == "python":
            from parallelhue.reference.reconciler import Reconciler as Reference

            return "drafts_by_pos" in Reference(run_id, 1).totals()
        from parallelhue._native import Reconciler as Native

        return "drafts_by_pos" in Native(run_id, 1).totals()
    except ImportError:
        return False


def _kinds() -> list[object]:
    """Both reconcilers; a strict xfail for each that does not speak C2 yet."""
    return [
        pytest.param(
            kind,
            marks=pytest.mark.xfail(
                not _has_c2(kind),
                strict=True,
                reason="contract C2: span roles and per-position counts are not on main yet",
            ),
        )
        for kind in ("python", "rust")
    ]


# xterm-256 46, 203, 39: accepted draft, target correction, bonus (style.PALETTES["standard"]).
ROLE_FILLS = {"#00ff00", "#ff5f5f", "#00afff"}
# 33 and 226: only step colors use them.
STEP_ONLY_FILLS = {"#0087ff", "#ffff00"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PARALLELHUE_SOCKET_DIR", tempfile.mkdtemp(prefix="phc", dir="/tmp"))


@pytest.mark.parametrize("kind", _kinds())
def test_role_colors_come_from_the_reconciled_roles(
    kind: str, tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    svg = os.path.join(str(tmp_path), "roles.svg")
    code = cli.main(
        ["demo", "--concurrency", "3", "--max-tokens", "60", "--step-ms", "1", "--mode",
         "exact", "--color", "role", "--reconciler", kind, "--view", "plain", "--export", svg]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    with open(svg, encoding="utf-8") as handle:
        texts = re.findall(
            r'<text [^>]*style="fill:(#[0-9a-f]{6})[^"]*">([^<]*)</text>', handle.read()
        )
    # The generated text's colors (the legend's ■ swatches show every role color anyway).
    fills = {fill for fill, text in texts if text != "■"}
    assert ROLE_FILLS <= fills
    assert not fills & STEP_ONLY_FILLS


@pytest.mark.parametrize("kind", _kinds())
def test_acceptance_per_draft_position_from_the_runs_frames(
    kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(
        ["demo", "--concurrency", "2", "--max-tokens", "60", "--step-ms", "1", "--draft-len",
         "4", "--mode", "exact", "--reconciler", kind, "--json"]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    total = json.loads(out)["total"]
    rates = total["acceptance_by_position"]
    assert isinstance(rates, list) and len(rates) == 4
    drafts, accepted = total["drafts_by_position"], total["accepted_by_position"]
    assert all(0 <= a <= d for a, d in zip(accepted, drafts, strict=True))
    # A later draft position is only reached after the earlier ones were accepted.
    assert drafts == sorted(drafts, reverse=True)
