"""Build the targets and drafts the speculative-method tests serve, from the tiny Llama.

Run with the vLLM venv's python, after build_tiny_model.py:

    python tests/vllm/build_spec_models.py TINY_DIR OUT_DIR

Random weights cannot draft anything a random target accepts, so the drafts
here are built to reproduce the target's own next-token choice, which gives
every role (accepted, bonus at temperature 0; target corrections at 0.8):

- `eagle-target`: the tiny Llama with every embedding row scaled to RMS 1 (so
  an RMSNorm of an embedding is the embedding itself) and its attention and MLP
  output projections scaled up (so the embedding is a small part of a layer's
  output).
- `eagle`: an EAGLE-1 head of `eagle-target` (EagleLlamaForCausalLM): its `fc`
  passes the token embedding on and drops the target's hidden state, and its
  layers are the target's. vLLM feeds the head token i+1 at position i, so it
  recomputes the target over the same tokens with every position shifted by one
  (RoPE sees the same relative positions): it drafts what the target would pick.
- `eagle3`: an EAGLE-3 head of `eagle-target` (Eagle3LlamaForCausalLM): layer 0
  reads the normalised embedding half of its input with the target's weights and
  `fc` maps the target's hidden states to zero; it differs from the target only by
  the embedding in the residual, which `eagle-target` makes small.
- `mimo`: a one-layer MiMo (Qwen2 body, MiMoForCausalLM) with one MTP layer that
  is its own layer behind an `input_proj` passing the token embedding on.
- `dflash`: a DFlash draft (DFlashDraftModel, a Qwen3 layer reading the target's
  two layers' hidden states) with random weights: its block drafts are almost
  never accepted, which still exercises drafting and rejection.
- `medusa`: Medusa heads on the tiny Llama (identity blocks, the target's
  `lm_head`): each head drafts the target's current choice again, accepted where
  the target repeats a token.
Each directory holds the tokenizer of TINY_DIR. Takes a few seconds.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

LAYER_OUTPUT_SCALE = 50.0  # attention and MLP outputs of eagle-target, against embeddings


def _tokenizer_files(tiny: Path) -> list[Path]:
    prefixes = ("tokenizer", "special_tokens", "chat_template")
    return [path for path in tiny.iterdir() if path.name.startswith(prefixes)]


def _write(out: Path, tiny: Path, config: dict[str, Any], weights: dict[str, torch.Tensor]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for path in _tokenizer_files(tiny):
        shutil.copy(path, out / path.name)
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    # Cloned: tensors reused under two names must not share memory in the file.
    save_file(
        {k: v.clone().contiguous() for k, v in weights.items()}, str(out / "model.safetensors")
    )


def _unit_rms_rows(embedding: torch.Tensor) -> torch.Tensor:
    return embedding / embedding.pow(2).mean(dim=1, keepdim=True).sqrt()


def eagle_target(tiny: Path, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    weights = load_file(str(tiny / "model.safetensors"))
    weights["model.embed_tokens.weight"] = _unit_rms_rows(weights["model.embed_tokens.weight"])
    for name in list(weights):
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            weights[name] = weights[name] * LAYER_OUTPUT_SCALE
    return weights


def eagle_head(target: dict[str, torch.Tensor], hidden: int) -> dict[str, torch.Tensor]:
    # Names as EagleLlamaForCausalLM loads them ("model." is added by vLLM); its
    # layer 0 has no input_layernorm (EAGLE-1 skips it).
    weights = {
        name.removeprefix("model."): tensor
        for name, tensor in target.items()
        if name.startswith("model.layers.") and name != "model.layers.0.input_layernorm.weight"
    }
    weights["embed_tokens.weight"] = target["model.embed_tokens.weight"]
    weights["fc.weight"] = torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1)
    return weights


def eagle3_head(
    target: dict[str, torch.Tensor], hidden: int, num_aux: int
) -> dict[str, torch.Tensor]:
    weights: dict[str, torch.Tensor] = {}
    for name, tensor in target.items():
        if not name.startswith("model.layers."):
            continue
        short = name.removeprefix("model.")
        if short.startswith("layers.0.self_attn.") and short.endswith(
            ("q_proj.weight", "k_proj.weight", "v_proj.weight")
        ):
            # Layer 0 reads [normalised embedding, normalised fc output]: only the first half.
            tensor = torch.cat([tensor, torch.zeros_like(tensor)], dim=1)
        weights[short] = tensor
    weights["layers.0.hidden_norm.weight"] = torch.ones(hidden)
    weights["fc.weight"] = torch.zeros(hidden, hidden * num_aux)
    weights["norm.weight"] = target["model.norm.weight"]
    weights["embed_tokens.weight"] = target["model.embed_tokens.weight"]
    weights["lm_head.weight"] = target["lm_head.weight"]
    return weights


def mimo(tiny_config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=tiny_config["vocab_size"],
        hidden_size=tiny_config["hidden_size"],
        intermediate_size=tiny_config["intermediate_size"],
        num_hidden_layers=1,
        num_attention_heads=tiny_config["num_attention_heads"],
        num_key_value_heads=tiny_config["num_key_value_heads"],
        max_position_embeddings=tiny_config["max_position_embeddings"],
        bos_token_id=tiny_config["bos_token_id"],
        eos_token_id=tiny_config["eos_token_id"],
        pad_token_id=tiny_config["pad_token_id"],
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
        model.model.embed_tokens.weight.copy_(_unit_rms_rows(model.model.embed_tokens.weight))
    weights = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    hidden = config.hidden_size
    mtp = "model.mtp_layers.0."
    for name in list(weights):
        if name.startswith("model.layers.0."):
            weights[mtp + name.removeprefix("model.layers.0.")] = weights[name]
    weights[mtp + "token_layernorm.weight"] = torch.ones(hidden)
    weights[mtp + "hidden_layernorm.weight"] = torch.ones(hidden)
    # input_proj reads [hidden state, token embedding]: pass the embedding on.
    weights[mtp + "input_proj.weight"] = torch.cat(
        [torch.zeros(hidden, hidden), torch.eye(hidden)], dim=1
    )
    weights[mtp + "final_layernorm.weight"] = weights["model.norm.weight"]
    saved = config.to_dict()
    saved.update(architectures=["MiMoForCausalLM"], num_nextn_predict_layers=1)
    return saved, weights


def medusa(
    tiny: dict[str, torch.Tensor], hidden: int, vocab: int, heads: int
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    config = {
        "architectures": ["MedusaModel"],
        "model_type": "medusa",
        "hidden_size": hidden,
        "vocab_size": vocab,
        "num_heads": heads,
        "num_hidden_layers": 1,
    }
    weights: dict[str, torch.Tensor] = {}
    for head in range(heads):
        # x + silu(0 x) = x: the head sees the target's last hidden state.
        weights[f"blocks.{head}.layers.0.weight"] = torch.zeros(hidden, hidden)
        weights[f"lm_heads.{head}.weight"] = tiny["lm_head.weight"]
    return config, weights


def dflash(tiny_config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    hidden, inner = tiny_config["hidden_size"], tiny_config["intermediate_size"]
    heads, kv_heads = tiny_config["num_attention_heads"], tiny_config["num_key_value_heads"]
    head_dim, vocab = hidden // heads, tiny_config["vocab_size"]
    target_layers = list(range(tiny_config["num_hidden_layers"]))
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": inner,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "max_position_embeddings": tiny_config["max_position_embeddings"],
        "rms_norm_eps": tiny_config["rms_norm_eps"],
        "rope_parameters": tiny_config["rope_parameters"],
        "bos_token_id": tiny_config["bos_token_id"],
        "eos_token_id": tiny_config["eos_token_id"],
        "pad_token_id": tiny_config["pad_token_id"],
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        # The masked query slots use the pad token's embedding.
        "dflash_config": {
            "target_layer_ids": target_layers,
            "mask_token_id": tiny_config["pad_token_id"],
        },
    }
    generator = torch.Generator().manual_seed(3)

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.02

    weights = {
        "fc.weight": random(hidden, len(target_layers) * hidden),
        "hidden_norm.weight": torch.ones(hidden),
        "norm.weight": torch.ones(hidden),
        "embed_tokens.weight": random(vocab, hidden),
        "lm_head.weight": random(vocab, hidden) * 8.0,
    }
    layer = "layers.0."
    weights.update(
        {
            layer + "self_attn.q_proj.weight": random(heads * head_dim, hidden),
            layer + "self_attn.k_proj.weight": random(kv_heads * head_dim, hidden),
            layer + "self_attn.v_proj.weight": random(kv_heads * head_dim, hidden),
            layer + "self_attn.o_proj.weight": random(hidden, heads * head_dim),
            layer + "self_attn.q_norm.weight": torch.ones(head_dim),
            layer + "self_attn.k_norm.weight": torch.ones(head_dim),
            layer + "mlp.gate_proj.weight": random(inner, hidden),
            layer + "mlp.up_proj.weight": random(inner, hidden),
            layer + "mlp.down_proj.weight": random(hidden, inner),
            layer + "input_layernorm.weight": torch.ones(hidden),
            layer + "post_attention_layernorm.weight": torch.ones(hidden),
        }
    )
    return config, weights


def build(tiny: Path, out: Path) -> None:
    config = json.loads((tiny / "config.json").read_text())
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    target = eagle_target(tiny, config)
    _write(out / "eagle-target", tiny, config, target)
    _write(out / "eagle", tiny, config, eagle_head(target, hidden))
    aux_layers = list(range(config["num_hidden_layers"]))
    eagle3_config = {
        **config,
        "eagle_aux_hidden_state_layer_ids": aux_layers,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux_layers},
    }
    _write(out / "eagle3", tiny, eagle3_config, eagle3_head(target, hidden, len(aux_layers)))
    mimo_config, mimo_weights = mimo(config)
    _write(out / "mimo", tiny, mimo_config, mimo_weights)
    dflash_config, dflash_weights = dflash(config)
    _write(out / "dflash", tiny, dflash_config, dflash_weights)
    tiny_weights = load_file(str(tiny / "model.safetensors"))
    medusa_config, medusa_weights = medusa(tiny_weights, hidden, vocab, heads=3)
    _write(out / "medusa", tiny, medusa_config, medusa_weights)
    (out / "BUILT").write_text("eagle-target eagle eagle3 mimo dflash medusa\n")


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: build_spec_models.py TINY_DIR OUT_DIR", file=sys.stderr)
        return 2
    build(Path(sys.argv[1]), Path(sys.argv[2]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
