"""Build, locally and in seconds, everything a real vLLM needs to serve a tiny model.

No hub access exists here, so the tests make their own model: a byte-level BPE tokenizer trained
on local text (Python stdlib sources plus agentx's prompt vocabulary, so that every ` word` of
agentx.tokens.words.WORDS is one token and the token-exact synthesis can use them), a ChatML
chat template with a Qwen3-style thinking switch, a 2-layer Qwen3-shaped model with random
weights and a 1-layer random EAGLE3 draft for it. Weights are written with numpy (no torch in
the project venv) as float32 safetensors; config says bfloat16 so vLLM casts at load time and
serves the usual dtype. Everything is seeded and cached under `<repo>/.cache/vllm-assets/<key>`,
where the key covers this recipe and the training corpus.

Usable as a script: `python tests/vllm_env/build_assets.py [OUT_DIR]` prints the paths and time.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO / ".cache" / "vllm-assets"
RECIPE_VERSION = "tiny-qwen3-v1"
SEED = 20240611

SERVED_NAME = "tiny"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
THINK_TOKENS = ("<think>", "</think>")  # added but not special: kept in decoded text, as Qwen3
VOCAB_TARGET = 8192
CORPUS_BYTES = 3_000_000  # stdlib text fed to the BPE trainer
WORD_REPEATS = 400  # how often each vocabulary word is shown to the trainer, with a leading space

# Model shape (Qwen3-style): tiny so a CPU serves it in seconds.
HIDDEN = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 32
INTERMEDIATE = 256
MAX_POSITIONS = 32768
# EAGLE3 reads hidden states of the target at these layer ids; vLLM's default (2, n//2, n-3)
# does not fit a 2-layer target.
EAGLE_AUX_LAYERS = [0, 1, 2]

# ChatML with Qwen3's thinking switch. Content may be a string or OpenAI parts (text parts are
# concatenated without separator), so vLLM detects the "openai" content format and passes parts
# through unchanged: the client renders exactly what the server renders.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' and message['reasoning_content'] is defined"
    " and message['reasoning_content'] -%}"
    "{{- '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- elif message['content'] is not none -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)


@dataclass(frozen=True)
class Assets:
    """Paths of one built asset set; the tokenizer lives in the model directory."""

    root: Path
    model_dir: Path
    eagle3_dir: Path
    vocab_size: int
    key: str
    served_name: str = SERVED_NAME

    @property
    def tokenizer_dir(self) -> Path:
        return self.model_dir


# ---------------------------------------------------------------- tokenizer

def _stdlib_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip"}
    files = [p for p in stdlib.rglob("*.py") if not skip.intersection(p.relative_to(stdlib).parts)]
    return sorted(files, key=lambda p: p.relative_to(stdlib).as_posix())


def _corpus() -> list[str]:
    """Deterministic training text: stdlib sources up to CORPUS_BYTES."""
    texts, total = [], 0
    for path in _stdlib_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        total += len(text)
        if total >= CORPUS_BYTES:
            break
    return texts


def _vocab_words() -> list[str]:
    sys.path.insert(0, str(REPO))
    try:
        from agentx.tokens.words import WORDS
    finally:
        sys.path.pop(0)
    return sorted(set(WORDS))


def _word_lines(words: list[str], rng: np.random.Generator) -> list[str]:
    """Lines of shuffled vocabulary words, each word WORD_REPEATS times with a leading space."""
    lines = []
    for _ in range(WORD_REPEATS):
        order = rng.permutation(len(words))
        lines.append("x" + "".join(" " + words[i] for i in order) + "\n")
    return lines


def asset_key() -> str:
    """Cache key: this recipe's source (any edit rebuilds), the training corpus and WORDS."""
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    for text in _corpus():
        h.update(text.encode())
    h.update("\n".join(_vocab_words()).encode())
    return f"{RECIPE_VERSION}-{h.hexdigest()[:12]}"


def build_tokenizer(out_dir: Path, rng: np.random.Generator) -> int:
    """Train the byte-level BPE and write tokenizer.json + tokenizer_config.json; returns size."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET, min_frequency=2, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = _corpus() + _word_lines(_vocab_words(), rng)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    tok.save(str(out_dir / "tokenizer.json"))

    added = {}
    for content in (*SPECIAL_TOKENS, *THINK_TOKENS):
        added[str(tok.token_to_id(content))] = {
            "content": content, "lstrip": False, "rstrip": False, "normalized": False,
            "single_word": False, "special": content in SPECIAL_TOKENS}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",  # loads tokenizer.json as is
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }
    _write_json(out_dir / "tokenizer_config.json", config)
    return tok.get_vocab_size(with_added_tokens=True)


# ---------------------------------------------------------------- weights

def _normal(rng: np.random.Generator, *shape: int, std: float = 0.02) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32)


def _decoder_layer(rng: np.random.Generator, prefix: str, *, in_dim: int, qk_norm: bool
                   ) -> dict[str, np.ndarray]:
    """One Llama/Qwen3 decoder layer; in_dim is the attention input width (2H for EAGLE3)."""
    t = {
        f"{prefix}.input_layernorm.weight": np.ones(HIDDEN, np.float32),
        f"{prefix}.post_attention_layernorm.weight": np.ones(HIDDEN, np.float32),
        f"{prefix}.self_attn.q_proj.weight": _normal(rng, HEADS * HEAD_DIM, in_dim),
        f"{prefix}.self_attn.k_proj.weight": _normal(rng, KV_HEADS * HEAD_DIM, in_dim),
        f"{prefix}.self_attn.v_proj.weight": _normal(rng, KV_HEADS * HEAD_DIM, in_dim),
        f"{prefix}.self_attn.o_proj.weight": _normal(rng, HIDDEN, HEADS * HEAD_DIM),
        f"{prefix}.mlp.gate_proj.weight": _normal(rng, INTERMEDIATE, HIDDEN),
        f"{prefix}.mlp.up_proj.weight": _normal(rng, INTERMEDIATE, HIDDEN),
        f"{prefix}.mlp.down_proj.weight": _normal(rng, HIDDEN, INTERMEDIATE),
    }
    if qk_norm:
        t[f"{prefix}.self_attn.q_norm.weight"] = np.ones(HEAD_DIM, np.float32)
        t[f"{prefix}.self_attn.k_norm.weight"] = np.ones(HEAD_DIM, np.float32)
    return t


def _save(out_dir: Path, tensors: dict[str, np.ndarray]) -> None:
    from safetensors.numpy import save_file

    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def build_model(out_dir: Path, vocab: int, eos_id: int, eot_id: int,
                rng: np.random.Generator) -> None:
    """Random 2-layer Qwen3ForCausalLM: config.json, generation_config.json, weights."""
    tensors = {"model.embed_tokens.weight": _normal(rng, vocab, HIDDEN),
               "model.norm.weight": np.ones(HIDDEN, np.float32),
               "lm_head.weight": _normal(rng, vocab, HIDDEN)}
    for i in range(LAYERS):
        tensors.update(_decoder_layer(rng, f"model.layers.{i}", in_dim=HIDDEN, qk_norm=True))
    _save(out_dir, tensors)
    _write_json(out_dir / "config.json", {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": LAYERS,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": eot_id,
        "eos_token_id": eos_id,
        "torch_dtype": "bfloat16",
    })
    _write_json(out_dir / "generation_config.json",
                {"bos_token_id": eot_id, "eos_token_id": eos_id, "pad_token_id": eot_id})


def build_eagle3(out_dir: Path, vocab: int, eos_id: int, eot_id: int,
                 rng: np.random.Generator) -> None:
    """Random 1-layer EAGLE3 draft (Llama layer on [embeds; fused aux hidden states])."""
    tensors = {
        "fc.weight": _normal(rng, HIDDEN, HIDDEN * len(EAGLE_AUX_LAYERS)),
        "midlayer.hidden_norm.weight": np.ones(HIDDEN, np.float32),
        "norm.weight": np.ones(HIDDEN, np.float32),
        "lm_head.weight": _normal(rng, vocab, HIDDEN),
        "embed_tokens.weight": _normal(rng, vocab, HIDDEN),
    }
    layer = _decoder_layer(rng, "midlayer", in_dim=2 * HIDDEN, qk_norm=False)
    tensors.update(layer)
    _save(out_dir, tensors)
    _write_json(out_dir / "config.json", {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "vocab_size": vocab,
        "draft_vocab_size": vocab,
        "hidden_size": HIDDEN,
        "target_hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": eot_id,
        "eos_token_id": eos_id,
        "torch_dtype": "bfloat16",
        # vLLM 0.32 reads the ids from eagle_config (model) and from the top level (aux-layer
        # selection in the target); both are set so neither falls back to the default.
        "eagle_aux_hidden_state_layer_ids": EAGLE_AUX_LAYERS,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": EAGLE_AUX_LAYERS},
    })


# ---------------------------------------------------------------- orchestration

def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def _assets_at(root: Path, key: str) -> Assets:
    meta = json.loads((root / "assets.json").read_text())
    return Assets(root=root, model_dir=root / "model", eagle3_dir=root / "eagle3",
                  vocab_size=meta["vocab_size"], key=key)


def _prune_stale(out_dir: Path, keep: str) -> None:
    """Drop asset sets of older recipes (about 20 MB each) so the cache does not grow."""
    for d in out_dir.glob(f"{RECIPE_VERSION.rsplit('-', 1)[0]}-*"):
        if d.is_dir() and d.name != keep:
            shutil.rmtree(d, ignore_errors=True)


def build_assets(out_dir: Path = CACHE_DIR) -> Assets:
    """Return the asset set under out_dir/<key>, building it first if absent (atomic rename)."""
    key = asset_key()
    root = Path(out_dir) / key
    if (root / "assets.json").exists():
        return _assets_at(root, key)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=out_dir))
    try:
        rng = np.random.default_rng(SEED)
        model_dir, eagle_dir = tmp / "model", tmp / "eagle3"
        model_dir.mkdir()
        eagle_dir.mkdir()
        t0 = time.monotonic()
        vocab = build_tokenizer(model_dir, rng)
        tok = json.loads((model_dir / "tokenizer.json").read_text())
        ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
        eos_id, eot_id = ids["<|im_end|>"], ids["<|endoftext|>"]
        build_model(model_dir, vocab, eos_id, eot_id, rng)
        build_eagle3(eagle_dir, vocab, eos_id, eot_id, rng)
        _write_json(tmp / "assets.json", {"key": key, "vocab_size": vocab,
                                          "build_seconds": round(time.monotonic() - t0, 2)})
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, root)
        except OSError:  # another process won the race: use theirs
            shutil.rmtree(tmp, ignore_errors=True)
        _prune_stale(Path(out_dir), keep=key)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _assets_at(root, key)


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else CACHE_DIR
    t0 = time.monotonic()
    assets = build_assets(out)
    print(f"assets {assets.key} (vocab {assets.vocab_size}) at {assets.root} "
          f"in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
