#!/usr/bin/env python3
"""Report of bench/sfu/jacktrip-hub.sh: CPU per client and the delay each
hub adds per beat onset (one clock: the hub veth's capture). Usage:
jacktrip_hub_report.py OUT_DIR [OUT_DIR...] (several runs: each run's
tables, then the ratios of every run side by side, for the noise). A value
that could not be measured is n/a."""
import os
import re
import struct
import sys

HUB = bytes([10, 77, 0, 1])
RATE = 48000


def packets(path):
    """(time s, src ip, src port, dst ip, dst port, udp payload) of a pcap."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24:
        return
    magic = struct.unpack("<I", data[:4])[0]
    nano = magic == 0xA1B23C4D
    link = struct.unpack("<I", data[20:24])[0]
    off = 24
    while off + 16 <= len(data):
        sec, frac, incl, _ = struct.unpack("<IIII", data[off:off + 16])
        off += 16
        pkt = data[off:off + incl]
        off += incl
        t = sec + frac / (1e9 if nano else 1e6)
        if link == 1:
            if len(pkt) < 14 or pkt[12:14] != b"\x08\x00":
                continue
            ip = pkt[14:]
        else:
            continue
        if len(ip) < 20 or ip[9] != 17:
            continue
        ihl = (ip[0] & 15) * 4
        udp = ip[ihl:]
        if len(udp) < 8:
            continue
        sport, dport = struct.unpack(">HH", udp[:4])
        yield t, ip[12:16], sport, ip[16:20], dport, udp[8:]


def onset(payload):
    """(index of the first non-zero sample, frames) of a JackTrip 16-bit
    audio packet, (None, frames) if silent; None if not audio."""
    if len(payload) < 16:
        return None
    frames = struct.unpack("<H", payload[10:12])[0]
    bits = payload[13]
    if bits != 16 or frames == 0:
        return None
    body = payload[16:]
    chans = max(1, len(body) // (2 * frames))
    if len(body) < 2 * frames:
        return None
    for c in range(chans):
        ch = body[c * 2 * frames:(c + 1) * 2 * frames]
        for i in range(frames):
            if ch[2 * i] or ch[2 * i + 1]:
                return i, frames
    return None, frames


def analyse(pcap):
    ins, outs = [], []  # onset times (s); outs: (time, dst port)
    silent_before = {}
    npk = 0
    t_first = t_last = None
    for t, src, sport, dst, dport, payload in packets(pcap):
        o = onset(payload)
        if o is None:
            continue
        npk += 1
        t_first = t if t_first is None else t_first
        t_last = t
        key = (src, sport, dst, dport)
        idx, frames = o
        was_silent = silent_before.get(key, False)
        silent_before[key] = idx is None
        if idx is None or not was_silent:
            continue
        at = t - (frames - idx) / RATE
        if dst == HUB:
            ins.append(at)
        elif src == HUB:
            outs.append((at, dport))
    ins.sort()
    # Per receiving client, the first onset after each beat went in (and
    # before the next beat): the delay the hub added to that beat. Further
    # onsets within a beat (a burst split by a silent packet: a
    # contribution that missed its mix) are counted as `split`.
    delays, split = [], 0
    by_dst = {}
    for at, port in outs:
        by_dst.setdefault(port, []).append(at)
    for port, times in by_dst.items():
        times.sort()
        j = 0
        for k, b in enumerate(ins):
            nxt = ins[k + 1] if k + 1 < len(ins) else float("inf")
            while j < len(times) and times[j] < b:
                j += 1
            first = True
            while j < len(times) and times[j] < nxt:
                if first and times[j] - b < 0.09:
                    delays.append((times[j] - b) * 1e6)
                else:
                    split += 1
                first = False
                j += 1
    rate = npk / (t_last - t_first) if t_first is not None and t_last > t_first else 0
    return ins, outs, sorted(delays), rate, split


def pct(v, q):
    if not v:
        return "n/a"
    return "%.0f" % v[min(len(v) - 1, int(q * len(v)))]


def cpu(path, n):
    """CPU per client, % of one core, per hub process: [(label, pct)]."""
    if not os.path.exists(path):
        return []
    text = open(path).read()
    wall = float(re.search(r"wall_s=([0-9.]+)", text).group(1))
    out = []
    for k, ticks, hz in re.findall(r"proc(\d+) ticks=(-?\d+) hz=(\d+)", text):
        out.append(100.0 * int(ticks) / int(hz) / wall / n)
    return out


def collect(out):
    rows = []
    for d in sorted(os.listdir(out)):
        m = re.match(r"(jacktrip|ringway|ringway-clocked)-n(\d+)-f(\d+)$", d)
        if not m:
            continue
        hub, n, frames = m.group(1), int(m.group(2)), int(m.group(3))
        p = os.path.join(out, d)
        c = cpu(os.path.join(p, "cpu.txt"), n)
        pc = os.path.join(p, "hub.pcap")
        ins, outs, delays, rate, split = analyse(pc) if os.path.exists(pc) else ([], [], [], 0, 0)
        flag = ""
        if os.path.exists(os.path.join(p, "FAILED")):
            flag = "metronome not connected"
        elif len(delays) < 0.9 * len(ins) * (n - 1):
            flag = "onsets missing at some clients"
        rows.append((frames, n, hub, c, ins, delays, split, rate, flag))
    return rows


def ratios(rows):
    """{(frames, clients, hub): (cpu ratio, cpu ratio with jackd, delay ratio)}"""
    by = {(r[0], r[1], r[2]): r for r in rows}
    out = {}
    for (frames, n, hub), r in sorted(by.items()):
        if hub == "jacktrip" or (frames, n, "jacktrip") not in by:
            continue
        j = by[(frames, n, "jacktrip")]
        cr = r[3][0] / j[3][0] if r[3] and j[3] and j[3][0] > 0 else None
        cj = r[3][0] / sum(j[3]) if r[3] and len(j[3]) > 1 and sum(j[3]) > 0 else None
        dr = None
        if r[5] and j[5] and j[5][len(j[5]) // 2] > 0:
            dr = r[5][len(r[5]) // 2] / j[5][len(j[5]) // 2]
        out[(frames, n, hub)] = (cr, cj, dr)
    return out


def main(outs):
    runs = [collect(o) for o in outs]
    for o, rows in zip(outs, runs):
        if len(outs) > 1:
            print("\n### %s\n" % o)
        table(rows)
    if len(outs) > 1:
        f = lambda v: "n/a" if v is None else "%.3f" % v
        all_r = [ratios(r) for r in runs]
        keys = sorted(set(k for r in all_r for k in r))
        print("\n### Ratios to jacktrip, run by run (%s)\n" % ", ".join(outs))
        print("| frames | clients | hub | CPU (hub process) | CPU (with jackd) | delay p50 |")
        print("|---|---|---|---|---|---|")
        for k in keys:
            vals = [r.get(k, (None, None, None)) for r in all_r]
            print("| %d | %d | %s | %s | %s | %s |" % (k[0], k[1], k[2],
                  "; ".join(f(v[0]) for v in vals), "; ".join(f(v[1]) for v in vals),
                  "; ".join(f(v[2]) for v in vals)))


def table(rows):
    print("| frames | clients | hub | CPU/client % (hub process) | CPU/client % (+ hub jackd) | "
          "beats in | beats out (clients x beats) | split bursts | added delay p50 / p90 / max (µs) | packets/s at hub | note |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for frames, n, hub, c, ins, delays, split, rate, flag in rows:
        proc = "%.2f" % c[0] if c else "n/a"
        total = "%.2f" % sum(c) if len(c) > 1 else "n/a"
        print("| %d | %d | %s | %s | %s | %d | %d | %d | %s / %s / %s | %.0f | %s |" % (
            frames, n, hub, proc, total, len(ins), len(delays), split,
            pct(delays, 0.5), pct(delays, 0.9), pct(delays, 1.0) if delays else "n/a",
            rate, flag))
    # Ratios side by side, same (frames, clients).
    print()
    print("| frames | clients | hub | CPU ratio to jacktrip (hub process; with jackd) | delay ratio to jacktrip (p50) |")
    print("|---|---|---|---|---|")
    by = {(r[0], r[1], r[2]): r for r in rows}
    for (frames, n, hub), r in sorted(by.items()):
        if hub == "jacktrip" or (frames, n, "jacktrip") not in by:
            continue
        j = by[(frames, n, "jacktrip")]
        def ratio(a, b):
            return "%.3f" % (a / b) if b > 0 else "n/a"
        cr = ratio(r[3][0], j[3][0]) if r[3] and j[3] else "n/a"
        cj = ratio(r[3][0], sum(j[3])) if r[3] and len(j[3]) > 1 else "n/a"
        dr = "n/a"
        if r[5] and j[5]:
            dr = ratio(r[5][len(r[5]) // 2], j[5][len(j[5]) // 2])
        print("| %d | %d | %s | %s; %s | %s |" % (frames, n, hub, cr, cj, dr))


if __name__ == "__main__":
    main(sys.argv[1:])
