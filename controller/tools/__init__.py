"""The tools: offline checks that read recorded or declared state and change nothing.

``replay`` (re-plan the journal's recorded cycles or a saved snapshot and show the
differences) and ``compose_lint`` (compose files whose engine flags disagree with the
manifest's reservations). They must not act on the host or the journal.
"""
