"""CASES.md, generated from the catalog: `python -m adversarial.catalog > CASES.md` in tests/.

tests/test_adversarial.py checks that the file equals this rendering, so the
table cannot drift from the cases the suite runs.
"""

from __future__ import annotations

from .cases import CASES, COMBOS, Case
from .story import BASES

__all__ = ["render"]

_GROUPS = (
    ("control", "Honest controls"),
    ("header", "Frame header"),
    ("hello", "hello frames"),
    ("provenance", "provenance records"),
    ("text", "text records"),
    ("notice", "notice records"),
    ("sse", "SSE fields"),
    ("stream", "Whole streams"),
)


def _group(case: Case) -> str:
    if case.id.startswith("honest."):
        return "control"
    if case.id.startswith("combined."):
        return "combined"
    return case.field.split(".")[0]


def _expected(case: Case) -> str:
    if case.expect == "exact":
        return "EXACT"
    if case.expect == "claim":
        return "EXACT; the value is the sender's claim"
    if case.expect == "limit":
        return "EXACT (a consistent lie: what EXACT does not prove)"
    if case.expect == "uncolored":
        shown = "<br>".join(f"#{s}: `{_cell(chars)}`" for s, chars in case.uncolored.items())
        return f"EXACT; shown without a step (mixed) exactly:<br>{shown}"
    parts = []
    for stream in case.streams:
        reasons = case.reason(stream)
        if reasons:
            parts.append(f"#{stream}: " + " / ".join(f"`{_cell(r)}`" for r in reasons))
        else:
            parts.append(f"#{stream}: not EXACT")
    return "<br>".join(parts)


def _status(case: Case) -> str:
    if case.xfail is None:
        return "caught" if case.expect == "fail" else "holds"
    where = "" if case.xfail_in == COMBOS else f" ({', '.join(case.xfail_in)})"
    return f"**XFAIL{where}**: {_cell(case.xfail)}"


def _cell(text: str) -> str:
    return (
        text.replace("|", "\\|")
        .replace("\n", "\\n")
        .replace("\x1b", "\\x1b")
        .replace("\x07", "\\x07")
    )


def render() -> str:
    lines = [
        "# Adversarial cases",
        "",
        "Generated from `tests/adversarial/cases.py` by `python -m adversarial.catalog`",
        "(run in `tests/`); `tests/test_adversarial.py` checks this file is current.",
        "Each case runs through the real client (`Session`, plain view) for both",
        "reconcilers and both modes. `#s` is a stream of the run; a reason in",
        "backquotes is the exact one required; XFAIL marks a lie the client still lets",
        "through (strict: it must be removed when the rule lands).",
        "",
        "Honest bases (story.py):",
        "",
    ]
    for name, base in BASES.items():
        lines.append(f"- `{name}`: {base.description}")
    counts: dict[str, int] = {}
    for case in CASES:
        counts[_group(case)] = counts.get(_group(case), 0) + 1
    lines += ["", f"{len(CASES)} cases: " + ", ".join(f"{k} {v}" for k, v in counts.items())]
    for group, title in (*_GROUPS, ("combined", "Combined lies (several witnesses)")):
        cases = [c for c in CASES if _group(c) == group]
        if not cases:
            continue
        lines += [
            "",
            f"## {title}",
            "",
            "| field | case | base | liar | lie | rule | expected | status |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for case in cases:
            lines.append(
                f"| {case.field} | `{case.id}` | {case.base} | {case.witnesses} | "
                f"{_cell(case.lie)} | {_cell(case.rule)} | {_expected(case)} | {_status(case)} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
