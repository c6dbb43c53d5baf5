#!/usr/bin/env python3
"""Sums Nsight Compute's `--metrics gpu__time_duration.sum --csv` output by kernel name and prints
each kernel's share of the GPU time (scripts/gpu_check.sh profile).
    python3 bench/ncu_summary.py ncu.csv [top]
"""
import collections
import csv
import sys

UNITS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}


def main():
    rows = list(csv.reader(line for line in open(sys.argv[1]) if line.startswith('"')))
    head = rows[0]
    name_i, unit_i, value_i = (head.index(k) for k in ("Kernel Name", "Metric Unit",
                                                        "Metric Value"))
    ms, launches = collections.Counter(), collections.Counter()
    for r in rows[1:]:
        name = r[name_i].split("(")[0][:72]
        ms[name] += float(r[value_i].replace(",", "")) * UNITS[r[unit_i]]
        launches[name] += 1
    total = sum(ms.values())
    print(f"{total:.1f} ms of kernel time over {sum(launches.values())} launches")
    for name, t in ms.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 30):
        print(f"{100 * t / total:5.1f}% {t:9.2f} ms {launches[name]:6d}  {name}")


if __name__ == "__main__":
    main()
