"""The chaos harness of tests/shell/test_chaos.py: a Docker socket proxy, a budget monitor,
a driver.

* :mod:`chaos.proxy` — a unix-socket forwarder the controller reaches Docker through
  (``DOCKER_HOST``), which the test can cut and restore, and which notes every
  container start / create request that passes, with Docker's answer;
* :mod:`chaos.monitor` — replays Docker's events in time order, keeps per role the sum
  of the reservations of the running containers and records any start the controller
  made that took a role over budget, and any double start;
* :mod:`chaos.driver` — the seeded random operations and the campaign around them;
* :mod:`chaos.mcp_flood` — a round of ``/mcp`` sessions opened without the token against
  the controller's API, then its memory and a client with the token.

Nothing here touches the daemon's own socket beyond being an ordinary client of it.
"""
