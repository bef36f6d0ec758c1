"""Placement rounds: the campaign on three stand-in cards, with placement edits.

:class:`PlacementCampaign` is the :class:`~chaos.driver.Campaign` (the same faults, the
same monitor) on :data:`CARDS`: pinned serves and serves with ``placement = [...]``
(docs/placement.md), every container but one made by its ``up``, which passes the card
the controller told it (``VRAMCTL_GPU_ROLE``) into the container, so the monitor counts
each container on the card it was made for; ``fix1`` has no ``up``: its container,
made once for its home card, can only be started (re-pinned, it may not be). Its own
operations edit where serves may run, and the model follows each edit:

* ``repin`` — a pinned serve's ``gpu_role`` to another card; a placed serve to a
  pinned ``gpu_role`` (the card it runs on, or another); a serve placed at home back to
  its ``placement``;
* ``drop`` — a card out of a placed serve's ``placement`` (more often than not the
  card it runs on);
* ``add`` — a card into a placed serve's ``placement``.

Each is logged with the card the serve runs on at that moment. The final manifest
puts every serve back at home, where the desired ones fit with room to spare, and
settling waits until each runs on a card its declaration names and ``vramctl plan``
has nothing left to do. Nothing here touches the controller beyond its manifest, its
API, its Docker socket and its containers.
"""

from __future__ import annotations

import contextlib
from typing import ClassVar

from docker.errors import APIError, NotFound

from chaos.driver import Campaign, ServeDef, ServeState, Universe

#: card -> budget MiB; every card can hold every serve (base + 1000 at most)
CARDS = {"a": 12_000, "b": 9_000, "c": 8_000}

PLACED = Universe(
    CARDS,
    (
        ServeDef("pin1", "resident", 4000, 0.2, 2, "running", "running", role="a"),
        ServeDef("pin2", "evictable", 3000, 0.5, 0, "running", "running", role="b"),
        ServeDef("pl1", "evictable", 4000, 0.3, 1, "running", "running", placement=("a", "b")),
        ServeDef("pl2", "resident", 3000, 1.0, 1, "running", "running", placement=("b", "c")),
        ServeDef("od1", "on-demand", 5000, 0.5, 0, None, "stopped", placement=("a", "b", "c")),
        # no `up`: a container made once for c, which the controller can only start
        ServeDef("fix1", "evictable", 2000, None, 0, "running", "running", role="c"),
    ),
)
# the final manifest wants pin1 (a) 4000, pin2 (b) 3000, pl1 (a or b) 4000 and pl2 (b or
# c) 3000 running. With every running serve's start reservation at most base + 1000,
# pin1 + pl1 on a hold 10000 of 12000 and pin2 + pl2 on b 8000 of 9000: they all fit.
# b is tight: pin2, pl1 and pl2 all on b do not fit (10000 of 9000), so a placed serve
# that holds b when pin2 needs it has to make way. fix1 (c, 2000) fits beside pl2 on c


class PlacementCampaign(Campaign):
    """The campaign on :data:`PLACED`, with the placement edits (see the module)."""

    universe: ClassVar[Universe] = PLACED
    check_plan: ClassVar[bool] = True
    WEIGHTS: ClassVar[dict[str, int]] = {
        "repin": 14,
        "drop": 12,
        "add": 10,
        "edit": 10,
        "fault": 4,
        "api": 8,
        "kill": 8,
        "rm": 4,
        "outside_start": 5,
        "sigkill": 6,
        "cut": 4,
        "idle": 8,
    }

    def _off_card(self) -> list[str]:
        """Running serves whose container was made for a card they do not declare now."""
        return [
            s
            for s in self._running_serves()
            if (card := self.card_of(s)) is not None and card not in self.model[s].cards
        ]

    def op_kill(self) -> None:
        """``docker kill``, aimed more often than not: at a start in its health wait (a
        failed start: a backoff), or at a serve running off the cards it declares (its
        container, made for the old card, stays)."""
        aim = self.rng.random()
        serves: list[str] = []
        if aim < 0.35 and self._wait_for(lambda: bool(self.starting()), 3.0):
            # read once: a start seen in its wait may have ended by a second reading
            serves, why = list(self.starting()), "in its health wait"
        elif aim < 0.7:
            serves, why = list(self._off_card()), "running off its declared cards"
        if not serves:
            super().op_kill()
            return
        serve = self.rng.choice(serves)
        where = self._runs_on(serve)
        with contextlib.suppress(NotFound, APIError):
            self.client.api.kill(self.container_name(serve))
        self.log_op("docker-kill", f"{serve} ({why}, {where})")

    def _runs_on(self, serve: str) -> str:
        card = self.card_of(serve) if self.container_status(serve) == "running" else None
        return f"runs on {card}" if card else "does not run"

    def _save(self, kind: str, detail: str) -> None:
        by_rename = self.rng.random() < 0.5
        self.write_model(detail, by_rename=by_rename)
        self.log_op(kind, f"{detail} ({'by rename' if by_rename else 'in place'})")

    def op_repin(self) -> None:
        serve = self.rng.choice([n for n, st in self.model.items() if st.present])
        st, home, where = self.model[serve], self.defs[serve], self._runs_on(serve)
        was = _where(st)
        if st.placement:  # placed -> pinned: where it runs, or another card
            runs = self.card_of(serve)
            pick = runs if runs and self.rng.random() < 0.5 else self.rng.choice(sorted(CARDS))
            st.role, st.placement = pick, ()
        elif home.placement and self.rng.random() < 0.5:  # placed at home: back
            st.placement = home.placement
        else:
            st.role = self.rng.choice([c for c in sorted(CARDS) if c != st.role])
        self._save("repin", f"{serve} {was} -> {_where(st)}, {where}")

    def _placed(self, want: int) -> list[str]:
        """Present placed serves with at least ``want`` candidates (``-1``: with a card
        left to add)."""
        return [
            n
            for n, st in self.model.items()
            if st.present
            and st.placement
            and (len(st.placement) < len(CARDS) if want < 0 else len(st.placement) >= want)
        ]

    def op_drop(self) -> None:
        serves = self._placed(2)
        if not serves:
            self.log_op("drop", "no placed serve with two candidates", "skipped")
            return
        serve = self.rng.choice(serves)
        st, where, runs = self.model[serve], self._runs_on(serve), self.card_of(serve)
        mine = runs in st.placement and self.rng.random() < 0.6
        card = runs if mine and runs else self.rng.choice(st.placement)
        was = _where(st)
        st.placement = tuple(c for c in st.placement if c != card)
        self._save("drop", f"{serve} {was} -> {_where(st)} (drops {card}), {where}")

    def op_add(self) -> None:
        serves = self._placed(-1)
        if not serves:
            self.log_op("add", "no placed serve with a card left to add", "skipped")
            return
        serve = self.rng.choice(serves)
        st, where = self.model[serve], self._runs_on(serve)
        card = self.rng.choice([c for c in sorted(CARDS) if c not in st.placement])
        at = self.rng.randrange(len(st.placement) + 1)
        was = _where(st)
        st.placement = (*st.placement[:at], card, *st.placement[at:])
        self._save("add", f"{serve} {was} -> {_where(st)} (adds {card}), {where}")


def _where(st: ServeState) -> str:
    return f"placement [{', '.join(st.placement)}]" if st.placement else f"gpu_role {st.role}"
