"""``python -m controller.cli``: the ``vramctl`` entry point (the commands live in
:mod:`controller.interfaces.cli`; ``app`` loads them on first use)."""

from typing import Any

from controller.interfaces.cli import main

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    """``app``: the typer app with every command (``controller.interfaces.cli``'s)."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from controller.interfaces.cli import app

    return app


if __name__ == "__main__":
    main()
