"""The reservation ledger (per GPU role: capacity, reserve, budget, committed MiB), the
persistent mapping it is built on, and where a serve was put (its GPU variables).

It must not import the flags, planning, the lifecycle or the answers: only the domain
types.
"""
