"""vramctl's imperative shell: everything that touches the world; the decisions live in
``statemachine``.

The layers, top to bottom (each may import only those below it; ``lint-imports``
checks the ``layers`` contract in ``pyproject.toml``):

- ``interfaces`` — CLI, rendering, HTTP API, metrics;
- ``service`` — the cycle, the executor, starts, the loop, the wiring;
- ``tools`` | ``adapters`` — offline tools | Docker, NVML, router, elastic, health;
- ``manifest`` | ``store`` | ``snapshot`` — the manifest set | journal and lock | the
  observation contract;
- ``statemachine`` (the pure core).

``logs`` (logging set-up) and ``cli`` (the ``python -m controller.cli`` entry point)
stay at the top. See docs/architecture.md.
"""
