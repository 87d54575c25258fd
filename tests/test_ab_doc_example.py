"""docs/ab.md's offload example runs as written (issue 29 point 7): its trace snippet makes a
trace agentx loads, of the sizes the text gives, and each of its agentx command lines parses
with the flags it uses (the whole A/B, 2 x 10 s, was run by hand: docs/ab.md)."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from agentx.cli import build_parser, command_of

DOC = Path(__file__).resolve().parents[1] / "docs" / "ab.md"


def _example() -> str:
    text = DOC.read_text()
    start = text.index("## Example (simulator")
    return re.search(r"```bash\n(.*?)```", text[start:], re.S).group(1)


def test_the_offload_example_runs_as_written(tmp_path):
    block = _example()
    script = re.search(r"python3 - <<'EOF'\n(.*?)\nEOF\n", block, re.S).group(1)
    subprocess.run([sys.executable, "-c", script], cwd=tmp_path, check=True, timeout=60)
    from agentx.trace.load import load_traces

    traces = load_traces(str(tmp_path / "ab-trace"))
    assert len(traces.traces) == 30 and all(len(t.turns) == 8 for t in traces.traces)
    last = max(t.turns[-1].in_tokens for t in traces.traces)
    assert 4500 <= last <= 5500  # "sessions that grow to ~5,000 tokens"
    commands = [" ".join(c.split()) for c in
                block.split("\nEOF\n", 1)[1].replace("\\\n", " ").splitlines() if c.strip()]
    assert [c.split()[:2] for c in commands] == [["agentx", "serve-sim"]] * 2 + [["agentx", "ab"]]
    for c in commands:
        argv = shlex.split(c.rstrip("&"))[1:]
        args = build_parser(command_of(argv)).parse_args(argv)  # SystemExit on a bad flag
        assert args.command == argv[0]
    assert "--trace ab-trace" in commands[2]
