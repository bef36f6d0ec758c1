"""Docker: ``read`` observes containers and events (never mutates); ``actions`` starts,
stops and reads logs, and runs a serve's ``up`` command.

The only modules importing the ``docker`` SDK. They must not decide what to start or
stop: the executor tells them.
"""
