#!/usr/bin/env python3
"""Compares two `ds4 --dump-logprobs` files (same prompt, two backends): greedy token ids step by step, and
the log-probabilities of the reference's top tokens. Usage: compare_logprobs.py REF.json OTHER.json"""
import json
import sys

a, b = (json.load(open(p)) for p in sys.argv[1:3])
sa, sb = a["steps"], b["steps"]
n = min(len(sa), len(sb))
same = 0
first_diff = None
worst = 0.0
for i in range(n):
    ia, ib = sa[i]["selected"]["id"], sb[i]["selected"]["id"]
    if ia == ib:
        same += 1
    elif first_diff is None:
        first_diff = i
    if first_diff is None:
        lb = {t["token"]["id"]: t["logprob"] for t in sb[i]["top_logprobs"]}
        for t in sa[i]["top_logprobs"]:
            if t["token"]["id"] in lb:
                worst = max(worst, abs(t["logprob"] - lb[t["token"]["id"]]))
print(f"steps {n} (ref {len(sa)}, other {len(sb)}): greedy ids identical {same}/{n}; first difference at "
      f"{first_diff}; max |d logprob| over the top tokens before it {worst:.3e}")
