"""Domain types of the pure core (what the manifest wants, what the host shows) and the
value plumbing they are built with (the fast frozen-dataclass ``__init__``).

It must not import no other wing of statemachine/ (not even the engine registry: an
engine's name is a plain string here).
"""
