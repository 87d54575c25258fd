"""`agentx recipe list|render`: the shipped recipes, or one operating point as the exact
server command, environment, generated files and DRAM arithmetic."""
from __future__ import annotations

import argparse
import sys

from ..options import StrictModel, add_arguments, from_args, opt


class RecipePoint(StrictModel):
    """One operating point of a recipe on a host and port (`recipe render`, `serve`)."""

    recipe: str = opt("", "recipe name (recipes/NAME.yaml) or file", positional=True,
                      metavar="NAME|PATH", min_length=1)
    point: int = opt(0, "operating point index", ge=0, metavar="I")
    conc: int | None = opt(None, "concurrency (needed when K depends on it)", ge=1,
                           metavar="C")
    host: str = opt("127.0.0.1", "address the server listens on")
    port: int = opt(8000, "port the server listens on", ge=0, le=65535)


class RenderOptions(RecipePoint):
    host_dram_mib: int | None = opt(None, "the GPU host's DRAM to budget the KV offload tier "
                                    "from (MiB, `free -m` there), overriding the recipe; a "
                                    "recipe saying host_dram_mib: auto otherwise reads this "
                                    "machine's", ge=1)
    workdir: str = opt(".", "where generated files go")


def configure(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    rsub = p.add_subparsers(dest="recipe_command", required=True)
    rsub.add_parser("list", help="the shipped recipes").set_defaults(func=list_main)
    r = rsub.add_parser("render", help="print the exact server command, environment, generated "
                        "files and DRAM arithmetic of one operating point")
    add_arguments(r, RenderOptions)
    r.set_defaults(func=render_main)


def list_main(args: argparse.Namespace) -> int:
    from ..recipe.load import load_recipe, recipe_names, recipes_dir

    print(f"recipes in {recipes_dir()}:")
    for name in recipe_names():
        recipe, _ = load_recipe(name)
        print(f"  {name:<28} {recipe.hardware} x{recipe.gpus}, {len(recipe.points)} point(s)"
              f"  {recipe.description}")
    return 0


def render_main(args: argparse.Namespace) -> int:
    return render(from_args(args, RenderOptions))


def render(o: RenderOptions) -> int:
    from ..errors import InputError
    from ..offload import dram
    from ..recipe.load import line_in, load_recipe
    from ..recipe.render import render as render_point

    recipe, path = load_recipe(o.recipe)
    try:
        r = render_point(recipe, o.point, conc=o.conc, host=o.host, port=o.port,
                         workdir=o.workdir, recipe_dir=path.parent,
                         host_dram_mib=o.host_dram_mib, source=str(path))
    except InputError as e:
        if e.source == str(path) and e.field and e.line is None:
            e.line = line_in(path, e.field)  # point at the key to change
        raise
    sys.stdout.write(r.script())
    if any(dram.FROM_THIS_MACHINE in step for step in r.dram_steps):
        print("agentx recipe render: note: the DRAM budget above is this machine's memory, "
              "not the GPU host's: give --host-dram-mib MIB (`free -m` on that host)",
              file=sys.stderr)
    return 0
