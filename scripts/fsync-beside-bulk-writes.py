#!/usr/bin/env python3
"""How a Raft log's fsyncs fare on this disk while another writer on it
writes in bulk (docs/state-beyond-ram.md §4.9g): a "log" thread appends
512 bytes and fdatasyncs, once a millisecond, for 12 s, while a "bulk"
thread writes 200 MB to another file on the same filesystem, 1 MB each
5 ms, then fsyncs it, over and over — the way a snapshot received, a
snapshot's records installed or a store's tables written go to disk
beside a node's log. Printed per case: the log's fdatasync latency
quantiles with no bulk writer, and with one that flushes all at the end
or every 8 or 2 MB (the bulk writer's own write-behind), and with the
log file preallocated sparse (as the segment log is) or written with
zeros first (no block allocation left for an fdatasync to journal).

    scripts/fsync-beside-bulk-writes.py DIR

DIR must be on the disk to measure (its two files are deleted after).
"""
import os
import sys
import threading
import time

MB = 1 << 20


def log_appends(path, layout, stop, latencies):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    if layout == "zeroed":
        zeros = b"\0" * MB
        for i in range(64):
            os.pwrite(fd, zeros, i * MB)
        os.fsync(fd)
    else:
        os.ftruncate(fd, 64 * MB)
        os.fsync(fd)
    offset, record = 0, b"x" * 512
    while not stop.is_set():
        started = time.perf_counter()
        os.pwrite(fd, record, offset)
        os.fdatasync(fd)
        latencies.append(time.perf_counter() - started)
        offset += len(record)
        time.sleep(0.001)
    os.close(fd)


def bulk_writes(path, megabytes, window, stop):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    chunk = os.urandom(MB)
    while not stop.is_set():
        for i in range(megabytes):
            os.pwrite(fd, chunk, i * MB)
            time.sleep(0.005)
            if window and (i + 1) % window == 0:
                os.fdatasync(fd)
        os.fsync(fd)
        os.ftruncate(fd, 0)
    os.close(fd)


def case(directory, layout, bulk, window):
    stop, latencies = threading.Event(), []
    log = threading.Thread(
        target=log_appends, args=(f"{directory}/log", layout, stop, latencies)
    )
    log.start()
    time.sleep(1.0)
    latencies.clear()
    writer = None
    if bulk:
        writer = threading.Thread(
            target=bulk_writes, args=(f"{directory}/bulk", 200, window, stop)
        )
        writer.start()
    time.sleep(12)
    stop.set()
    log.join()
    if writer:
        writer.join()
    latencies.sort()

    def quantile(q):
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000

    what = "no bulk writer" if not bulk else f"bulk, fsync every {window or 200} MB"
    print(
        f"log {layout:6s} {what:26s} n={len(latencies)} p50={quantile(0.5):.2f}ms "
        f"p99={quantile(0.99):.2f}ms p999={quantile(0.999):.2f}ms max={latencies[-1] * 1000:.1f}ms",
        flush=True,
    )


def main():
    directory = sys.argv[1]
    try:
        for layout, bulk, window in [
            ("sparse", False, None),
            ("sparse", True, None),
            ("zeroed", True, None),
            ("sparse", True, 8),
            ("sparse", True, 2),
        ]:
            case(directory, layout, bulk, window)
    finally:
        for name in ("log", "bulk"):
            try:
                os.remove(os.path.join(directory, name))
            except FileNotFoundError:
                pass


if __name__ == "__main__":
    main()
