"""Connection-level limits at the issue's scale: 2,000 stalled connections on loopback do not lock out
/health or a chat (default --max-connections 512: the longest-idle connections make room), and a
declared Content-Length of 10^12 is answered 413 at once."""
import resource
import socket
import time

import pytest


def test_2000_stalled_connections_health_and_chat(make_server):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2300
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"needs {want} open files, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    s = make_server("--ctx", "2048", name="stalled")
    stalled = []
    try:
        for i in range(2000):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
            if i % 2:
                c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-le")
            stalled.append(c)
        t0 = time.time()
        h = s.get_json("/health")
        took = time.time() - t0
        assert h["status"] == "ok" and took < 1.0, took
        import openai
        oai = openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=60)
        r = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "[[plain]]"}], max_tokens=16,
                                        reasoning_effort="none")
        assert r.choices[0].message.content == "Plain scripted answer."
        assert s.alive()
    finally:
        for c in stalled:
            c.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_declared_10_to_the_12_bytes_is_413_at_once(server):
    c = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    t0 = time.time()
    c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
              b"content-length: 1000000000000\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = c.recv(4096)
        if not chunk:
            break
        data += chunk
    took = time.time() - t0
    c.close()
    assert data.startswith(b"HTTP/1.1 413"), data[:200]
    assert took < 1.0, took
