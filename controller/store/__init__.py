"""The store: what survives a restart of the controller, and the lock that guards it.

``journal`` (SQLite: each cycle's inputs, plan and outcomes; on-demand requests; elastic
reserves; start reservations; ``up`` processes) and ``lock`` (one controller per state
directory). Its job is to record and give back faithfully. It must not plan, act on
the host or talk to the network.
"""
