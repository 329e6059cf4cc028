"""The ledger's database: SQLite by default, PostgreSQL by URL, migrated with Alembic on open.

Every write is idempotent: a segment is keyed by its workload's uid and start, an interval by
its key and start, so replaying events (after a crash, a restart, a database outage) neither
loses nor duplicates anything.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, Table, and_, create_engine, func, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError

from gpufleet import redact
from gpufleet.lifecycle import OUTCOMES, STILL_RUNNING, LifecycleEvent

from .cost import Interval, Segment
from .hosts import HostUse, Totals
from .schema import alert_state, audit, capacity, deliveries, host_usage, reservations, segments

MIGRATIONS = Path(__file__).parent / "migrations"
# an open interval whose values did not change is marked seen at most this often
HEARTBEAT = timedelta(seconds=60)
# an open interval not seen for longer than this was left by a stopped controller: it is
# closed where it was last seen, not stretched over a time nobody observed
STALE_AFTER = timedelta(minutes=5)


class LedgerError(Exception):
    """The ledger cannot be opened; the message says which and why."""


def ledger_url(target: str) -> str:
    """A database URL from a URL or a file path (a path is a SQLite file)."""
    if "://" in target:
        return target
    return f"sqlite:///{Path(target).expanduser().resolve()}"


def _naive(at: datetime) -> datetime:
    """UTC without tzinfo: how both SQLite and PostgreSQL `timestamp` columns keep it."""
    if at.tzinfo is not None:
        at = at.astimezone(UTC).replace(tzinfo=None)
    return at


def _aware(at: datetime | None) -> datetime | None:
    return at.replace(tzinfo=UTC) if at is not None else None


@dataclass(frozen=True)
class LiveWorkload:
    """A workload as the cluster shows it now, to close or open segments a crash left."""

    uid: str
    state: str  # the GPUWorkload state
    admitted_at: datetime | None
    ended_at: datetime | None  # preemptedAt or finishedAt, whichever applies
    admission: LifecycleEvent | None  # the event that opened its current segment, if admitted


class Ledger:
    """One ledger database. With `cluster`, this writer is that cluster's of a fleet whose
    clusters share the database: its rows carry the name, and what it closes because its
    cluster no longer shows it (reconcile, close_intervals) is only its own. Without, the
    rows of no cluster (a ledger of one cluster)."""

    def __init__(self, engine: Engine, cluster: str | None = None) -> None:
        self.engine = engine
        self.cluster = cluster

    def _own(self, table: Table) -> Any:
        """The condition that keeps this writer's rows of `table`."""
        column = table.c.cluster
        return column.is_(None) if self.cluster is None else column == self.cluster

    @property
    def url(self) -> str:
        """Where the ledger is, its password hidden: the only form of the URL ever shown."""
        return self.engine.url.render_as_string(hide_password=True)

    def redacted(self, text: str) -> str:
        """`text` (an error from the database driver) without the ledger's password."""
        password = self.engine.url.password
        return redact.scrub(text, [str(password)] if password else [])

    # --- writes --------------------------------------------------------------------------

    def apply(self, events: Sequence[LifecycleEvent]) -> None:
        """Record lifecycle events, in one transaction."""
        with self.engine.begin() as conn:
            self._apply(conn, events)

    def _apply(self, conn: Connection, events: Sequence[LifecycleEvent]) -> None:
        for event in events:
            if event.transition.starts_segment:
                self._open(conn, event)
            elif event.transition.ends_segment:
                self._close(conn, event.uid, event.at, OUTCOMES[event.transition], event)

    def _open(self, conn: Connection, event: LifecycleEvent) -> None:
        at = _naive(event.at)
        current = conn.execute(
            select(segments.c.id, segments.c.started_at).where(
                segments.c.uid == event.uid, segments.c.ended_at.is_(None)
            )
        ).first()
        if current is not None:
            if current.started_at == at:
                return  # recorded already
            # an admission whose end was never seen: it ended when the next began
            conn.execute(
                update(segments)
                .where(segments.c.id == current.id)
                .values(ended_at=at, outcome="preempted", reason="Superseded")
            )
        exists = conn.execute(
            select(segments.c.id).where(segments.c.uid == event.uid, segments.c.started_at == at)
        ).first()
        if exists is not None:
            return  # a replay of a segment that has ended since
        conn.execute(
            segments.insert().values(
                uid=event.uid,
                workload=event.workload,
                namespace=event.namespace,
                team=event.team,
                workload_class=event.workload_class,
                pool=event.pool,
                gpu_type=event.gpu_type,
                gpus=event.gpus,
                nodes=event.nodes,
                price_per_gpu_hour=event.price_per_gpu_hour,
                started_at=at,
                outcome=STILL_RUNNING,
                cluster=self.cluster,
                submitter=event.submitter,
                capacity_type=event.capacity_type,
            )
        )

    def _close(
        self,
        conn: Connection,
        uid: str,
        at: datetime,
        outcome: str,
        event: LifecycleEvent | None = None,
    ) -> None:
        values: dict[str, Any] = {"ended_at": _naive(at), "outcome": outcome}
        if event is not None:
            values["reason"] = (event.reason or "")[:128] or None
            values["lost_gpu_seconds"] = event.lost_gpu_seconds
        conn.execute(
            update(segments)
            .where(
                segments.c.uid == uid,
                segments.c.ended_at.is_(None),
                segments.c.started_at <= _naive(at),
            )
            .values(**values)
        )

    def reconcile(self, live: Iterable[LiveWorkload], now: datetime) -> tuple[int, int]:
        """Make the open segments agree with the cluster after a restart or an outage: close
        those whose workload is gone or no longer holds GPUs (at the time the cluster says it
        stopped, else now) and open those of admitted workloads that have none. Returns
        (closed, opened)."""
        by_uid = {w.uid: w for w in live}
        closed = opened = 0
        with self.engine.begin() as conn:
            open_rows = conn.execute(
                select(segments.c.uid, segments.c.started_at).where(
                    segments.c.ended_at.is_(None), self._own(segments)
                )
            ).all()
            open_starts = {row.uid: row.started_at for row in open_rows}
            for row in open_rows:
                workload = by_uid.get(row.uid)
                started = _aware(row.started_at)
                if workload is None:
                    self._close(conn, row.uid, now, "cancelled")
                elif workload.admission is not None and workload.admitted_at == started:
                    continue  # still running the segment the ledger has open
                elif workload.state in ("Completed", "Failed"):
                    self._close(conn, row.uid, workload.ended_at or now, workload.state.lower())
                elif workload.admission is not None and workload.admitted_at is not None:
                    # admitted again since: the old segment ended no later than that
                    self._close(conn, row.uid, workload.admitted_at, "preempted")
                else:
                    self._close(conn, row.uid, workload.ended_at or now, "preempted")
                closed += 1
            for workload in by_uid.values():
                admission = workload.admission
                if admission is None or workload.admitted_at is None:
                    continue
                if open_starts.get(workload.uid) == _naive(workload.admitted_at):
                    continue
                self._open(conn, admission)
                opened += 1
        return closed, opened

    def observe_capacity(
        self,
        pool: str,
        gpu_type: str,
        price: float | None,
        gpus: float,
        allocated: float,
        unhealthy: float,
        at: datetime,
    ) -> None:
        values = {
            "gpu_type": gpu_type,
            "price_per_gpu_hour": price,
            "gpus": gpus,
            "allocated_gpus": allocated,
            "unhealthy_gpus": unhealthy,
        }
        self._observe(capacity, "pool", pool, values, at)

    def observe_reservation(
        self, name: str, team: str, pool: str, gpus: float, at: datetime
    ) -> None:
        self._observe(reservations, "name", name, {"team": team, "pool": pool, "gpus": gpus}, at)

    def close_intervals(self, table_name: str, keep: Iterable[str], at: datetime) -> None:
        """Close the open intervals of keys no longer observed (a pool or reservation removed
        from git)."""
        table = {"capacity": capacity, "reservations": reservations}[table_name]
        key = table.c.pool if table is capacity else table.c.name
        with self.engine.begin() as conn:
            conn.execute(
                update(table)
                .where(table.c.ended_at.is_(None), key.not_in(list(keep)), self._own(table))
                .values(ended_at=_naive(at))
            )

    def write_recorded(
        self,
        events: Sequence[LifecycleEvent],
        pool_capacity: Sequence[Interval],
        reserved: Sequence[Interval],
    ) -> None:
        """Write a finished run (a simulation): its events and closed intervals, in one
        transaction; intervals recorded already (the same run written twice) are skipped."""
        with self.engine.begin() as conn:
            self._apply(conn, events)
            for table, key_column, rows in (
                (capacity, "pool", pool_capacity),
                (reservations, "name", reserved),
            ):
                for interval in rows:
                    values: dict[str, Any] = {"gpus": interval.gpus}
                    if table is capacity:
                        values.update(
                            gpu_type=interval.gpu_type,
                            price_per_gpu_hour=interval.price_per_gpu_hour,
                            allocated_gpus=interval.allocated_gpus,
                            unhealthy_gpus=interval.unhealthy_gpus,
                        )
                    else:
                        values.update(team=interval.team, pool=interval.pool)
                    start = _naive(interval.start)
                    if conn.execute(
                        select(table.c.id).where(
                            table.c[key_column] == interval.key, table.c.started_at == start
                        )
                    ).first():
                        continue
                    end = _naive(interval.end) if interval.end else start
                    conn.execute(
                        table.insert().values(
                            **{key_column: interval.key},
                            **values,
                            started_at=start,
                            ended_at=end,
                            seen_at=end,
                            cluster=self.cluster,
                        )
                    )

    def _observe(
        self, table: Table, key_column: str, key: str, values: dict[str, Any], at: datetime
    ) -> None:
        at = _naive(at)
        key_col = table.c[key_column]
        with self.engine.begin() as conn:
            row = conn.execute(
                select(table).where(key_col == key, table.c.ended_at.is_(None), self._own(table))
            ).first()
            if row is not None:
                same = all(row._mapping[k] == v for k, v in values.items())
                stale = at - row.seen_at > STALE_AFTER
                if same and not stale:
                    if at - row.seen_at >= HEARTBEAT:
                        conn.execute(update(table).where(table.c.id == row.id).values(seen_at=at))
                    return
                if at <= row.started_at:
                    return  # an observation older than the open interval: nothing to learn
                # a change ends the interval now; a gap nobody observed ends it where last seen
                end = row.seen_at if stale else at
                conn.execute(update(table).where(table.c.id == row.id).values(ended_at=end))
            with contextlib.suppress(IntegrityError):  # the same observation, recorded already
                conn.execute(
                    table.insert().values(
                        **{key_column: key},
                        **values,
                        started_at=at,
                        seen_at=at,
                        cluster=self.cluster,
                    )
                )

    # --- reads ---------------------------------------------------------------------------

    def span(self, now: datetime) -> tuple[datetime, datetime] | None:
        """(first, last) moment the ledger knows of; `now` where a segment is still open.
        None for an empty ledger."""
        with self.engine.connect() as conn:
            first = [
                conn.execute(select(func.min(t.c.started_at))).scalar()
                for t in (segments, capacity)
            ]
            first.append(conn.execute(select(func.min(host_usage.c.at))).scalar())
            last = [
                conn.execute(select(func.max(segments.c.ended_at))).scalar(),
                conn.execute(select(func.max(capacity.c.seen_at))).scalar(),
                conn.execute(select(func.max(host_usage.c.at))).scalar(),
            ]
            still_open = conn.execute(
                select(segments.c.id).where(segments.c.ended_at.is_(None)).limit(1)
            ).first()
        starts = [_aware(x) for x in first if x is not None]
        ends = [_aware(x) for x in last if x is not None]
        if not starts:
            return None
        end = max([e for e in ends if e is not None], default=now)
        if still_open is not None:
            end = max(end, now)
        return min(s for s in starts if s is not None), end

    def segments(self, since: datetime, until: datetime) -> list[Segment]:
        """Segments that overlap [since, until)."""
        since_n, until_n = _naive(since), _naive(until)
        query = select(segments).where(
            segments.c.started_at < until_n,
            or_(segments.c.ended_at.is_(None), segments.c.ended_at > since_n),
        )
        with self.engine.connect() as conn:
            return [
                Segment(
                    uid=row.uid,
                    workload=row.workload,
                    namespace=row.namespace,
                    team=row.team,
                    workload_class=row.workload_class,
                    pool=row.pool,
                    gpu_type=row.gpu_type,
                    gpus=row.gpus,
                    nodes=row.nodes,
                    price_per_gpu_hour=row.price_per_gpu_hour,
                    start=_aware(row.started_at) or since,
                    end=_aware(row.ended_at),
                    outcome=row.outcome,
                    reason=row.reason,
                    lost_gpu_seconds=row.lost_gpu_seconds,
                    cluster=row.cluster,
                    submitter=row.submitter,
                    capacity_type=row.capacity_type,
                )
                for row in conn.execute(query.order_by(segments.c.started_at, segments.c.id))
            ]

    def capacity(self, since: datetime, until: datetime) -> list[Interval]:
        return [
            Interval(
                key=row.pool,
                pool=row.pool,
                gpu_type=row.gpu_type,
                gpus=row.gpus,
                start=row.start,
                end=row.end,
                price_per_gpu_hour=row.price_per_gpu_hour,
                allocated_gpus=row.allocated_gpus,
                unhealthy_gpus=row.unhealthy_gpus,
                cluster=row.cluster,
            )
            for row in self._intervals(capacity, since, until)
        ]

    def reservations(self, since: datetime, until: datetime) -> list[Interval]:
        return [
            Interval(
                key=row.name,
                pool=row.pool,
                gpu_type="",
                gpus=row.gpus,
                start=row.start,
                end=row.end,
                team=row.team,
                cluster=row.cluster,
            )
            for row in self._intervals(reservations, since, until)
        ]

    def _intervals(self, table: Table, since: datetime, until: datetime) -> list[Any]:
        """Rows overlapping [since, until) with aware `start` and `end` (an open interval ends
        where it was last seen)."""
        since_n, until_n = _naive(since), _naive(until)
        query = select(table).where(
            table.c.started_at < until_n,
            or_(
                and_(table.c.ended_at.is_(None), table.c.seen_at > since_n),
                table.c.ended_at > since_n,
            ),
        )
        out = []
        with self.engine.connect() as conn:
            for row in conn.execute(query.order_by(table.c.started_at)):
                values = dict(row._mapping)
                values["start"] = _aware(row.started_at)
                values["end"] = _aware(row.ended_at or row.seen_at)
                out.append(SimpleNamespace(**values))
        return out

    # --- hosts outside Kubernetes ----------------------------------------------------------

    def record_host_usage(self, rows: Sequence[HostUse]) -> None:
        if not rows:
            return
        with self.engine.begin() as conn:
            conn.execute(
                host_usage.insert(),
                [
                    {"host": r.host, "workload": r.workload, "at": _naive(r.at),
                     "gpu_hours": r.gpu_hours, "idle_gpu_hours": r.idle_gpu_hours,
                     "cluster": self.cluster}
                    for r in rows
                ],
            )  # fmt: skip

    def host_usage_totals(self) -> Totals:
        """Each host's and workload's GPU-hours and idle GPU-hours this writer recorded."""
        query = (
            select(
                host_usage.c.host,
                host_usage.c.workload,
                func.sum(host_usage.c.gpu_hours),
                func.sum(host_usage.c.idle_gpu_hours),
            )
            .where(self._own(host_usage))
            .group_by(host_usage.c.host, host_usage.c.workload)
        )
        with self.engine.connect() as conn:
            return {(r[0], r[1]): (float(r[2]), float(r[3])) for r in conn.execute(query)}

    def host_usage(self, since: datetime, until: datetime) -> list[HostUse]:
        """The rows recorded in [since, until]: a row at `until` (the ledger's last record,
        where a window ends by default) is of the window."""
        query = select(host_usage).where(
            host_usage.c.at >= _naive(since), host_usage.c.at <= _naive(until)
        )
        with self.engine.connect() as conn:
            return [
                HostUse(
                    r.host,
                    r.workload,
                    _aware(r.at) or since,
                    r.gpu_hours,
                    r.idle_gpu_hours,
                    r.cluster,
                )
                for r in conn.execute(query.order_by(host_usage.c.at, host_usage.c.id))
            ]

    # --- notifications: the delivery log and what the alerts remember ---------------------

    def record_delivery(self, row: dict[str, Any]) -> None:
        """Append one delivery (the columns of `deliveries` but id and cluster)."""
        values = {**row, "cluster": self.cluster}
        values["at"], values["happened_at"] = _naive(row["at"]), _naive(row["happened_at"])
        values["title"], values["dedup_key"] = row["title"][:512], row["dedup_key"][:512]
        with self.engine.begin() as conn:
            conn.execute(deliveries.insert().values(**values))

    def deliveries(
        self,
        since: datetime,
        until: datetime,
        limit: int = 500,
        **match: str | None,
    ) -> list[dict[str, Any]]:
        """Deliveries in [since, until], newest first, at most `limit`; `match` keeps those
        whose route, kind, team, outcome or cluster is the one given (None: any)."""
        query = select(deliveries).where(
            deliveries.c.at >= _naive(since), deliveries.c.at <= _naive(until)
        )
        for column, value in match.items():
            if value is not None:
                query = query.where(deliveries.c[column] == value)
        query = query.order_by(deliveries.c.at.desc(), deliveries.c.id.desc()).limit(limit)
        with self.engine.connect() as conn:
            rows = [dict(r._mapping) for r in conn.execute(query)]
        for row in rows:
            row["at"], row["happened_at"] = _aware(row["at"]), _aware(row["happened_at"])
        return rows

    def delivered(self, since: datetime) -> list[tuple[str, str, datetime]]:
        """(route, dedup key, when) of what this writer's routes delivered since `since`:
        a restarted controller does not send them again within their dedupWindow."""
        query = select(deliveries.c.route, deliveries.c.dedup_key, deliveries.c.at).where(
            deliveries.c.at >= _naive(since),
            deliveries.c.outcome == "sent",
            self._own(deliveries),
        )
        with self.engine.connect() as conn:
            return [(r[0], r[1], _aware(r[2]) or since) for r in conn.execute(query)]

    def _state_key(self, name: str) -> str:
        return f"{self.cluster or ''}/{name}"

    def save_alert_state(self, name: str, state: dict[str, Any], at: datetime) -> None:
        key = self._state_key(name)
        with self.engine.begin() as conn:
            conn.execute(alert_state.delete().where(alert_state.c.key == key))
            conn.execute(
                alert_state.insert().values(
                    key=key, state=json.dumps(state, sort_keys=True), updated_at=_naive(at)
                )
            )

    def alert_state(self, name: str) -> dict[str, Any] | None:
        query = select(alert_state.c.state).where(alert_state.c.key == self._state_key(name))
        with self.engine.connect() as conn:
            text = conn.execute(query).scalar()
        return json.loads(text) if text else None

    # --- the audit log (append-only) -----------------------------------------------------

    def audit(self, **row: Any) -> int:
        """Append one audit row; returns its id."""
        row["at"] = _naive(row["at"])
        with self.engine.begin() as conn:
            inserted = conn.execute(audit.insert().values(**row))
            key = inserted.inserted_primary_key
            return int(key[0]) if key else 0

    def audit_log(self, proposal: int | None = None) -> list[dict[str, Any]]:
        """Audit rows, oldest first; with `proposal`, that proposal and the rows about it."""
        query = select(audit).order_by(audit.c.id)
        if proposal is not None:
            query = query.where(or_(audit.c.id == proposal, audit.c.proposal == proposal))
        with self.engine.connect() as conn:
            rows = [dict(r._mapping) for r in conn.execute(query)]
        for row in rows:
            row["at"] = _aware(row["at"])
        return rows

    def close(self) -> None:
        self.engine.dispose()


def open_ledger(target: str, create: bool = True, cluster: str | None = None) -> Ledger:
    """Open (and migrate to the newest schema) the ledger at `target`, a URL or a file path,
    as the writer of `cluster` (see `Ledger`). With `create=False` a SQLite file that does not
    exist is an error, not a new ledger."""
    url = ledger_url(target)
    if url.startswith("sqlite:///") and not create:
        path = Path(url.removeprefix("sqlite:///"))
        if not path.exists():
            raise LedgerError(
                f"no ledger at {path}: give the file `gpufleet simulate --ledger` or the "
                "controller wrote, or a database URL"
            )
    try:
        engine = create_engine(url, pool_pre_ping=True)
    except (ArgumentError, ImportError) as err:
        raise LedgerError(
            f"cannot use ledger {redact.url(repr(target))}: {redact.url(str(err))} "
            "(give a file path or a URL such as postgresql+psycopg://user@host/db)"
        ) from None
    ledger = Ledger(engine, cluster)
    try:
        migrate(engine)
    except OperationalError as err:
        engine.dispose()
        raise LedgerError(
            f"cannot open ledger {ledger.url}: {ledger.redacted(str(err.orig))}"
        ) from None
    return ledger


def migrate(engine: Engine) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
