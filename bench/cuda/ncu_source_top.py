#!/usr/bin/env python3
"""Summarises bench/cuda/ncu_source.sh's source page: the SASS lines with the most warp-stall samples,
each with a few lines before it, and the share of all samples. Usage: ncu_source_top.py FILE.csv.gz [N]"""
import csv, gzip, io, sys

path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25
text = gzip.open(path, "rt", errors="replace").read() if path.endswith(".gz") else open(path).read()
rows = list(csv.reader(io.StringIO(text)))
hi = next(i for i, r in enumerate(rows) if any("Source" == c.strip() or c.strip().startswith("Source") for c in r))
hdr = [c.strip() for c in rows[hi]]
si = next(i for i, c in enumerate(hdr) if c.startswith("Source"))
# The all-samples column (not the "Not Issued" one) when both exist.
cands = [i for i, c in enumerate(hdr) if "Sampling" in c]
ci = next((i for i in cands if "Not" not in hdr[i]), cands[0] if cands else None)
if ci is None:
    sys.exit(f"no stall-sampling column in {hdr}")
body = [r for r in rows[hi + 1:] if len(r) > max(si, ci)]
def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0
vals = [num(r[ci]) for r in body]
tot = sum(vals) or 1.0
print(f"{len(body)} SASS lines, {tot:.0f} samples ({hdr[ci]})")
order = sorted(range(len(body)), key=lambda i: -vals[i])[:top]
for i in sorted(order):
    ctx = " | ".join(body[j][si].strip()[:50] for j in range(max(0, i - 2), i))
    print(f"{100 * vals[i] / tot:5.1f}%  #{i:<5} {body[i][si].strip()[:70]:<70}  after: {ctx}")
