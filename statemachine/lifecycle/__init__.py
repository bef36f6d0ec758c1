"""The per-serve lifecycle machine, the record kept per serve, and failure backoff.

It must not import the answers.
"""
