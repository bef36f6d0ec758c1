"""The service: one reconcile cycle and the loop that runs it.

``observe`` (the host as a snapshot, through the adapters), ``cycle`` (observe → plan →
execute → journal, the one sequence ``apply`` and ``run`` share), ``executor`` (the only
code that mutates containers or calls the router and engines; it drives the lifecycle
machine), ``steps`` (its step handlers, one module per family, and their dispatch
table), ``steps.sleep`` (its sleep and wake steps), ``preflight`` (what it checks
before a plan's first mutation), ``starts`` (starts carried out beside the loop),
``loop`` (triggers, backoff bookkeeping, the state the interfaces read), ``wiring``
(builds the executor and its adapters from the options), ``request_queue`` (the FIFO
per GPU role of ``up`` requests that wait for room) and ``queue_pump`` (admits them
beside the loop as room frees, with the pure up decision).

It carries decisions out; it must not make them. What to start, stop, shrink or hold,
who may be requested and how long a failure waits are the pure core's
(``statemachine``). It must not serve HTTP or print for an operator (``interfaces``).
"""
