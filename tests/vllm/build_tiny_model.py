"""Build the tiny random-weight Llama the real-vLLM tests serve. No downloads.

Run with the vLLM venv's python (it has torch, transformers and tokenizers):

    python tests/vllm/build_tiny_model.py OUT_DIR [byte-level|byte-fallback]

Two tokenizers, both trained here on Python standard-library sources plus CJK
and emoji text, so generated text is full of tokens that end inside a UTF-8
character:
- `byte-level` (default): a GPT-2-style byte-level BPE; a token is any byte string.
- `byte-fallback`: a Llama-2-style BPE over characters with `▁` for spaces and
  the 256 `<0xNN>` byte tokens for what the vocabulary lacks (a rare character
  is spelled byte by byte), decoded by byte fallback.
Weights are random (fixed seed). A chat template makes the chat endpoint
usable. Takes about 10 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

VOCAB_SIZE = 3000
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# Multi-byte text so that the BPE learns tokens that split characters.
EXTRA_TEXT = [
    "日本語のテキストと中文文本，还有한국어 문장도 있습니다。",  # noqa: RUF001
    "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다。",
    "絵文字: 😀😃😄😁😆😅🤣😂🙂🙃😉😊😇🥰😍🤩😘 🚀🌍🌈🔥✨🎉👍👀🧪🧬",
    "家族 👨‍👩‍👧‍👦 旗 🇯🇵🇨🇳🇰🇷 肌色 👋🏽👋🏿 合成 🏳️‍🌈",
    "Ünïcödé façade naïve café — “quotes” ‘single’ … ∑∫√∞ ≤≥≠ ←→↑↓",  # noqa: RUF001
]


def training_text(limit_bytes: int = 1_500_000) -> list[str]:
    """Standard-library sources (always present, no download) plus multi-byte lines."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text)
        total += len(text)
        if total >= limit_bytes:
            break
    texts.extend(EXTRA_TEXT * 200)
    return texts


TOKENIZERS = ("byte-level", "byte-fallback")
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]


def train_tokenizer(kind: str) -> object:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if kind == "byte-level":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=VOCAB_SIZE,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    else:
        # The layout of a Llama-2 tokenizer.json: spaces become "▁" in the
        # normalizer, no pre-tokenizer, and a decoder that turns <0xNN> runs back
        # into bytes. A small character alphabet leaves most CJK and emoji to the
        # byte tokens, so characters are often spelled by two to four tokens.
        tokenizer = Tokenizer(models.BPE(byte_fallback=True, unk_token=None))
        tokenizer.normalizer = normalizers.Sequence(
            [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
        )
        tokenizer.decoder = decoders.Sequence(
            [
                decoders.Replace("▁", " "),
                decoders.ByteFallback(),
                decoders.Fuse(),
                decoders.Strip(" ", 1, 0),
            ]
        )
        trainer = trainers.BpeTrainer(
            vocab_size=VOCAB_SIZE,
            special_tokens=SPECIAL_TOKENS + BYTE_TOKENS,
            limit_alphabet=110,
            show_progress=False,
        )
    tokenizer.train_from_iterator(training_text(), trainer=trainer)
    if kind == "byte-fallback":
        tokenizer = _byte_tokens_as_vocab(tokenizer)
    return tokenizer


def _byte_tokens_as_vocab(tokenizer: Any) -> Any:
    """The trainer adds <0xNN> as special tokens, which decoding with
    skip_special_tokens (vLLM's default) would drop; in a Llama-2 tokenizer they
    are ordinary vocabulary entries. Keep their ids, drop them from added_tokens."""
    from tokenizers import Tokenizer

    spec = json.loads(tokenizer.to_str())
    bytes_ = set(BYTE_TOKENS)
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] not in bytes_]
    return Tokenizer.from_str(json.dumps(spec))


def build(out_dir: Path, kind: str = "byte-level") -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer: Any = train_tokenizer(kind)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=1024,
    )
    fast.save_pretrained(str(out_dir))

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.token_to_id("<s>"),
        eos_token_id=tokenizer.token_to_id("</s>"),
        pad_token_id=tokenizer.token_to_id("<pad>"),
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    # Larger logits than the default init: sampling at temperature 0.8 then
    # differs from greedy, without making every token equally likely.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    built = {"vocab": tokenizer.get_vocab_size(), "tokenizer": kind}
    (out_dir / "BUILT").write_text(json.dumps(built) + "\n")


def main() -> int:
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] not in TOKENIZERS):
        print(f"usage: build_tiny_model.py OUT_DIR [{'|'.join(TOKENIZERS)}]", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    build(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) == 3 else "byte-level")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
