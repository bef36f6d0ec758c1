"""The answers built from one situation: fit, the planner's shortcut for one request,
pending requests, the ``up`` decision, the status report, a hypothetical serve.

It must not import nothing above it; it is the top wing (only controller/ imports it).
"""
