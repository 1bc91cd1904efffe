"""`--batched-session N`: several requests decoded together as one batch.

Eight mixed streaming requests (chat, completions, responses, messages) run concurrently against
`--batched-session 4` (so four wait and join while others stream); each must be a well-formed, complete
stream, and its greedy output must equal the same request sent alone. A request cancelled mid-stream
must not disturb the others. Bad values of N are refused at start.
"""
import http.client
import json
import subprocess
import threading
import time

from conftest import BIN

MAX = 24


def sse(server, path, body, stop_after=None):
    """Streams `body` to `path`; returns the list of (event, data) pairs (data parsed when JSON).
    With `stop_after`, the connection is closed after that many events (a client going away)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, (path, r.status, r.read()[:300])
    assert r.getheader("content-type", "").startswith("text/event-stream")
    events, ev = [], None
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode().rstrip("\r\n")
        if line.startswith("event:"):
            ev = line[6:].strip()
        elif line.startswith("data:"):
            d = line[5:].strip()
            events.append((ev, d if d == "[DONE]" else json.loads(d)))
            ev = None
            if stop_after is not None and len(events) >= stop_after:
                conn.close()
                return events
    conn.close()
    return events


def text_of(kind, events):
    """The generated text (reasoning and visible) of a well-formed, complete stream."""
    out = []
    if kind in ("chat", "completions"):
        assert events[-1][1] == "[DONE]", f"{kind}: no [DONE]"
        finishes = []
        for _, d in events[:-1]:
            c = d["choices"][0]
            if kind == "chat":
                delta = c["delta"]
                out.append(delta.get("reasoning_content") or "")
                out.append(delta.get("content") or "")
            else:
                out.append(c.get("text") or "")
            if c.get("finish_reason"):
                finishes.append(c["finish_reason"])
        assert finishes and finishes[-1] in ("stop", "length"), f"{kind}: finish {finishes}"
    elif kind == "responses":
        types = [d["type"] for _, d in events]
        assert types[0] == "response.created" and types[-1] in ("response.completed", "response.incomplete"), types
        for _, d in events:
            if d["type"] in ("response.output_text.delta", "response.reasoning_text.delta"):
                out.append(d["delta"])
    else:
        types = [d["type"] for _, d in events]
        assert types[0] == "message_start" and types[-1] == "message_stop", types
        assert "message_delta" in types
        for _, d in events:
            if d["type"] == "content_block_delta":
                dl = d["delta"]
                out.append(dl.get("text") or dl.get("thinking") or "")
    text = "".join(out)
    assert text, f"{kind}: no text generated"
    return text


def request(i):
    """Request i of the mix: kind, path, body (different prompt lengths)."""
    words = " ".join(f"w{i}x{k}" for k in range(5 + 37 * i))
    kind = ["chat", "completions", "responses", "messages"][i % 4]
    if kind == "chat":
        return kind, "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": f"chat {i}: {words}"}],
                                              "stream": True, "max_tokens": MAX, "temperature": 0}
    if kind == "completions":
        return kind, "/v1/completions", {"model": "m", "prompt": f"completion {i}: {words}", "stream": True,
                                         "max_tokens": MAX, "temperature": 0}
    if kind == "responses":
        return kind, "/v1/responses", {"model": "m", "input": f"response {i}: {words}", "stream": True,
                                       "max_output_tokens": MAX, "temperature": 0}
    return kind, "/v1/messages", {"model": "m", "max_tokens": MAX, "messages": [{"role": "user", "content": f"message {i}: {words}"}],
                                  "stream": True, "temperature": 0}


def test_eight_mixed_streams_batched_equal_alone(make_server):
    s = make_server("--ctx", "4096", "--batched-session", "4", "--prefill-chunk", "32", name="batched")
    reqs = [request(i) for i in range(8)]
    results = [None] * 8
    errors = []

    def run(i):
        try:
            kind, path, body = reqs[i]
            results[i] = text_of(kind, sse(s, path, body))
        except Exception as e:  # reported below with the request index
            errors.append((i, repr(e)))

    # A ninth request is cancelled mid-stream while the others run.
    cancelled = threading.Thread(target=lambda: sse(s, "/v1/completions", {"prompt": "cancel me " * 30, "stream": True,
                                                                           "max_tokens": 2000, "temperature": 0}, stop_after=5))
    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    cancelled.start()
    for k, t in enumerate(threads):
        t.start()
        if k == 3:
            time.sleep(0.3)  # the rest join while the first ones are streaming
    for t in threads + [cancelled]:
        t.join(300)
    assert not errors, errors
    m = s.metrics()
    assert m["ds4_batch_sessions"] == 4
    assert m["ds4_batch_steps_total"] > 0
    # Steps really batched several streams together.
    assert m["ds4_batch_rows_total"] > m["ds4_batch_steps_total"], m  # some steps decoded several streams
    assert m["ds4_time_to_first_token_count"] >= 8
    # Each request alone (one at a time) gives the same greedy text.
    for i in range(8):
        kind, path, body = reqs[i]
        alone = text_of(kind, sse(s, path, body))
        assert alone == results[i], f"request {i} ({kind}): batched {results[i]!r} vs alone {alone!r}"
    # And the same as a server without batching.
    one = make_server("--ctx", "4096", name="single")
    for i in (0, 5):
        kind, path, body = reqs[i]
        assert text_of(kind, sse(one, path, body)) == results[i]
    deadline = time.time() + 10
    while s.metrics()["ds4_jobs_cancelled_total"] < 1 and time.time() < deadline:
        time.sleep(0.1)
    assert s.metrics()["ds4_jobs_cancelled_total"] >= 1
    assert s.metrics()["ds4_active_sessions"] == 0


def run_bin(*args):
    return subprocess.run([str(BIN), "--port", "0", *args], capture_output=True, text=True, timeout=120)


def test_zero_sessions_is_a_usage_error():
    r = run_bin("--batched-session", "0")
    assert r.returncode == 2
    assert "--batched-session must be at least 1" in r.stderr


def test_batched_sessions_on_cuda_without_cuda_name_the_feature():
    # Batched sessions run on CUDA now; a binary built without CUDA stops at load naming the feature.
    r = run_bin("--batched-session", "2", "--backend", "cuda")
    assert r.returncode != 0
    assert "built without CUDA support" in r.stderr, r.stderr


def test_sessions_over_memory_are_refused_at_start():
    # The tiny model fits 1 session at ctx 65536 in 1 GiB but not 64 of them (each with 8 snapshots).
    ok = subprocess.Popen([str(BIN), "--port", "0", "--ctx", "65536", "--mem-limit-gb", "1", "--batched-session", "1"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    r = run_bin("--ctx", "65536", "--mem-limit-gb", "1", "--batched-session", "64")
    assert r.returncode != 0
    assert "exceeds the budget" in r.stderr, r.stderr
    # 64 sessions: the plan counts 64 x (1 + 8 snapshots) KV states.
    assert "576 states" in r.stderr and "--batched-session 64" in r.stderr, r.stderr
    # The same flags with one session are accepted (the refusal is about N).
    deadline = time.time() + 60
    seen = ""
    while time.time() < deadline:
        line = ok.stdout.readline()
        seen += line
        if "ready:" in line or not line:
            break
    ok.terminate()
    ok.wait(10)
    assert "ready:" in seen, seen


def test_idle_session_is_saved_to_disk_before_reuse(make_server, tmp_path):
    """With two sessions, a third conversation takes the least recently used idle session: that
    session's conversation is written to the disk KV cache first."""
    kv = tmp_path / "kv"
    # No snapshots: a conversation that left memory can only come back from disk.
    s = make_server("--ctx", "4096", "--batched-session", "2", "--kv-snapshots", "0", "--kv-disk-dir", str(kv), "--kv-disk-min-tokens", "16",
                    "--kv-cache-cold-max-tokens", "0", "--kv-cache-continued-interval-tokens", "0", name="batchdisk")

    def complete(tag):
        words = " ".join(f"{tag}{k}" for k in range(80))
        st, body = s.post_raw("/v1/completions", json.dumps({"prompt": f"conversation {tag}: {words}", "max_tokens": 8,
                                                              "temperature": 0}).encode())
        assert st == 200, body
        return body["choices"][0]["text"]

    a = complete("alpha")
    complete("beta")
    assert s.metrics()["ds4_kv_disk_saves_total"] == 0  # two sessions hold both conversations
    complete("gamma")
    assert s.metrics()["ds4_kv_disk_saves_total"] == 1  # alpha's session was saved, then reused
    # alpha again: neither session serves it, so the least recently used one (beta) is saved and reused.
    # (The saved alpha holds its prompt and its output, so it is no prefix of this prompt: no disk hit.)
    again = complete("alpha")
    assert s.metrics()["ds4_kv_disk_saves_total"] == 2
    assert again == a
