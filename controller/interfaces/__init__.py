"""The interfaces: how operators and tools reach the controller.

``cli`` (the ``vramctl`` commands), ``render`` (what they print), ``api`` (the HTTP API of
``vramctl run`` and its client side for ``up`` / ``down``), ``metrics`` (Prometheus).

They translate requests and answers; they must not decide (admission, conflicts, fit
are the pure core's), must not mutate the host except through the service, and the API
reads the loop only through its read-only view.
"""
