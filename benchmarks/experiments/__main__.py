"""`python -m benchmarks.experiments NAME [ARGS...]`: run one experiment as its own `__main__`."""

from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).parent


def experiments() -> dict[str, str]:
    """name -> the first line of its docstring, for every experiment module here."""
    out = {}
    for path in sorted(HERE.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        out[path.stem] = doc.strip().splitlines()[0] if doc.strip() else ""
    return out


def main(argv: list[str]) -> int:
    known = experiments()
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.splitlines()[0] + "\n")
        for name, line in known.items():
            print(f"  {name:22s} {line}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in known:
        print(f"no experiment {name!r}; one of: {', '.join(known)}", file=sys.stderr)
        return 2
    sys.argv = [f"python -m benchmarks.experiments {name}", *rest]
    runpy.run_module(f"benchmarks.experiments.{name}", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
