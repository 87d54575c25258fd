"""The server behind a sweep's current cell, through agentx.targets: the given URL, or the
recipe's point launched (on vLLM or the simulator), relaunched when K changes with the
concurrency or the server died, stopped when the point changes."""
from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..errors import InputError
from ..recipe.schema import Recipe, spec_k
from ..targets.base import Server, Target
from ..targets.choice import RecipeChoice, UrlChoice
from ..targets.open import open_server
from ..targets.process import ServerStartError
from .cells import Cell
from .config import SweepConfig

Say = Callable[[str], None]


def choose(recipe: Recipe, path: Path, cfg: SweepConfig) -> UrlChoice | RecipeChoice:
    """What serves the cells (its `kind`: url, sim or vllm; `why`, for the console)."""
    if cfg.base_url:
        return UrlChoice(cfg.base_url)
    return RecipeChoice.of(recipe, path, sim=True if cfg.sim else None,
                           health_timeout_s=cfg.health_timeout_s,
                           sim_overrides={"time_scale": cfg.sim_time_scale}
                           if cfg.sim_time_scale else {})


def reset_prefix_cache(base_url: str) -> str:
    """POST /reset_prefix_cache; what happened, for the cell's record."""
    req = urllib.request.Request(base_url + "/reset_prefix_cache", data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return "reset" if resp.status == 200 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as e:
        return "not available" if e.code in (404, 405) else f"failed: HTTP {e.code}"
    except OSError as e:
        return f"failed: {e}"


class PointServers:
    """The target of the current cell; one launched server at a time."""

    def __init__(self, recipe: Recipe, path: Path, choice: UrlChoice | RecipeChoice,
                 say: Say) -> None:
        self.recipe, self.path, self.choice, self.say = recipe, path, choice, say
        self.kind = choice.kind
        self.server: Server | None = None
        self.key: tuple | None = None
        self.failed: tuple[tuple, str] | None = None  # a start that failed, not retried

    def target(self, cell: Cell) -> Target:
        if isinstance(self.choice, UrlChoice):
            return open_server(self.choice).start()
        point = self.recipe.points[cell.point]
        try:
            key = (cell.point, spec_k(self.recipe, point, cell.conc))
        except ValueError as e:
            raise InputError(str(self.path), str(e), field=f"points.{cell.point}") from None
        if self.failed and self.failed[0] == key:
            raise ServerStartError(f"the server for this point did not start: {self.failed[1]}")
        if self.server is not None and (self.key != key or self.died is not None):
            if self.died is not None:
                self.say(f"server exited with code {self.died}: relaunching")
            self.stop()
        if self.server is None:
            self.say(f"starting the server for point {cell.label} ({self.kind})")
            server = open_server(replace(self.choice, point=cell.point, conc=cell.conc,
                                         workdir=cell.dir.parent / "server"))
            try:
                server.start()
            except Exception as e:  # noqa: BLE001 - recorded for the point's remaining cells
                self.failed = (key, str(e).splitlines()[0])
                raise
            self.server, self.key = server, key
        assert self.server.target is not None
        return self.server.target

    @property
    def died(self) -> int | None:
        """The exit code of a launched server that exited on its own."""
        return self.server.exit_code() if self.server is not None else None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.server, self.key = None, None
