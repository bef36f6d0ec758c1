"""vramctl's imperative shell: manifest loading, adapters, executor, loop, API and CLI.

Everything that touches the world lives here; the decisions live in ``statemachine``.
"""
