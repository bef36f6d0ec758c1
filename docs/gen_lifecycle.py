"""Write ``docs/lifecycle.md`` from the lifecycle data in ``statemachine/lifecycle/machine.py``.

Usage (from the repository root, with the project installed in the venv)::

    .venv/bin/python docs/gen_lifecycle.py          # regenerate docs/lifecycle.md
    .venv/bin/python docs/gen_lifecycle.py --check  # exit 1 if it is out of date

The text itself comes from the pure :func:`statemachine.lifecycle.machine.lifecycle_markdown`;
this script is the only part that touches the file system.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from statemachine.lifecycle.machine import lifecycle_markdown

TARGET = Path(__file__).resolve().parent / "lifecycle.md"


def main(argv: Sequence[str] | None = None, *, target: Path = TARGET) -> int:
    """Write (or with ``--check`` compare) ``target``; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = lifecycle_markdown()
    if args.check:
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current != text:
            print(f"{target} is out of date; run: python docs/gen_lifecycle.py", file=sys.stderr)
            return 1
        return 0
    target.write_text(text, encoding="utf-8")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
