#!/usr/bin/env python3
"""Second by second, what a local cluster is doing: for each node, the p99
of the proposals that finished in that second (from the deltas of its
`oncekv_proposal_duration_seconds` histogram, so to the histogram's bucket
bounds: 6.4, 12.8, 25.6, 51.2, 102, 205 ms ...; "-" when none finished,
as on a follower), how many finished, the machine's disk writes (MB/s;
then the disk's write requests and flushes completed, each with its mean
time in the device: `w=` and `fl=` count/ms, from /proc/diskstats),
dirty page cache (MB), iowait and busy share (% of all cores), and each
node process's CPU (% of one core, from /proc/PID/stat; a process without
--id, such as a CLI call, shows by its pid) and, in brackets, the part of
it its background threads took (those named `oncekv-…`: builds, snapshot
reads, receptions, hashes); `lg=` is the load generator's CPU.

Used to trace write latency during a catch-up by snapshot
(docs/state-beyond-ram.md §4.9g): start it beside
`scripts/bench-state.sh` with the same ONCEKV_PORT_BASE.

    scripts/trace-seconds.py PORT_BASE SECONDS OUT_FILE

Node N's metrics are read from 127.0.0.1:PORT_BASE+200+N (the ports
scripts/cluster.sh gives). Linux only. Touches nothing: reads only.
"""
import os
import re
import subprocess
import sys
import time
import urllib.request


def metrics(base, node):
    try:
        url = f"http://127.0.0.1:{base + 200 + node}/metrics"
        return urllib.request.urlopen(url, timeout=0.5).read().decode()
    except OSError:
        return ""


def buckets(text):
    found = {}
    pattern = r'oncekv_proposal_duration_seconds_bucket\{[^}]*le="([^"]+)"[^}]*\} (\S+)'
    for match in re.finditer(pattern, text):
        bound = float("inf") if match.group(1) == "+Inf" else float(match.group(1))
        found[bound] = found.get(bound, 0) + float(match.group(2))
    return found


def node_pids():
    pids = {}
    listing = subprocess.run(["pgrep", "-a", "-x", "oncekv"], capture_output=True, text=True)
    for line in listing.stdout.splitlines():
        pid, args = line.split(" ", 1)
        node = re.search(r"--id (\d+)", args)
        pids[node.group(1) if node else pid] = int(pid)
    loadgen = subprocess.run(["pgrep", "-x", "loadgen"], capture_output=True, text=True)
    for pid in loadgen.stdout.split()[:1]:
        pids["lg"] = int(pid)
    return pids


def cpu_ticks(pid, task=None):
    path = f"/proc/{pid}/task/{task}/stat" if task else f"/proc/{pid}/stat"
    try:
        fields = open(path).read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def background_ticks(pid):
    """CPU ticks of a process's threads named `oncekv-…` (see above)."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for task in tasks:
        try:
            name = open(f"/proc/{pid}/task/{task}/comm").read().strip()
        except OSError:
            continue
        if name.startswith("oncekv-"):
            total += cpu_ticks(pid, task)
    return total


def all_ticks():
    return {k: (p, cpu_ticks(p), background_ticks(p)) for k, p in node_pids().items()}


def disk_counters():
    """Writes and flushes completed on the whole disks (not partitions), and
    the milliseconds each kind took: (writes, write_ms, flushes, flush_ms)."""
    totals = [0, 0, 0, 0]
    for line in open("/proc/diskstats"):
        fields = line.split()
        name = fields[2]
        if not os.path.exists(f"/sys/block/{name}") or name.startswith(("loop", "ram", "dm-")):
            continue
        numbers = [int(x) for x in fields[3:]]
        totals[0] += numbers[4]
        totals[1] += numbers[7]
        if len(numbers) >= 17:
            totals[2] += numbers[15]
            totals[3] += numbers[16]
    return totals


def machine():
    vmstat = open("/proc/vmstat").read()
    meminfo = open("/proc/meminfo").read()
    written_kb = int(re.search(r"^pgpgout (\d+)", vmstat, re.M).group(1))
    dirty_kb = int(re.search(r"^Dirty:\s+(\d+)", meminfo, re.M).group(1))
    cpu = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return written_kb, dirty_kb, cpu, disk_counters()


def main():
    base, seconds, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    nodes = (1, 2, 3, 4, 5)
    before = {n: buckets(metrics(base, n)) for n in nodes}
    last = machine()
    ticks = all_ticks()
    with open(out, "w") as trace:
        trace.write("time p99_ms(n1/n2/...) proposals disk_MBps dirty_MB iowait% busy% cpu%\n")
        for _ in range(seconds):
            time.sleep(1)
            p99s, counts = [], []
            for n in nodes:
                now = buckets(metrics(base, n))
                delta = {k: v - before[n].get(k, 0) for k, v in now.items()}
                before[n] = now
                total = delta.get(float("inf"), 0)
                if total <= 0:
                    p99s.append("-")
                    counts.append("0")
                    continue
                p99 = next(k for k in sorted(delta) if delta[k] >= 0.99 * total)
                p99s.append(f"{p99 * 1000:.0f}")
                counts.append(str(int(total)))
            current = machine()
            cpu = [a - b for a, b in zip(current[2], last[2])]
            total = sum(cpu) or 1
            iowait = 100 * cpu[4] / total
            busy = 100 * (total - cpu[3] - cpu[4]) / total
            disk = (current[0] - last[0]) / 1024
            writes, write_ms, flushes, flush_ms = (a - b for a, b in zip(current[3], last[3]))
            device = (
                f"w={writes}/{write_ms / writes if writes else 0:.1f}ms "
                f"fl={flushes}/{flush_ms / flushes if flushes else 0:.1f}ms"
            )
            last = current
            now_ticks = all_ticks()

            def used(k):
                then = ticks.get(k, now_ticks[k])
                if then[0] != now_ticks[k][0]:  # a new process of that name
                    then = (0, 0, 0)
                (_, all_now, bg_now), (_, all_then, bg_then) = now_ticks[k], then
                if k == "lg":
                    return f"lg={all_now - all_then}"
                return f"n{k}={all_now - all_then}({bg_now - bg_then})"

            per_node = " ".join(used(k) for k in sorted(now_ticks))
            ticks = now_ticks
            trace.write(
                f"{time.strftime('%H:%M:%S')} p99={'/'.join(p99s)} n={'/'.join(counts)} "
                f"disk={disk:.0f} {device} dirty={current[1] // 1024} wa={iowait:.0f} busy={busy:.0f} "
                f"{per_node}\n"
            )
            trace.flush()


if __name__ == "__main__":
    main()
