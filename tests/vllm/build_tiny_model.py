"""Build the tiny random-weight Llama the real-vLLM tests serve. No downloads.

Run with the vLLM venv's python (it has torch, transformers and tokenizers):

    python tests/vllm/build_tiny_model.py OUT_DIR

The tokenizer is a byte-level BPE trained here on Python standard-library
sources plus CJK and emoji text, so generated text is full of tokens that end
inside a UTF-8 character. Weights are random (fixed seed). A chat template makes
the chat endpoint usable. Takes about 10 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from pathlib import Path

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


def build(out_dir: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_text(), trainer=trainer)
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
    (out_dir / "BUILT").write_text(json.dumps({"vocab": tokenizer.get_vocab_size()}) + "\n")


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: build_tiny_model.py OUT_DIR", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    build(Path(sys.argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
