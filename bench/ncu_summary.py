#!/usr/bin/env python3
"""Sums Nsight Compute's `--metrics gpu__time_duration.sum --csv` output, or Nsight Systems'
`nsys stats --report cuda_gpu_kern_sum --format csv` output, by kernel name and prints each
kernel's share of the GPU time (scripts/gpu_check.sh profile, timeline).
    python3 bench/ncu_summary.py ncu.csv|kern_sum.csv [top]
"""
import collections
import csv
import sys

UNITS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}


def main():
    lines = [line for line in open(sys.argv[1]) if line.startswith('"') or line.startswith("Time")]
    rows = list(csv.reader(lines))
    head = rows[0]
    ms, launches = collections.Counter(), collections.Counter()
    if "Total Time (ns)" in head:  # nsys: one row per kernel name
        time_i, count_i, name_i = (head.index(k) for k in ("Total Time (ns)", "Instances", "Name"))
        for r in rows[1:]:
            name = r[name_i].split("(")[0][:72]
            ms[name] += float(r[time_i]) * 1e-6
            launches[name] += int(r[count_i])
    else:
        name_i, unit_i, value_i = (head.index(k) for k in ("Kernel Name", "Metric Unit",
                                                            "Metric Value"))
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
