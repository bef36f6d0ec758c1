"""The executor's step handlers, one module per family of steps.

``context`` holds one execution's state (:class:`~.context.RunContext`), ``lifecycle``
the moves of the serves' lifecycle machines, ``containers``, ``router`` and
``elastic`` the handlers of those step kinds (the sleep and wake steps are in
:mod:`controller.service.steps.sleep`), ``undo`` the compensation of a failed group,
and ``dispatch`` the table from each :class:`~statemachine.planning.plan_types.Action` to its
handler. ``results`` holds what the steps end in.

This package's ``__init__`` imports nothing: each module is imported by its own name.
"""
