"""The interfaces: how operators and tools reach the controller.

``cli`` (the ``vramctl`` commands: a package, one module per group of commands),
``render`` (what they print), ``api`` (the HTTP API of ``vramctl run``: a package, one
module per family of routes), ``client`` (its client side
for ``up`` / ``down`` / ``events``), ``redaction`` (what a read without the token holds,
for the API and the page alike), ``metrics`` (Prometheus).

They translate requests and answers; they must not decide (admission, conflicts, fit
are the pure core's), must not mutate the host except through the service, and the API
reads the loop only through its read-only view.
"""
