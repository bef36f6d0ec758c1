"""``python -m controller.cli``: the ``vramctl`` entry point (the commands live in
:mod:`controller.interfaces.cli`)."""

from controller.interfaces.cli import app, main

__all__ = ["app", "main"]

if __name__ == "__main__":
    main()
