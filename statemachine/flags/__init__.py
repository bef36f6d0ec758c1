"""Enforcement: the flags that hold an engine to its reservation (the memory fraction, the
limits from the model's files, an engine's own idle sleep) and the one verdict on
whether a model loads in its reservation.

It must not import the ledger, planning, the lifecycle or the answers: only sizing,
engines and domain.
"""
