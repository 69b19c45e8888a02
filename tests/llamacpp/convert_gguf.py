"""Convert the tests' tiny HF Llama to GGUF with the llama.cpp the server is built from.

    PYTHON convert_gguf.py LLAMA_CPP_TREE HF_DIR OUT.gguf

Runs that tree's own `convert_hf_to_gguf.py` (with its `conversion` package and
`gguf-py`), needing torch, transformers and numpy in PYTHON (the vLLM venv has
them; nothing is installed). The converter recognizes a BPE pre-tokenizer by
hashing a known text's tokens and refuses one it does not know: the tests'
tokenizer is a GPT-2-style byte-level BPE trained here, so its check is forced
to answer `gpt-2` (the pre-tokenizer the tokenizer was built with).
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    tree, hf_dir, out = (Path(a) for a in sys.argv[1:])
    sys.path[:0] = [str(tree), str(tree / "gguf-py")]
    import conversion.base as base

    patched = 0
    for value in vars(base).values():
        if isinstance(value, type) and "get_vocab_base_pre" in vars(value):
            value.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"  # type: ignore[attr-defined]
            patched += 1
    if not patched:
        print(f"{tree}: no get_vocab_base_pre to force (another converter layout)", file=sys.stderr)
        return 1
    sys.argv = ["convert_hf_to_gguf.py", str(hf_dir), "--outfile", str(out), "--outtype", "f32"]
    runpy.run_path(str(tree / "convert_hf_to_gguf.py"), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
