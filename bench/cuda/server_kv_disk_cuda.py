#!/usr/bin/env python3
"""ds4-server --backend cuda with the disk KV cache, end to end (standard library only: runs on the lent GPU
machine). A conversation is answered (saved to disk after its prefill), the server is stopped (saving the
live session) and started again; the same conversation is then restored from disk and must give the same
greedy answer as the first run and as a cold CUDA server without the cache; a follow-up turn on the restored
session is printed beside a cold server's. Usage: server_kv_disk_cuda.py DS4_SERVER_BIN WORKDIR"""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

BIN, WORK = sys.argv[1], Path(sys.argv[2])
BACKEND = os.environ.get("BACKEND", "cuda")
WORK.mkdir(parents=True, exist_ok=True)
SYS = {"role": "system", "content": "You are a terse assistant. Answer in one line."}
CONV = [SYS, {"role": "user", "content": "Conversation A: describe the longest river you know in some detail please."}]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, name, args):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.logf = WORK / f"{name}.log"
        self.log = open(self.logf, "w")
        cmd = [BIN, "--host", "127.0.0.1", "--port", str(self.port), "--backend", BACKEND, "--ctx", "2048", "--kv-snapshots", "0"] + args
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited {self.proc.returncode}: {self.logf.read_text()}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                    if json.loads(r.read())["status"] == "ok":
                        break
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)

    def chat(self, messages, n=12):
        body = json.dumps({"model": "m", "messages": messages, "max_tokens": n, "temperature": 0, "reasoning_effort": "none"}).encode()
        req = urllib.request.Request(self.base + "/v1/chat/completions", data=body, headers={"content-type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=120) as r:
            j = json.loads(r.read())
        return j["choices"][0]["message"]["content"], j["usage"]

    def metrics(self):
        with urllib.request.urlopen(self.base + "/metrics", timeout=30) as r:
            out = {}
            for line in r.read().decode().splitlines():
                if line.strip() and not line.startswith("#"):
                    k, v = line.rsplit(" ", 1)
                    out[k] = float(v)
            return out

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def files(d):
    return sorted(p.name for p in d.iterdir() if p.suffix == ".kv")


ok = True


def check(cond, what):
    global ok
    print(("PASS " if cond else "FAIL ") + what)
    ok &= bool(cond)


cold = Server("cold", [])
ref, ref_usage = cold.chat(CONV)
cold.stop()
print(f"cold cuda answer: {ref!r} ({ref_usage['prompt_tokens']} prompt tokens)")

d = WORK / "kv"
disk = ["--kv-disk-dir", str(d), "--kv-disk-min-tokens", "8"]
s1 = Server("first", disk)
text1, u1 = s1.chat(CONV)
m1 = s1.metrics()
s1.stop()
check(text1 == ref, f"first answer with the cache equals the cold one: {text1!r}")
check(m1.get("ds4_kv_disk_saves_total", 0) >= 1, f"saved after the prefill (saves {m1.get('ds4_kv_disk_saves_total')})")
check(len(files(d)) == 2, f"the shutdown saved the live session too: files {files(d)}")

s2 = Server("second", disk)
text2, u2 = s2.chat(CONV)
m2 = s2.metrics()
check(text2 == ref, f"after the restart the restored prompt answers the same: {text2!r}")
check(m2.get("ds4_kv_disk_hits_total", 0) == 1, f"disk hit (hits {m2.get('ds4_kv_disk_hits_total')}, loaded tokens {m2.get('ds4_kv_disk_loaded_tokens_total')})")
check(m2.get("ds4_prefilled_tokens_total", 1e9) < u2["prompt_tokens"], f"prefilled {m2.get('ds4_prefilled_tokens_total')} of {u2['prompt_tokens']} prompt tokens")
follow = CONV + [{"role": "assistant", "content": text2}, {"role": "user", "content": "And the second longest?"}]
text3, u3 = s2.chat(follow)
m3 = s2.metrics()
s2.stop()
cold2 = Server("cold2", [])
ref3, _ = cold2.chat(follow)
cold2.stop()
print(f"follow-up: {text3!r}; cold: {ref3!r}; prefilled so far {m3.get('ds4_prefilled_tokens_total')} for {u2['prompt_tokens']} + {u3['prompt_tokens']} prompt tokens")
# Informational: the reused session prefills only the new turn (other chunk shapes, other GPU product
# paths than a cold prefill of the whole conversation), so equality is not required.
print(f"follow-up equals the cold server's: {text3 == ref3}")
print("ALL PASS" if ok else "SOME CHECKS FAILED")
sys.exit(0 if ok else 1)
