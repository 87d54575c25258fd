"""The recipe file: one YAML describing a vLLM deployment and the operating points to sweep.

Declared with the same `StrictModel`/`opt` machinery as RunConfig and SimConfig, so unknown
keys, wrong types and out-of-range values fail on load as one line naming file, line and
field. Checks that need several parts of the file at once (a point's GPUs against the
recipe's, K against the synthetic acceptance length) are `Recipe.problems()`, which the loader
turns into the same one-line error at the offending key (see recipe/load.py).
"""
from __future__ import annotations

from copy import copy
from typing import Any, Literal

from pydantic import ValidationError, create_model, model_validator

from ..config import RunConfig
from ..offload import NoOffload, Offload
from ..offload.base import Connector
from ..options import FieldError, StrictModel, input_error, opt

MAX_K = 16  # as the simulator's spec_k bound; vLLM itself only requires K > 0


def _partial(model: type[StrictModel], name: str) -> type[StrictModel]:
    """`model` with every field optional and unset by default, bounds and types kept: a
    recipe's per-cell run options are checked field by field against RunConfig itself."""
    fields: dict[str, Any] = {}
    for n, f in model.model_fields.items():
        info = copy(f)  # keeps the ge/le/min_length metadata
        info.default, info.default_factory = None, None
        fields[n] = (f.annotation | None, info)
    return create_model(name, __base__=StrictModel, **fields)


RunOptions = _partial(RunConfig, "RunOptions")


class KRule(StrictModel):
    """One entry of a per-operating-point K map (InferenceX's NUM_SPEC_TOKENS_MAP): the first
    rule whose given keys all match the point (and the cell's conc) sets K."""

    isl: int | None = opt(None, "the point's `isl` equals this", ge=1)
    tp: int | None = opt(None, "the point's tp equals this", ge=1)
    ep: int | None = opt(None, "the point's ep equals this", ge=1)
    dp_attention: bool | None = opt(None, "the point's dp_attention equals this")
    conc_min: int | None = opt(None, "conc >= this", ge=1)
    conc_max: int | None = opt(None, "conc <= this", ge=1)
    k: int = opt(..., "speculative tokens per step", ge=1, le=MAX_K)

    def needs_conc(self) -> bool:
        return self.conc_min is not None or self.conc_max is not None


class Speculative(StrictModel):
    method: Literal["eagle3", "eagle", "mtp", "ngram", "draft_model"] = opt(
        "eagle3", "vLLM speculative method")
    draft: str | None = opt(None, "draft model (HF id or path); not needed for mtp/ngram")
    k: int | None = opt(None, "num_speculative_tokens for every point (or give k_map)",
                        ge=1, le=MAX_K)
    k_map: list[KRule] = opt(None, "per-point K: first matching rule wins, `k` is the "
                             "fallback", factory=list)
    synthetic_al: float | Literal["golden"] | None = opt(
        None, "synthetic mean acceptance length (1..K+1), or `golden` to look it up")
    golden_file: str = opt("golden/minimaxm3_eagle3.yaml", "golden AL file, relative to the "
                           "recipe's directory")
    golden_model: str | None = opt(None, "key of the golden file (default: the draft)")
    attention_backend: str | None = opt(None, "the draft's attention backend (e.g. FLASH_ATTN)")
    extra: dict[str, Any] = opt(None, "more keys for --speculative-config", factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> Speculative:
        if self.k is None and not self.k_map:
            raise FieldError("k", "give k or k_map")
        if self.method in ("eagle3", "eagle", "draft_model") and not self.draft:
            raise FieldError("draft", f"method {self.method} needs a draft model")
        if isinstance(self.synthetic_al, float) and self.synthetic_al < 1.0:
            raise FieldError("synthetic_al", "must be >= 1")
        return self


class Point(StrictModel):
    """One server configuration of the search space, run at each of its concurrencies."""

    name: str | None = opt(None, "label used in result directories")
    tp: int = opt(1, "--tensor-parallel-size", ge=1)
    dp: int = opt(1, "--data-parallel-size", ge=1)
    ep: int = opt(1, "expert-parallel size: 1 = off, else tp*dp (--enable-expert-parallel)",
                  ge=1)
    dp_attention: bool = opt(False, "data-parallel attention (dp > 1, tp = 1 per rank)")
    isl: int | None = opt(None, "nominal input length, for K-map rules", ge=1)
    conc: list[int] = opt(..., "concurrencies to run", min_length=1)
    kv_offload: Offload | None = opt(None, "this point's CPU KV tier: a connector kind "
                                     "(`simple-cpu`) or a full kv_offload section")
    spec: bool = opt(True, "use the recipe's speculative decoding at this point")

    @model_validator(mode="after")
    def _consistent(self) -> Point:
        if any(c < 1 for c in self.conc):
            raise FieldError("conc", "concurrencies must be >= 1")
        if self.ep != 1 and self.ep != self.tp * self.dp:
            raise FieldError("ep", f"must be 1 or tp*dp = {self.tp * self.dp}")
        if self.dp_attention and self.dp < 2:
            raise FieldError("dp_attention", "needs dp >= 2")
        return self

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    def label(self, index: int) -> str:
        return self.name or f"p{index}-tp{self.tp}" + (f"-dp{self.dp}" if self.dp > 1 else "") \
            + ("-ep" if self.ep > 1 else "")


class Recipe(StrictModel):
    name: str | None = opt(None, "default: the file's stem")
    description: str = opt("", "one line for `agentx recipe list`")
    image: str | None = opt(None, "container image the command is meant for")
    vllm_version: str | None = opt(None, "vLLM version the recipe was written against")
    command: list[str] = opt(["vllm", "serve"], "server launcher; `vllm serve` takes the model "
                             "as its first argument, anything else gets --model",
                             min_length=1)
    model: str = opt(..., "HF id or path (${VAR} and ${VAR:-default} expand)", min_length=1)
    served_model_name: str | None = opt(None, "--served-model-name")
    tokenizer: str | None = opt(None, "--tokenizer")
    precision: Literal["bf16", "fp16", "fp32", "fp8", "fp4"] = opt(..., "weight precision")
    hardware: Literal["h200", "b300", "cpu"] = opt(..., "GPU type")
    gpus: int = opt(..., "GPUs the recipe may use", ge=1)
    load_format: str | None = opt(None, "--load-format (e.g. dummy)")
    gpu_memory_utilization: float | None = opt(None, "--gpu-memory-utilization", gt=0.0,
                                               le=1.0)
    block_size: int | None = opt(None, "--block-size", ge=1)
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"] | None = opt(
        None, "--kv-cache-dtype")
    attention_backend: str | None = opt(None, "--attention-backend")
    max_model_len: int | None = opt(None, "--max-model-len", ge=16)
    max_num_seqs: int | None = opt(None, "--max-num-seqs", ge=1)
    max_num_batched_tokens: int | None = opt(None, "--max-num-batched-tokens", ge=1)
    extra_args: list[str] = opt(None, "more vllm serve arguments, verbatim", factory=list)
    env: dict[str, str] = opt(None, "environment for the server", factory=dict)
    env_help: dict[str, str] = opt(None, "VAR -> how to set it, for a ${VAR} naming a local "
                                   "path (built assets): said when it is unset, or when "
                                   "launching finds the path missing", factory=dict)
    default_chat_template_kwargs: dict[str, Any] = opt(
        None, "--default-chat-template-kwargs, e.g. {enable_thinking: true}", factory=dict)
    speculative: Speculative | None = opt(None, "speculative decoding")
    kv_offload: Offload = opt(None, "CPU KV tier: `kind` (a connector of agentx.offload) and "
                              "its options", factory=NoOffload)
    points: list[Point] = opt(..., "the operating points (search space)", min_length=1)
    sim_profile: str | None = opt(None, "simulator profile for runs without GPU or vLLM")
    run: RunOptions = opt(None, "run options for every cell (RunConfig fields)",  # type: ignore[valid-type]
                          factory=RunOptions)
    health_timeout_s: float = opt(1800.0, "seconds `serve` waits for /health", gt=0.0)

    @property
    def thinking(self) -> bool:
        """The server's default thinking mode (chat templates default to thinking on)."""
        return bool(self.default_chat_template_kwargs.get("enable_thinking", True))

    def offload(self, point: Point) -> Connector:
        """The point's connector: its own kv_offload, else the recipe's. A point naming only
        a kind takes the recipe's section when the kind is the same, else that connector's
        defaults with the recipe's settings of the options it shares (the DRAM budget)."""
        p, base = point.kv_offload, self.kv_offload
        if p is None:
            return base
        if p.kind == base.kind and p.model_fields_set <= {"kind"}:
            return base
        shared = {k: v for k, v in base.model_dump(exclude_unset=True).items()
                  if k != "kind" and k in type(p).model_fields and k not in p.model_fields_set}
        return p.model_copy(update=shared)

    def run_options(self) -> dict:
        """The run options the recipe sets, as RunConfig keys."""
        return self.run.model_dump(exclude_unset=True)

    def problems(self) -> list[tuple[tuple, str]]:
        """Impossible combinations, each as (location in the file, message)."""
        out: list[tuple[tuple, str]] = []
        for i, p in enumerate(self.points):
            if p.gpus > self.gpus:
                out.append((("points", i, "tp"),
                             f"tp*dp = {p.tp}*{p.dp} = {p.gpus} > gpus = {self.gpus}"))
        s = self.speculative
        if s is not None:
            ks = {r.k for r in s.k_map} | ({s.k} if s.k is not None else set())
            if isinstance(s.synthetic_al, float) and s.synthetic_al > min(ks) + 1:
                out.append((("speculative", "synthetic_al"),
                            f"{s.synthetic_al} > K+1 = {min(ks) + 1} (K = {min(ks)})"))
            if s.k is None:
                for i, p in enumerate(self.points):
                    if not any(_rule_may_match(r, p) for r in s.k_map):
                        out.append((("points", i),
                                    "no k_map rule matches this point and no fallback k"))
        try:
            RunConfig.model_validate(self.run_options())
        except ValidationError as err:  # RunConfig's cross-field checks (start_min <= start_max)
            e = input_error(err, "run")
            out.append((("run", *(e.field or "").split(".")), e.message))
        return out


def _rule_may_match(r: KRule, p: Point) -> bool:
    """Whether `r` can match point `p` at some concurrency of it."""
    fixed = all(getattr(r, key) in (None, getattr(p, key))
                for key in ("isl", "tp", "ep", "dp_attention"))
    return fixed and any(_conc_ok(r, c) for c in p.conc)


def _conc_ok(r: KRule, conc: int) -> bool:
    return (r.conc_min is None or conc >= r.conc_min) and \
        (r.conc_max is None or conc <= r.conc_max)


def spec_k(recipe: Recipe, point: Point, conc: int | None) -> int | None:
    """K at this point and concurrency; None without speculative decoding. Raises ValueError
    when K depends on conc and none was given."""
    s = recipe.speculative
    if s is None or not point.spec:
        return None
    for r in s.k_map:
        if not all(getattr(r, key) in (None, getattr(point, key))
                   for key in ("isl", "tp", "ep", "dp_attention")):
            continue
        if r.needs_conc():
            if conc is None:
                raise ValueError("K depends on the concurrency at this point: give --conc")
            if not _conc_ok(r, conc):
                continue
        return r.k
    if s.k is None:
        raise ValueError(f"no k_map rule matches conc {conc}")
    return s.k
