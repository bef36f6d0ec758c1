"""``python -m controller.interfaces.cli``: the ``vramctl`` command line, as the console
script runs it. Holds nothing but the call."""

from controller.interfaces.cli import main

if __name__ == "__main__":
    main()
