"""The pure core of vramctl: domain types, the reservation ledger, the planner and the
per-serve lifecycle machine.

Nothing in this package does I/O, reads the clock, logs, or imports docker, pynvml,
httpx or anything from ``controller``: every function is a function of its arguments
(an import-linter contract in pyproject.toml keeps it so).
"""
