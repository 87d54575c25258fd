"""Run inside the vLLM venv: does vLLM itself accept each rendered server command?

Usage: `<vllm venv python> check_recipe_configs.py CASES.json OUT.json`. Each case is
{"id", "args" (the server arguments, model given as --model), "draft" (a local EAGLE3 dir
standing in for a hub draft), "target" (a local model dir for the target's config),
"mooncake_config" (path or null), "segment_bytes" (expected or null)}. For each case:

1. vLLM's own CLI parser (`make_arg_parser(FlexibleArgumentParser())`, as the OpenAI server
   builds it) parses the arguments: unknown flags, bad choices, and `--kv-transfer-config`
   (parsed straight into `KVTransferConfig`, a pydantic dataclass with extra="forbid") fail
   here; then `AsyncEngineArgs.from_cli_args`.
2. `--speculative-config` is only a dict at that point, so `SpeculativeConfig(**it)` is built
   with the target's `ModelConfig` (the rendered model and --max-model-len when it is a local
   directory, else the tiny test model) and the draft swapped for the tiny EAGLE3 draft when
   it is a hub id (no download here); every other key is validated as given
   (extra="forbid", method, K, synthetic acceptance, attention backend name).
3. The connector name must be registered in `KVConnectorFactory`, and every
   `kv_connector_extra_config` key must be one the connector's source reads (vLLM ignores
   unknown extra keys silently; a typo would pass unnoticed).
4. The Mooncake config file loads through `MooncakeStoreConfig.from_file` (vLLM's parser of
   MOONCAKE_CONFIG_PATH) and its segment size equals the expected bytes.

Writes {"id": {"ok": bool, "error": str}} to OUT.json.
"""
from __future__ import annotations

import contextlib
import io
import json
import re
import sys
import traceback
from pathlib import Path

CONNECTOR_SOURCES = {  # where each connector reads kv_connector_extra_config
    "SimpleCPUOffloadConnector": [
        "distributed/kv_transfer/kv_connector/v1/simple_cpu_offload_connector.py"],
    "MooncakeStoreConnector": ["distributed/kv_transfer/kv_connector/v1/mooncake/store"],
    "LMCacheConnectorV1": ["distributed/kv_transfer/kv_connector/v1/lmcache_connector.py"],
}
_KEY_READ = re.compile(r"""(?:\.get\(\s*|\[)\s*["']([a-z_]+)["']""")


def _keys_read(vllm_dir: Path, connector: str) -> set[str]:
    keys: set[str] = set()
    for rel in CONNECTOR_SOURCES[connector]:
        p = vllm_dir / rel
        for f in ([p] if p.is_file() else sorted(p.glob("*.py"))):
            keys |= set(_KEY_READ.findall(f.read_text()))
    return keys


def check(case: dict, parser, vllm_dir: Path) -> None:
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.mooncake_store import MooncakeStoreConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(case["args"])
    except SystemExit:
        msg = " | ".join(x.strip() for x in err.getvalue().splitlines()
                         if x.strip() and not x.startswith("usage:"))
        raise ValueError(f"vLLM's argument parser rejected the command: {msg[-1500:]}") from None
    engine = AsyncEngineArgs.from_cli_args(ns)
    spec = engine.speculative_config
    if spec is not None:
        spec = dict(spec)
        if spec.get("model") and not Path(spec["model"]).exists():
            spec["model"] = case["draft"]
        # a local model (tiny-cpu, the Qwen3-8B-shaped dummy) is the target as rendered,
        # with its --max-model-len; a hub id is replaced by the local tiny model
        local = Path(engine.model).is_dir()
        target_dir = engine.model if local else case["target"]
        target = ModelConfig(model=target_dir, tokenizer=target_dir,
                             max_model_len=engine.max_model_len if local else None)
        SpeculativeConfig(**spec, target_model_config=target,
                          target_parallel_config=ParallelConfig())
    kv = engine.kv_transfer_config
    if kv is not None:
        if kv.kv_connector not in KVConnectorFactory._registry:
            raise ValueError(f"unknown kv_connector {kv.kv_connector!r}")
        unread = set(kv.kv_connector_extra_config) - _keys_read(vllm_dir, kv.kv_connector)
        if unread:
            raise ValueError(f"{kv.kv_connector} does not read kv_connector_extra_config "
                             f"keys {sorted(unread)}")
    if case.get("mooncake_config"):
        mc = MooncakeStoreConfig.from_file(case["mooncake_config"])
        if mc.global_segment_size != case["segment_bytes"]:
            raise ValueError(f"global_segment_size parsed as {mc.global_segment_size} bytes, "
                             f"expected {case['segment_bytes']}")


def main(argv: list[str]) -> int:
    import vllm
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cases = json.loads(Path(argv[0]).read_text())
    vllm_dir = Path(vllm.__file__).parent
    results = {}
    for case in cases:
        parser = make_arg_parser(FlexibleArgumentParser())
        try:
            check(case, parser, vllm_dir)
            results[case["id"]] = {"ok": True, "error": ""}
        except Exception as e:  # noqa: BLE001 - every failure is a result to report
            last = traceback.format_exception_only(type(e), e)[-1].strip()
            results[case["id"]] = {"ok": False, "error": f"{last}"[:2000]}
    Path(argv[1]).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
