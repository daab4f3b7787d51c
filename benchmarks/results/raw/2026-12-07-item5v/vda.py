"""item5v: vda's /proc/diskstats fields (after the name), for probe.py and probe_l1.py."""


def vda() -> list[int]:
    for line in open("/proc/diskstats"):
        p = line.split()
        if p[2] == "vda":
            return [int(x) for x in p[3:]]
    raise SystemExit("no vda")
