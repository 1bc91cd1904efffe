#!/usr/bin/env python3
"""Measures ds4-server's request limits against a running server (stdlib only):
   bench/server_limits.py PORT PID
413 latency for a declared 10^12-byte body, a 50 MB prompt (status, time, RSS growth), a 60 MB body of
tiny JSON values, and /health latency with 2,000 stalled connections open. RSS growth is the peak
(VmHWM, reset through /proc/PID/clear_refs) minus the RSS before the request."""
import json
import re
import resource
import socket
import sys
import time
import urllib.error
import urllib.request

port, pid = int(sys.argv[1]), int(sys.argv[2])
base = f"http://127.0.0.1:{port}"


def mem(field):
    return int(re.search(field + r":\s+(\d+)", open(f"/proc/{pid}/status").read()).group(1)) // 1024


def post(path, body):
    req = urllib.request.Request(base + path, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def measured(label, body):
    open(f"/proc/{pid}/clear_refs", "w").write("5")
    before = mem("VmRSS")
    t0 = time.time()
    st = post("/v1/chat/completions", body)
    print(f"{label}: HTTP {st} in {time.time() - t0:.2f} s, RSS {before} MB -> peak {mem('VmHWM')} MB "
          f"(+{mem('VmHWM') - before} MB)")


c = socket.create_connection(("127.0.0.1", port))
t0 = time.time()
c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000000000000\r\n\r\n")
status_line = c.recv(64).split(b"\r\n")[0].decode()
print(f"declared 10^12 bytes: {status_line} in {(time.time() - t0) * 1000:.1f} ms")
c.close()

words = "lorem ipsum dolor sit amet, consectetur adipiscing elit\n"
text = (words * (50_000_000 // len(words) + 1))[:50_000_000]
measured("50 MB prompt", json.dumps({"messages": [{"role": "user", "content": text}], "max_tokens": 4}).encode())
measured("60 MB of tiny JSON values",
         b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"x":[' + b"0," * 30_000_000 + b"0]}")

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(2000)]
t0 = time.time()
with urllib.request.urlopen(base + "/health", timeout=10) as r:
    st = r.status
print(f"/health with 2000 stalled connections: HTTP {st} in {(time.time() - t0) * 1000:.1f} ms")
t0 = time.time()
st = post("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode())
print(f"chat with 2000 stalled connections: HTTP {st} in {time.time() - t0:.2f} s")
for s in stalled:
    s.close()
