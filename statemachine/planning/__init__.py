"""The planner and what it is made of: the plan's types, admission, idleness, placement,
victim choice, expected reuse, deferral, what bringing a serve back costs, and the host
as a plan leaves it.

It must not import the lifecycle or the answers.
"""
