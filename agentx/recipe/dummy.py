"""Build the model directory of the `qwen3-8b-dummy-h200` recipe: no download, no weights.

`python -m agentx.recipe.dummy OUT_DIR` writes OUT_DIR/model (a Qwen3-8B-shaped config.json,
generation_config.json and a byte-level BPE tokenizer trained in seconds on this Python's
standard library sources, with a ChatML template and Qwen3's enable_thinking switch) and
OUT_DIR/eagle3 (a one-layer EAGLE3 draft config for it). vLLM serves them with
`--load-format dummy`, which fills every weight with random values, so the GPU does the full
Qwen3-8B amount of work per token while no checkpoint is fetched.

Shape: Qwen/Qwen3-8B's config.json on the Hugging Face hub (36 layers, hidden 4096, 32 query
and 8 KV heads of dim 128, intermediate 12288, rope theta 1e6) with the YaRN scaling the Qwen3
model card gives for 131,072-token contexts (factor 4 over 32,768 original positions);
max_position_embeddings is the scaled 131,072, as transformers 5 expects for YaRN and as vLLM
0.32 derives its max_model_len from (40,960, the hub value, would cap it there). One
difference: the vocabulary is the local tokenizer's (~32,000 tokens, not 151,936), so sampled
ids always decode; the LM head is 0.13 B instead of 0.62 B parameters.
Needs `tokenizers` (pip install 'agentx-bench[hf]').
"""
from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

VOCAB = 32_000
CORPUS_BYTES = 4_000_000
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
THINK = ("<think>", "</think>")
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- elif message['content'] is not none -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}{%- endif -%}"
)
SHAPE = {"hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32,
         "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
         "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "max_position_embeddings": 131072,
         "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}


def _corpus() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
        total += len(texts[-1])
        if total >= CORPUS_BYTES:
            break
    return texts


def build_tokenizer(out: Path) -> tuple[dict[str, int], int]:
    """Train and save the tokenizer; returns the special tokens' ids and the vocab size."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(THINK), special_tokens=list(SPECIAL),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK])
    tok.save(str(out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in (*SPECIAL, *THINK)}
    _write(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {str(i): {"content": t, "special": t in SPECIAL,
                                          "lstrip": False, "rstrip": False,
                                          "normalized": False, "single_word": False}
                                 for t, i in ids.items()},
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
        "unk_token": None, "clean_up_tokenization_spaces": False,
        "model_max_length": 131072})
    return ids, tok.get_vocab_size(with_added_tokens=True)


def _write(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def build(out_dir: str | Path) -> Path:
    out = Path(out_dir)
    model, draft = out / "model", out / "eagle3"
    model.mkdir(parents=True, exist_ok=True)
    draft.mkdir(parents=True, exist_ok=True)
    ids, vocab = build_tokenizer(model)
    eos, pad = ids["<|im_end|>"], ids["<|endoftext|>"]
    _write(model / "config.json", {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab,
        "num_hidden_layers": 36, **SHAPE, "rope_scaling": YARN, "use_sliding_window": False,
        "max_window_layers": 36, "bos_token_id": pad, "eos_token_id": eos})
    _write(model / "generation_config.json",
           {"bos_token_id": pad, "eos_token_id": eos, "pad_token_id": pad})
    _write(draft / "config.json", {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "vocab_size": vocab, "draft_vocab_size": vocab, "target_hidden_size": 4096,
        "num_hidden_layers": 1, **SHAPE, "rope_scaling": YARN, "mlp_bias": False,
        "bos_token_id": pad, "eos_token_id": eos})
    return out


def main(argv: list[str]) -> int:
    out = build(argv[0] if argv else "qwen3-8b-dummy")
    print(f"model: {out / 'model'}\ndraft: {out / 'eagle3'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
