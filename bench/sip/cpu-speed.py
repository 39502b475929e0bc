#!/usr/bin/env python3
"""The CPU's speed as the benchmark's processes get it, once per interval.

Usage: taskset -c CPU python3 cpu-speed.py OUT SECONDS [INTERVAL_S]

Every INTERVAL_S (0.1 s) one fixed unit of work (integer hashing, ~0.5 ms)
runs on the CPU this is pinned to, and a line `epoch_s units_per_cpu_s`
goes to OUT: the units done per second of this thread's own CPU time, so
waiting for the CPU (the proxy holding it, preemption) does not count,
only how fast the CPU ran while it had it. On this KVM guest that speed
moves by 30 % and more for seconds at a time with no steal in /proc/stat
(a pinned loop: 69-116 % of its median per second, 12 of 90 seconds under
80 %; docs/sip-proxy.md): the overload benchmark judges each second
against the capacity times that second's speed as well.
Costs about 0.5 % of the CPU.
"""
import sys
import time


def unit():
    x = 1
    for _ in range(3000):
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
    return x


def main():
    out, seconds = sys.argv[1], float(sys.argv[2])
    interval = float(sys.argv[3]) if len(sys.argv) > 3 else 0.1
    end = time.time() + seconds
    with open(out, "w") as f:
        while time.time() < end:
            c0 = time.thread_time_ns()
            unit()
            c1 = time.thread_time_ns()
            if c1 > c0:
                f.write(f"{time.time():.3f} {1e9 / (c1 - c0):.2f}\n")
                f.flush()
            time.sleep(interval)


if __name__ == "__main__":
    main()
