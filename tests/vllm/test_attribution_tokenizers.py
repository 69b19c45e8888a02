"""`lead_len` against the real `tokenizers` library and vLLM's real detokenizer, both tokenizers.

No server: tests/vllm/char_truth.py runs in the vLLM venv, feeds token
sequences (multi-byte text encoded by the tokenizer itself, and random token
ids that leave bytes dangling) step by step through vLLM 0.32's
FastIncrementalDetokenizer with the plugin's decode_next wrapper, computes
`lead_len` with the plugin's code for every fragment with span_back > 0, and
checks each known split, and each fragment's give counts when all are known,
against window decodes of the same tokens. Every known split and give must be
right; unknown is allowed but must stay rare.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import server
from build_tiny_model import EXTRA_TEXT

pytestmark = pytest.mark.vllm

HERE = Path(__file__).resolve().parent
TEXTS = [
    *EXTRA_TEXT,
    "def f(x):\n    return x  # 注释 🎉\n",
    "naïve café — “q” 😀😃 東京 👨‍👩‍👧‍👦 🇯🇵",
]


def run_truth(mode: str, request: dict[str, object]) -> object:
    done = subprocess.run(
        ["nice", "-n", "5", str(server.vllm_python()), str(HERE / "char_truth.py"), mode],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        check=False,
        env={"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("kind", ["byte-level", "byte-fallback"])
def test_every_known_lead_len_matches_the_tokenizers_own_decoding(
    kind: str, vllm_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    model = server.build_model(tmp_path_factory.mktemp(f"tok-{kind}") / "tiny", kind)
    result = run_truth(
        "detok",
        {"model": str(model), "texts": TEXTS, "random_sequences": 40, "length": 60, "seed": 9},
    )
    assert isinstance(result, dict)
    counts = result["counts"]
    print(kind, counts)
    assert counts["wrong"] == 0, result["wrong"]
    assert counts["mismatch"] == 0
    # vLLM's decode-stream reset ("invalid prefix") never takes the recorder away;
    # the random byte-fallback sequences of seed 9 do reach it.
    assert counts["resets"] == 0, counts
    if kind == "byte-fallback":
        assert counts["recovered"] > 0, counts
        # After a reset the fragment is the carrier's own (every give 0, lead_len 0),
        # and the ground truth agrees (gives_wrong stays 0).
        assert counts["zero_gives"] > 0, counts
    assert counts["carriers"] >= 100  # the sequences really split characters
    # Every give count sent is right (its characters' tokens and the sum, lead_len),
    # and most fragments have all of theirs known.
    assert counts["gives_wrong"] == 0, result["wrong"]
    assert counts["carriers_all_gives"] >= 0.5 * counts["known"], counts
    # Unknown only where the bytes do not add up (vLLM's decode-stream resets, a
    # leading space the decoder stripped): rare.
    assert counts["unknown"] <= 0.1 * counts["carriers"], counts
