"""Logging set-up for the shell (loguru): human lines, or JSON with ``--log-json``.

Must not be imported by ``statemachine``; the core never logs.
"""

from __future__ import annotations

import logging
import os
import sys

from loguru import logger


def configure_logging(*, json_logs: bool = False, level: str | None = None) -> None:
    """One sink on stderr; ``json_logs`` serialises every record (with its bound fields).

    ``level`` defaults to ``VRAMCTL_LOG_LEVEL`` (``DEBUG`` adds each cycle's phases and
    the executor's step starts), else ``INFO``.
    """
    level = (level or os.environ.get("VRAMCTL_LOG_LEVEL") or "INFO").upper()
    logger.remove()
    if json_logs:
        logger.add(sys.stderr, level=level, serialize=True)
    else:
        logger.add(
            sys.stderr,
            level=level,
            format="<dim>{time:YYYY-MM-DDTHH:mm:ss.SSSZZ}</dim> "
            "<level>{level: <7}</level> {message}",
        )
    # the lifecycle library logs every state change at INFO; the executor says what matters
    logging.getLogger("transitions").setLevel(logging.WARNING)
