"""Disk KV cache (`--kv-disk-dir`): sessions survive a restart and conversation switches, damaged cache
files are ignored with a warning (and removed) without changing any output, and the directory stays
within `--kv-disk-space-mb`. Greedy outputs are compared with cold runs."""
import time
from pathlib import Path

import pytest
from openai import OpenAI

SYS = {"role": "system", "content": "You are a terse assistant. Answer in one line."}
CONV_A = [SYS, {"role": "user", "content": "Conversation A: describe the longest river you know in some detail please."}]
CONV_B = [SYS, {"role": "user", "content": "Conversation B: name three mountains, their heights, and who first climbed them."}]
CONVS = [CONV_A, CONV_B] + [
    [SYS, {"role": "user", "content": f"Conversation {k}: a distinct question number {k} about oceans and their currents."}]
    for k in range(3, 7)
]
# Every prefill saved whole (no trim, no alignment), so a restart restores the whole prompt.
DISK = ["--ctx", "2048", "--kv-snapshots", "0", "--kv-disk-min-tokens", "8",
        "--kv-cache-boundary-trim-tokens", "0", "--kv-cache-boundary-align-tokens", "0"]


def client(s):
    return OpenAI(base_url=s.base + "/v1", api_key="x", max_retries=0, timeout=120)


def chat(s, messages, n=8):
    r = client(s).chat.completions.create(model="m", messages=messages, max_tokens=n, temperature=0, reasoning_effort="none")
    return r.choices[0].message.content, r.usage


KEYS = ["ds4_prefilled_tokens_total", "ds4_cached_tokens_total", "ds4_kv_disk_hits_total", "ds4_kv_disk_saves_total",
        "ds4_kv_disk_evictions_total", "ds4_kv_disk_bad_files_total", "ds4_kv_disk_loaded_tokens_total",
        'ds4_kv_reuse_total{kind="disk"}', "ds4_kv_reuse_misses_total", "ds4_kv_disk_bytes", "ds4_kv_disk_files"]


def counters(s):
    m = s.metrics()
    return {k: m.get(k, 0) for k in KEYS}


def run(s, messages, n=8):
    """One request; returns (text, usage, counter deltas)."""
    before = counters(s)
    text, usage = chat(s, messages, n)
    after = counters(s)
    return text, usage, {k: after[k] - before[k] for k in KEYS}


def kv_files(d: Path):
    return sorted(p for p in d.iterdir() if p.suffix == ".kv")


def log_of(s):
    return Path(s.log.name).read_text()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Cold greedy outputs of every conversation (no disk cache, no snapshots)."""
    from conftest import Server
    s = Server(tmp_path_factory.mktemp("kvdisk-ref"), ["--ctx", "2048", "--kv-snapshots", "0"], "ref")
    try:
        out = {}
        for i, conv in enumerate(CONVS):
            text, usage, d = run(s, conv)
            assert d["ds4_kv_reuse_misses_total"] == 1 and d["ds4_cached_tokens_total"] == 0
            out[i] = (text, usage.prompt_tokens)
        return out
    finally:
        s.stop()


def test_restart_restores_the_prompt_from_disk(make_server, tmp_path, reference):
    d = tmp_path / "kv"
    s1 = make_server(*DISK, "--kv-disk-dir", str(d), name="first")
    text, usage, delta = run(s1, CONV_A)
    assert text == reference[0][0]
    assert delta["ds4_kv_disk_saves_total"] == 1 and delta["ds4_prefilled_tokens_total"] == usage.prompt_tokens
    assert len(kv_files(d)) == 1
    s1.stop()
    # The clean shutdown (SIGTERM) saved the live session too: prompt + generated tokens.
    assert len(kv_files(d)) == 2
    assert "reason=shutdown" in log_of(s1)

    s2 = make_server(*DISK, "--kv-disk-dir", str(d), name="second")
    assert s2.metrics()["ds4_kv_disk_files"] == 2
    text2, usage2, delta2 = run(s2, CONV_A)
    assert delta2["ds4_kv_disk_hits_total"] == 1 and delta2['ds4_kv_reuse_total{kind="disk"}'] == 1
    # The whole prompt came from disk: nothing prefilled.
    assert delta2["ds4_prefilled_tokens_total"] == 0
    assert delta2["ds4_kv_disk_loaded_tokens_total"] == usage2.prompt_tokens
    assert usage2.prompt_tokens_details.cached_tokens == usage2.prompt_tokens
    assert text2 == text

    # A follow-up turn of the same conversation after yet another restart extends the saved state:
    # only the new suffix is prefilled.
    s2.stop()
    s3 = make_server(*DISK, "--kv-disk-dir", str(d), name="third")
    follow = CONV_A + [{"role": "assistant", "content": text}, {"role": "user", "content": "Shorter please."}]
    _, usage3, delta3 = run(s3, follow)
    assert delta3["ds4_kv_disk_hits_total"] == 1
    assert 0 < delta3["ds4_prefilled_tokens_total"] < usage3.prompt_tokens - reference[0][1] + 4


def test_switching_conversations_restores_from_disk(make_server, tmp_path, reference):
    d = tmp_path / "kv"
    s = make_server(*DISK, "--kv-disk-dir", str(d), name="switch")
    a1, _, da1 = run(s, CONV_A)
    b1, _, db1 = run(s, CONV_B)
    # B replaced A: A's live state (prompt + answer) was saved first, then B's prompt.
    assert db1["ds4_kv_disk_saves_total"] == 2 and db1["ds4_kv_disk_hits_total"] == 0
    a2, u2, da2 = run(s, CONV_A)
    assert da2["ds4_kv_disk_hits_total"] == 1 and da2['ds4_kv_reuse_total{kind="disk"}'] == 1
    assert da2["ds4_prefilled_tokens_total"] == 0 and u2.prompt_tokens_details.cached_tokens == u2.prompt_tokens
    b2, _, db2 = run(s, CONV_B)
    assert db2["ds4_kv_disk_hits_total"] == 1 and db2["ds4_prefilled_tokens_total"] == 0
    assert (a1, b1) == (reference[0][0], reference[1][0])
    assert (a2, b2) == (a1, b1)


def corrupt(p: Path, how: str):
    b = bytearray(p.read_bytes())
    n = len(b)
    if n < 200:
        return  # damaged in an earlier round and not looked at since
    if how == "flip-magic":
        b[0] ^= 0xFF
    elif how == "flip-header":
        b[60] ^= 0x01
    elif how == "flip-tokens":
        b[170] ^= 0x04
    elif how == "flip-middle":
        b[n // 2] ^= 0x20
    elif how == "flip-last":
        b[-1] ^= 0x80
    elif how == "truncate-half":
        b = b[: n // 2]
    elif how == "truncate-one":
        b = b[:-1]
    elif how == "truncate-tiny":
        b = b[:7]
    elif how == "empty":
        b = b""
    elif how == "version":
        b[8] = 99
    p.write_bytes(bytes(b))


def test_damaged_cache_files_are_ignored_and_removed(make_server, tmp_path, reference):
    d = tmp_path / "kv"
    s = make_server(*DISK, "--kv-disk-dir", str(d), name="damage")
    run(s, CONV_A)
    run(s, CONV_B)
    bad_total = 0
    # While running: files damaged after they were indexed fail their checksum when loaded.
    for how in ["flip-middle", "flip-last", "truncate-half", "truncate-one", "empty", "flip-tokens"]:
        files = kv_files(d)
        assert len(files) >= 2
        for f in files:
            corrupt(f, how)
        for i in (0, 1):
            text, usage, delta = run(s, CONVS[i])
            assert text == reference[i][0], how
            assert delta["ds4_kv_disk_hits_total"] == 0 and delta["ds4_prefilled_tokens_total"] == usage.prompt_tokens, how
            bad_total += delta["ds4_kv_disk_bad_files_total"]
            assert delta["ds4_kv_disk_bad_files_total"] >= 1, how
        assert s.alive()
    assert "WARNING ignoring and removing cache file" in log_of(s)
    s.stop()

    # At start-up: damaged headers are found while indexing, before any request.
    kinds = ["flip-magic", "flip-header", "truncate-tiny", "version"]
    files = kv_files(d)
    assert len(files) >= 2
    for k, f in enumerate(files):
        corrupt(f, kinds[k % len(kinds)])
    # A file not named as the cache names its files (e.g. a --kv-save session file) is not the cache's:
    # left in place, not counted.
    (d / "not-a-cache.kv").write_bytes(b"hello")
    s2 = make_server(*DISK, "--kv-disk-dir", str(d), name="damage-restart")
    m = s2.metrics()
    assert m["ds4_kv_disk_files"] == 0 and m["ds4_kv_disk_bad_files_total"] == len(files)
    assert [f.name for f in kv_files(d)] == ["not-a-cache.kv"]
    for i in (0, 1):
        text, _, delta = run(s2, CONVS[i])
        assert text == reference[i][0] and delta["ds4_kv_disk_hits_total"] == 0
    assert "WARNING" in log_of(s2)


def test_directory_stays_within_the_budget(make_server, tmp_path, reference):
    d = tmp_path / "kv"
    probe = make_server(*DISK, "--kv-disk-dir", str(d), name="probe")
    run(probe, CONV_A)
    size = max(f.stat().st_size for f in kv_files(d))
    probe.stop()
    # Room for four and a half files: the sessions of six conversations cannot all stay.
    budget = int(size * 4.5)
    s = make_server(*DISK, "--kv-disk-dir", str(d), "--kv-disk-space-mb", str(budget / (1 << 20)), name="budget")

    def check(i, delta_hits=None):
        text, _, delta = run(s, CONVS[i])
        assert text == reference[i][0]
        total = sum(f.stat().st_size for f in kv_files(d))
        assert total <= budget + size, f"{total} bytes on disk, budget {budget}"
        assert s.metrics()["ds4_kv_disk_bytes"] == total
        if delta_hits is not None:
            assert delta["ds4_kv_disk_hits_total"] == delta_hits, i

    # A and B are switched between (each switch restores the other from disk): frequently hit files.
    check(0, 1)  # the probe's file
    for _ in range(2):
        check(1)
        check(0, 1)
    check(1, 1)
    for i in range(2, len(CONVS)):
        check(i, 0)
    m = s.metrics()
    assert m["ds4_kv_disk_evictions_total"] >= 4
    assert "evicted reason=disk-cache-full" in log_of(s)
    # The frequently hit conversations outlived the newer, never-hit files.
    check(0, 1)
    check(1, 1)


def test_tool_call_ids_survive_a_restart(make_server, tmp_path):
    """The scripted tool-call turn is saved at shutdown with its id → exact DSML entry; after a restart the
    client's tool result turn replays that DSML byte-exact, so the saved state is a prefix of the new
    prompt and only the tool result is prefilled."""
    from conftest import WEATHER_SCHEMA
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}}]
    d = tmp_path / "kv"
    s1 = make_server(*DISK, "--kv-disk-dir", str(d), name="tools1")
    user = {"role": "user", "content": "[[weather]] What is the weather in Paris?"}
    r1 = client(s1).chat.completions.create(model="m", messages=[user], tools=tools, max_tokens=300)
    (tc,) = r1.choices[0].message.tool_calls
    s1.stop()
    s2 = make_server(*DISK, "--kv-disk-dir", str(d), name="tools2")
    before = counters(s2)
    replay_before = s2.metrics().get("ds4_tool_replay_exact_total", 0)
    history = [user,
               {"role": "assistant", "content": None, "reasoning_content": "I should call the weather tool.",
                "tool_calls": [tc.model_dump()]},
               {"role": "tool", "tool_call_id": tc.id, "content": "sunny-result: 18C"}]
    r2 = client(s2).chat.completions.create(model="m", messages=history, tools=tools, max_tokens=300)
    assert r2.choices[0].message.content == "It is sunny in Paris."
    after = counters(s2)
    assert s2.metrics()["ds4_tool_replay_exact_total"] - replay_before == 1
    assert after["ds4_kv_disk_hits_total"] - before["ds4_kv_disk_hits_total"] == 1
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached >= r1.usage.prompt_tokens + r1.usage.completion_tokens - 2
    assert after["ds4_prefilled_tokens_total"] - before["ds4_prefilled_tokens_total"] == r2.usage.prompt_tokens - cached


def test_ds4_save_policy_trims_aligns_and_saves_at_frontiers(make_server, tmp_path):
    """ds4's --kv-cache-* flags: a cold prompt is saved at its length minus the trim, aligned down; a
    longer prefill also saves at every interval frontier it crosses."""
    d = tmp_path / "kv"
    flags = ["--ctx", "2048", "--kv-snapshots", "0", "--kv-disk-dir", str(d), "--kv-cache-min-tokens", "8",
             "--kv-cache-boundary-trim-tokens", "5", "--kv-cache-boundary-align-tokens", "16",
             "--kv-cache-continued-interval-tokens", "0"]
    s1 = make_server(*flags, name="policy1")
    _, usage, delta = run(s1, CONV_A)
    n = usage.prompt_tokens
    assert delta["ds4_kv_disk_saves_total"] == 1
    s1.proc.kill()  # no shutdown save: only the cold save is on disk
    s1.proc.wait(10)
    s2 = make_server(*flags, name="policy2")
    _, usage2, delta2 = run(s2, CONV_A)
    assert delta2["ds4_kv_disk_hits_total"] == 1
    assert usage2.prompt_tokens_details.cached_tokens == (n - 5) // 16 * 16
    s2.proc.kill()
    s2.proc.wait(10)
    # Frontiers every 8 tokens, no cold saves: a cold prompt of n tokens is saved at each multiple of 8.
    d2 = tmp_path / "kv2"
    s3 = make_server("--ctx", "2048", "--kv-snapshots", "0", "--kv-disk-dir", str(d2), "--kv-cache-min-tokens", "8",
                     "--kv-cache-cold-max-tokens", "0", "--kv-cache-continued-interval-tokens", "8", name="policy3")
    _, usage3, delta3 = run(s3, CONV_A)
    assert delta3["ds4_kv_disk_saves_total"] == usage3.prompt_tokens // 8


@pytest.mark.parametrize("sessions", ["1", "2"])
def test_sigterm_with_streams_in_flight_saves_and_exits_promptly(make_server, tmp_path, sessions):
    """SIGTERM while long generations stream to clients that keep reading, and another request waits:
    after the connection grace (5 s) the requests still open are dropped (their generations stop), the
    live sessions are saved to disk, and the process exits. It used to keep every generation running
    behind the closed listener and wait up to 60 s for them (a long one left the session unsaved)."""
    import json
    import signal
    import subprocess
    import threading
    import urllib.request

    d = tmp_path / "kv"
    s = make_server("--ctx", "32768", "--kv-disk-dir", str(d), "--kv-disk-min-tokens", "8",
                    "--batched-session", sessions, name="sigterm")

    def stream():
        body = {"messages": [{"role": "user", "content": "[[endless]] go"}], "max_tokens": 30000, "stream": True}
        req = urllib.request.Request(s.base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=200) as r:
                while r.readline():  # a client that keeps reading
                    pass
        except Exception:
            pass

    clients = [threading.Thread(target=stream, daemon=True) for _ in range(3)]
    for c in clients:
        c.start()
    deadline = time.time() + 30
    while s.metrics().get("ds4_worker_busy", 0) == 0 and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # well into the generations
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    try:
        rc = s.proc.wait(40)
    except subprocess.TimeoutExpired:
        rc = None
    took = time.time() - t0
    assert rc == 0, f"exit code {rc} after {took:.1f}s: {log_of(s)[-2000:]}"
    assert took < 20, f"exit took {took:.1f}s"
    log = log_of(s)
    assert "reason=shutdown" in log, log[-2000:]
    assert "was not saved" not in log
    assert "panic" not in log
    # The generations were stopped, not run to their end behind the closed listener.
    assert "finish=cancelled" in log and "finish=length" not in log, log[-2000:]
