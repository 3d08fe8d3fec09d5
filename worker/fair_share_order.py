"""The order in which a free worker tries the waiting entries: owners by fewest jobs
running, then by whose turn came longest ago, then by their oldest job; an owner's own by
priority, then age. Pure: worker.fair_share reads the counts and takes. See docs/quotas.md."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

Owner = str | None  # None: an admin's job (admins share one turn)


@dataclass(frozen=True)
class Waiting:
    """An entry on the queue that competes for a worker."""

    entry: str
    owner: Owner
    priority: int  # core.spec.Priority.rank: higher goes first within the owner
    since: dt.datetime  # the job's creation (a direct entry's enqueue), in UTC


@dataclass(frozen=True)
class Shares:
    """What each owner runs now (job ids), may run at once (None: no limit), and when a
    worker last took one of its jobs (a number that grows with each take; 0: never); and the
    owners whose training hours of the trailing day are used up (none of theirs starts until
    some age out)."""

    running: Mapping[Owner, frozenset[str]]
    max_running: Mapping[Owner, int | None]
    last_turn: Mapping[Owner, int]
    out_of_hours: frozenset[Owner] = frozenset()  # at max_train_hours_per_day

    def count(self, owner: Owner) -> int:
        return len(self.running.get(owner, ()))

    def at_limit(self, owner: Owner) -> bool:
        if owner in self.out_of_hours:
            return True
        limit = self.max_running.get(owner)
        return limit is not None and self.count(owner) >= limit


def fair_order(waiting: Iterable[Waiting], shares: Shares) -> list[Waiting]:
    """The entries a free worker should try, best first: owners by fewest running, then by
    whose turn came longest ago, then by their oldest waiting job; an owner's own by
    priority, then age. Owners at their limit are left out: their jobs wait.

    The turn matters where running counts tie, which on a busy pool is every time a worker
    frees up: by the oldest job alone, the owner with a long backlog would win every tie,
    and one worker would serve its owners first in, first out."""
    by_owner: dict[Owner, list[Waiting]] = defaultdict(list)
    for w in waiting:
        by_owner[w.owner].append(w)
    owners = [o for o in by_owner if not shares.at_limit(o)]
    owners.sort(
        key=lambda o: (
            shares.count(o),
            shares.last_turn.get(o, 0),
            min(w.since for w in by_owner[o]),
        )
    )
    return [
        w
        for o in owners
        for w in sorted(by_owner[o], key=lambda w: (-w.priority, w.since, w.entry))
    ]
