#!/usr/bin/env python3
"""Issue 25's report: the Markdown tables `ringway lab sfu --markdown` and
`ringway lab srpic-tcp --markdown` wrote into OUT (bench/lab/issue25-quiet.sh),
put together in OUT/issue25-tables.md, with the "no harm under drops"
comparison of the three SRPIC placements side by side (from t5-drops.json:
every number is the lab's; this script only lays them out).

Usage: issue25_report.py OUT
"""
import json
import os
import sys

def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def num(v, digits=1):
    return "n/a" if v is None else f"{v:.{digits}f}"


def mean_ci(m):
    if not m or m.get("n", 0) == 0 or m.get("mean") is None:
        return "n/a"
    if m["n"] == 1:
        return f"{m['mean']:.2f} (n=1)"
    return f"{m['mean']:.2f} ± {m['ci95']:.2f}"


def share(c):
    if not c or c.get("interval") is None:
        return "n/a"
    low, high = c["interval"]
    return f"{c['collapsed']}/{c['runs']} ({100 * low:.0f}-{100 * high:.0f} %)"


def placements_table(out):
    """One row per (δ, placement): SRPIC on vs off against the A/A floor."""
    text = read(os.path.join(out, "t5-drops.json"))
    if text is None:
        return "n/a: no t5-drops.json (step c not run or failed)\n"
    rows = []
    for c in json.loads(text).get("comparison", []):
        e = c.get("effect")
        change = "n/a" if e is None else f"{-e['lower_pct']:+.1f} ± {e['ci_pct']:.1f}"
        rows.append(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
                f"{100 * c['cell']['delta']:g}",
                c.get("arm", "n/a"),
                mean_ci(c.get("off")),
                mean_ci(c.get("aa")),
                mean_ci(c.get("on")),
                change,
                num(c.get("floor_pct")),
                num(None if e is None else e["mde_pct"]),
                "n/a" if e is None else e["pairs"],
                c.get("judgement", "n/a"),
            )
        )
    head = (
        "| δ % | SRPIC arm | N-SRPIC Mb/s | A/A Mb/s | SRPIC Mb/s | change % (95 % CI) "
        "| A/A floor % | MDE % | pairs | verdict |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )
    return head + "\n".join(rows) + "\n"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    log = read(os.path.join(out, "issue25.log")) or ""
    parts = ["# Issue 25: quiet-machine tables\n"]
    parts.append(
        "Made by `bench/lab/issue25-quiet.sh` (log below); every figure is the lab's own "
        "(mean ± 95 % CI, A/A floor, MDE, verdicts), laid out by `bench/lab/issue25_report.py`.\n"
    )
    parts.append("## For docs/pktswitch.md: `lab sfu --paper` (a)\n")
    parts.append(read(os.path.join(out, "sfu-paper.md")) or "n/a: no sfu-paper.md (step a not run or failed)\n")
    parts.append("\n## For docs/srpic.md: Table 4's collapse probability, β 0.5 % (b)\n")
    parts.append(read(os.path.join(out, "t4-b05.md")) or "n/a: no t4-b05.md (step b not run or failed)\n")
    parts.append(
        "\n## For docs/srpic.md: \"no harm under drops\" (c), the three placements side by side "
        "(on = Listing 1, on-tsval = TSval-gated departure, on-in-place = the relay's oracle)\n"
    )
    parts.append(placements_table(out))
    parts.append("\n### Table 5, all arms (the lab's own output)\n")
    parts.append(read(os.path.join(out, "t5-drops.md")) or "n/a: no t5-drops.md\n")
    steps = [l for l in log.splitlines() if l.startswith(("STEP", "issue25", "binary", "load", "ALL"))]
    parts.append("\n## Run log\n\n```text\n" + "\n".join(steps) + "\n```\n")
    target = os.path.join(out, "issue25-tables.md")
    with open(target, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
