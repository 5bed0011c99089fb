#!/usr/bin/env python3
"""An SQS-style consumer that charges every order exactly once, although
its queue redelivers, reorders and duplicates messages, and the consumer
itself is SIGKILLed in the middle of a charge and restarted.

    python examples/consumer.py                  # starts its own 3-node cluster
    python examples/consumer.py --endpoints 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103
    python examples/consumer.py --no-once        # the same consumer without oncekv: double charges

What runs (all state the processes share lives in one SQLite file):

- a *queue* with SQS semantics: a received message becomes invisible for a
  visibility timeout and comes back if it is not deleted in time; receives
  return messages in random order; some receives hand out a message
  without hiding it (a duplicate delivery), some deletes are lost (the
  message comes back), and the producer enqueued some orders twice;
- a fake *payment provider* that keeps, per order, the highest fencing
  token it has seen and refuses any call with a lower one;
- a *consumer* process (`consume`) whose handler charges an order under
  `client.once(...)`: the claim's fence goes to the provider; a holder with
  `attempt > 1` (it took over from one that died) first reconciles — asks
  the provider whether the order was charged, which also raises the
  provider's fence so that the dead or stalled holder can never charge
  after it — and only charges if nothing was;
- the *orchestrator* (no sub-command): starts a cluster if none is given,
  fills the queue, runs a consumer, SIGKILLs it right after a charge and
  before its result is recorded, kills the cluster's leader, runs two
  consumers to drain the queue, and checks that every order was charged
  exactly once. Exit status 0 if so, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import oncekv  # noqa: F401  (installed: pip install ./clients/python)
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

VISIBILITY_S = 0.5
DUPLICATE_DELIVERY = 0.2
LOST_DELETE = 0.2


# ---- the shared state: queue and provider -----------------------------------


def connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    return db


def create(path: str, orders: int, rng: random.Random) -> None:
    db = connect(path)
    db.executescript(
        """
        CREATE TABLE messages (id INTEGER PRIMARY KEY, body TEXT NOT NULL,
                               visible_at REAL NOT NULL DEFAULT 0,
                               receives INTEGER NOT NULL DEFAULT 0,
                               deleted INTEGER NOT NULL DEFAULT 0);
        CREATE TABLE provider_fences (order_id TEXT PRIMARY KEY, fence INTEGER NOT NULL);
        CREATE TABLE provider_charges (order_id TEXT NOT NULL, cents INTEGER NOT NULL,
                                       fence INTEGER NOT NULL, receipt TEXT NOT NULL);
        CREATE TABLE provider_refusals (order_id TEXT NOT NULL, fence INTEGER NOT NULL);
        CREATE TABLE events (kind TEXT NOT NULL, order_id TEXT);
        """
    )
    bodies = [json.dumps({"order": f"order-{n}", "cents": 100 + n}) for n in range(1, orders + 1)]
    bodies += rng.sample(bodies, max(1, orders // 5))  # the producer sent some twice
    rng.shuffle(bodies)
    db.executemany("INSERT INTO messages (body) VALUES (?)", [(body,) for body in bodies])
    db.close()


class Queue:
    """SQS-like: receive hides a message for VISIBILITY_S; delete removes it.
    Random order, duplicate deliveries, lost deletes."""

    def __init__(self, db: sqlite3.Connection, rng: random.Random):
        self.db, self.rng = db, rng

    def receive(self, count: int = 4):
        now = time.time()
        self.db.execute("BEGIN IMMEDIATE")
        try:
            rows = self.db.execute(
                "SELECT id, body FROM messages WHERE deleted = 0 AND visible_at <= ? "
                "ORDER BY random() LIMIT ?", (now, count)).fetchall()
            for message_id, _ in rows:
                hide = 0 if self.rng.random() < DUPLICATE_DELIVERY else VISIBILITY_S
                self.db.execute("UPDATE messages SET visible_at = ?, receives = receives + 1 "
                                "WHERE id = ?", (now + hide, message_id))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return [(message_id, json.loads(body)) for message_id, body in rows]

    def delete(self, message_id: int) -> None:
        if self.rng.random() < LOST_DELETE:
            return  # the delete got lost: the message comes back
        self.db.execute("UPDATE messages SET deleted = 1 WHERE id = ?", (message_id,))

    def empty(self) -> bool:
        return self.db.execute("SELECT COUNT(*) FROM messages WHERE deleted = 0").fetchone()[0] == 0


class StaleFence(Exception):
    pass


class Provider:
    """A payment provider that refuses, per order, any fence lower than the
    highest it has seen (on a charge or a lookup)."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def _fence(self, order: str, fence: int) -> None:
        """Inside a transaction: refuse a stale fence, else remember it."""
        row = self.db.execute("SELECT fence FROM provider_fences WHERE order_id = ?",
                              (order,)).fetchone()
        if row is not None and fence < row[0]:
            self.db.execute("INSERT INTO provider_refusals VALUES (?, ?)", (order, fence))
            self.db.execute("COMMIT")
            raise StaleFence(f"{order}: fence {fence} is below {row[0]}")
        self.db.execute("INSERT OR REPLACE INTO provider_fences VALUES (?, ?)", (order, fence))

    def charge(self, order: str, cents: int, fence: int) -> str:
        self.db.execute("BEGIN IMMEDIATE")
        self._fence(order, fence)
        receipt = f"rcpt-{uuid.uuid4().hex[:10]}"
        self.db.execute("INSERT INTO provider_charges VALUES (?, ?, ?, ?)",
                        (order, cents, fence, receipt))
        self.db.execute("COMMIT")
        return receipt

    def lookup(self, order: str, fence: int):
        """The receipt of the order's charge, if any; raises the order's
        fence to `fence` (a holder below it can no longer charge)."""
        self.db.execute("BEGIN IMMEDIATE")
        self._fence(order, fence)
        row = self.db.execute("SELECT receipt FROM provider_charges WHERE order_id = ?",
                              (order,)).fetchone()
        self.db.execute("COMMIT")
        return row[0] if row else None


# ---- the consumer -----------------------------------------------------------


def consume(args) -> int:
    import oncekv

    rng = random.Random()
    db = connect(args.db)
    queue, provider = Queue(db, rng), Provider(db)
    client = oncekv.Client(args.endpoints, call_timeout=15)

    def event(kind, order=None):
        db.execute("INSERT INTO events VALUES (?, ?)", (kind, order))

    def charge(message, fence=0, attempt=1):
        order = message["order"]
        if attempt > 1:
            # Took over from a holder that died or stalled: it may have
            # charged. Ask, fencing it out at the same time.
            receipt = provider.lookup(order, fence)
            if receipt is not None:
                event("reconciled", order)
                return {"order": order, "receipt": receipt}
        receipt = provider.charge(order, message["cents"], fence)
        event("charged", order)
        if order == args.die_after_charging:
            # Tell the orchestrator we are between the charge and its record,
            # and wait for the SIGKILL.
            open(args.db + ".kill-point", "w").close()
            time.sleep(60)
        return {"order": order, "receipt": receipt}

    if not args.no_once:
        charge = client.once(
            lambda message: f"{args.run}/charge/{message['order']}",
            fingerprint=lambda message: f"charge {message['order']} {message['cents']} cents",
            lease=args.lease, wait=60,
        )(charge)

    parent = os.getppid()
    idle_since = time.monotonic()
    while True:
        if os.getppid() != parent:
            print("consumer: the orchestrator is gone", file=sys.stderr)
            return 1
        batch = queue.receive()
        if not batch:
            if queue.empty():
                break
            if time.monotonic() - idle_since > 60:
                print("consumer: queue stuck", file=sys.stderr)
                return 1
            time.sleep(0.05)
            continue
        idle_since = time.monotonic()
        for message_id, message in batch:
            try:
                charge(message)
            except (StaleFence, oncekv.OncekvError) as error:
                # Not deleted: the message comes back after the timeout.
                print(f"consumer {os.getpid()}: {message['order']}: {type(error).__name__}: "
                      f"{error}", file=sys.stderr)
                continue
            queue.delete(message_id)
    client.close()
    return 0


# ---- the orchestrator ---------------------------------------------------------


def spawn_consumer(args, db_path: str, endpoints: str, run: str, die_after: str = ""):
    command = [sys.executable, os.path.abspath(__file__), "consume", "--db", db_path,
               "--endpoints", endpoints, "--run", run, "--lease", str(args.lease)]
    if die_after:
        command += ["--die-after-charging", die_after]
    if args.no_once:
        command.append("--no-once")
    return subprocess.Popen(command)


def orchestrate(args) -> int:
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="oncekv-consumer-")
    db_path = os.path.join(work, "state.db")
    create(db_path, args.orders, rng)
    run = f"consumer-{uuid.uuid4().hex[:8]}"
    cluster = None
    if args.endpoints:
        endpoints = args.endpoints
    else:
        from oncekv.testing import LocalCluster, find_binary

        cluster = LocalCluster(find_binary(HERE), name="oncekv-consumer")
        cluster.start()
        endpoints = ",".join(cluster.endpoints)
        print(f"cluster: {endpoints}")
    consumers = []
    try:
        # Phase 1: one consumer, SIGKILLed right after it charged an order,
        # before the charge's result is recorded in oncekv.
        victim = f"order-{args.orders // 3}"
        first = spawn_consumer(args, db_path, endpoints, run, die_after=victim)
        consumers.append(first)
        deadline = time.monotonic() + 60
        while not os.path.exists(db_path + ".kill-point"):
            if first.poll() is not None or time.monotonic() > deadline:
                print("the first consumer never reached its kill point", file=sys.stderr)
                return 1
            time.sleep(0.01)
        first.send_signal(signal.SIGKILL)
        first.wait()
        print(f"killed consumer {first.pid} (SIGKILL) after it charged {victim}, before the "
              f"result was recorded")
        # Phase 2: the consumer restarted, and a second one beside it; the
        # cluster's leader dies while they work.
        consumers = [spawn_consumer(args, db_path, endpoints, run) for _ in range(2)]
        if cluster is not None:
            time.sleep(0.3)
            leader = cluster.wait_leader(30)
            cluster.kill(leader)
            print(f"killed the cluster's leader, node {leader}")
        codes = [consumer.wait(timeout=180) for consumer in consumers]
        if any(codes):
            print(f"a consumer failed: exit codes {codes}", file=sys.stderr)
            return 1
        return check(db_path, args.orders)
    finally:
        for consumer in consumers:
            if consumer.poll() is None:
                consumer.kill()
                consumer.wait()
        if cluster is not None:
            cluster.stop()
        if args.keep:
            print(f"state kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def check(db_path: str, orders: int) -> int:
    db = connect(db_path)
    charges = {}
    for order, count in db.execute(
            "SELECT order_id, COUNT(*) FROM provider_charges GROUP BY order_id"):
        charges[order] = count
    deliveries = db.execute("SELECT SUM(receives), COUNT(*) FROM messages").fetchone()
    refused = db.execute("SELECT COUNT(*) FROM provider_refusals").fetchone()[0]
    events = dict(db.execute("SELECT kind, COUNT(*) FROM events GROUP BY kind").fetchall())
    expected = {f"order-{n}" for n in range(1, orders + 1)}
    missing = sorted(expected - set(charges))
    twice = sorted(order for order, count in charges.items() if count != 1)
    print(f"{orders} orders, {deliveries[1]} messages, {deliveries[0]} deliveries; "
          f"{sum(charges.values())} charges, {events.get('reconciled', 0)} reconciled after a "
          f"takeover, {refused} stale fences refused")
    if missing or twice:
        print(f"FAILED: not charged {missing}, charged more than once {twice}", file=sys.stderr)
        return 1
    print("OK: every order was charged exactly once")
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    signal.signal(signal.SIGTERM, _interrupt)  # clean up (finally blocks) on SIGTERM too
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", nargs="?", choices=["consume"], help=argparse.SUPPRESS)
    parser.add_argument("--endpoints", default="", help="HOST:PORT,... (default: start a cluster)")
    parser.add_argument("--orders", type=int, default=30)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--lease", type=float, default=1.0, help="claim lease, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the queue and provider state")
    parser.add_argument("--no-once", action="store_true",
                        help="charge without oncekv (shows the double charges)")
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--die-after-charging", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.command == "consume":
        return consume(args)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
