"""`ds4-server --role coordinator`: requests served through a route of this process's layers 0:2 and a
worker process (`ds4 --role worker --layers 3:output`) on loopback, tiny model.

The reference is the single-process server on the same model with the same prefill chunk: greedy output
must be identical (32-bit activations are exact). A worker killed (SIGKILL) or hung (SIGSTOP, or only its
compute thread blocked by the test-only DS4_DIST_TEST_HANG while its heartbeats go on) while a request
streams makes that request fail with an error naming the stage within the bound (--dist-timeout-s); while the route is incomplete requests fail at once with the missing layer (503);
after the worker registers again the next request succeeds with the reference output."""
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request

import openai
import pytest

from conftest import ROOT, free_port

DS4 = os.environ.get("DS4_BIN", str(ROOT / "target" / "release" / "ds4"))
TIMEOUT_S = 2
COMMON = ["--ctx", "1024", "--prefill-chunk", "16"]
PROMPT = "Tell me about the river, the bridge and the old mill near the village, in a few words."


class Worker:
    def __init__(self, tmp, port, name, env=None):
        self.log = open(tmp / f"{name}.log", "w")
        self.proc = subprocess.Popen(
            [DS4, "--role", "worker", "--layers", "3:output", "--coordinator", "127.0.0.1", str(port),
             "--ctx", "1024", "--threads", "1", "--dist-timeout-s", str(TIMEOUT_S)],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)
        self.log.close()


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    from conftest import Server
    assert os.path.exists(DS4), f"{DS4} missing: build with `cargo build --release -p ds4-cli`"
    tmp = tmp_path_factory.mktemp("dist")
    port = free_port()
    ref = Server(tmp, COMMON, "reference")
    coord = Server(tmp, COMMON + ["--role", "coordinator", "--layers", "0:2", "--listen", "127.0.0.1", str(port),
                                  "--dist-timeout-s", str(TIMEOUT_S)], "coordinator")
    state = {"ref": ref, "coord": coord, "port": port, "tmp": tmp, "workers": []}

    def start_worker(env=None):
        w = Worker(tmp, port, f"worker{len(state['workers'])}", env)
        state["workers"].append(w)
        wait_route(coord, "complete")
        return w

    state["start_worker"] = start_worker
    start_worker()
    yield state
    for w in state["workers"]:
        w.stop()
    coord.stop()
    ref.stop()


def wait_route(server, want, limit=30):
    deadline = time.time() + limit
    while True:
        st = server.get_json("/health")["route"]["status"]
        if (st == want) if want == "complete" else (st != "complete"):
            return st
        assert time.time() < deadline, f"route status {st!r}, waiting for {want}"
        time.sleep(0.05)


def health_code(server):
    import urllib.request
    try:
        with urllib.request.urlopen(server.base + "/health", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=60)


def greedy(server, prompt=PROMPT, n=24):
    r = client(server).chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}],
                                                max_tokens=n, temperature=0)
    m = r.choices[0].message
    return (getattr(m, "reasoning_content", None), m.content, r.choices[0].finish_reason, r.usage.completion_tokens)


def test_health_is_503_while_the_route_is_incomplete(make_server):
    s = make_server(*COMMON, "--role", "coordinator", "--layers", "0:2", "--listen", "127.0.0.1", str(free_port()),
                    name="lonely-coordinator")
    code, h = health_code(s)
    assert code == 503 and h["status"] == "route_incomplete", h
    assert "incomplete" in h["reason"] and h["route"]["status"] != "complete"


def test_route_output_equals_single_process(dist):
    assert health_code(dist["coord"])[0] == 200
    h = dist["coord"].get_json("/health")["route"]
    assert h["local_layers"] == "0:2" and [w["layers"] for w in h["workers"]] == ["3:output"], h
    # A prompt of several chunks (pipelined prefill), then greedy decode at the last stage.
    assert greedy(dist["coord"]) == greedy(dist["ref"])
    # Sampled (temperature 1, seeded): full logits come back and the coordinator samples.
    def sampled(s):
        r = client(s).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi there"}],
                                              max_tokens=12, temperature=1.0, seed=7)
        return r.choices[0].message.content, getattr(r.choices[0].message, "reasoning_content", None)
    assert sampled(dist["coord"]) == sampled(dist["ref"])
    # /metrics has the route's per-hop totals for prefill chunks and decode steps (compute, send, wait).
    with urllib.request.urlopen(dist["coord"].base + "/metrics", timeout=10) as r:
        m = r.read().decode()
    for phase in ("prefill", "decode"):
        for name in ("ds4_dist_hop_compute_seconds_total", "ds4_dist_hop_send_seconds_total", "ds4_dist_hop_wait_seconds_total"):
            assert f'{name}{{phase="{phase}",hop="1",layers="3:output"}}' in m, (name, phase, m[-2000:])


def stream_then_break(server, breaker):
    """Streams a long scripted answer; after a few deltas calls breaker(); returns (error, seconds from
    the break to the error)."""
    stream = client(server).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "[[long]] go"}], max_tokens=900, stream=True)
    seen, t_break = 0, None
    with pytest.raises(openai.APIError) as e:
        for ch in stream:
            if ch.choices and (ch.choices[0].delta.content or getattr(ch.choices[0].delta, "reasoning_content", None)):
                seen += 1
                if seen == 5:
                    breaker()
                    t_break = time.time()
            assert not (ch.choices and ch.choices[0].finish_reason), "the stream finished although the worker was gone"
    assert t_break is not None, "the stream failed before the worker was touched"
    return str(e.value), time.time() - t_break


def test_killed_worker_fails_the_request_then_restart_recovers(dist):
    coord, w = dist["coord"], dist["workers"][-1]
    msg, dt = stream_then_break(coord, lambda: w.proc.send_signal(signal.SIGKILL))
    assert "stage 1" in msg and "layers 3:output" in msg, msg
    assert dt < TIMEOUT_S + 3, f"error after {dt:.1f}s"
    wait_route(coord, "incomplete")
    # While the route is incomplete a request fails at once, naming the missing layer.
    t0 = time.time()
    with pytest.raises(openai.APIStatusError) as e:
        greedy(coord)
    assert e.value.status_code == 503 and "next needed layer 3" in str(e.value), str(e.value)
    assert time.time() - t0 < 2
    dist["start_worker"]()
    assert greedy(coord) == greedy(dist["ref"])
    assert coord.alive()


def test_non_streaming_request_gets_502_naming_the_stage(dist):
    coord, w = dist["coord"], dist["workers"][-1]
    killed = []

    def killer():
        # Once the request is running (the worker thread is busy), kill the worker.
        deadline = time.time() + 20
        while not coord.get_json("/health")["busy"] and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        w.proc.send_signal(signal.SIGKILL)
        killed.append(time.time())

    t = threading.Thread(target=killer)
    t.start()
    with pytest.raises(openai.APIStatusError) as e:
        client(coord).chat.completions.create(model="m", messages=[{"role": "user", "content": "[[long]] go"}],
                                              max_tokens=900)
    t_err = time.time()
    t.join()
    assert killed, "the request ended before the worker was killed"
    assert e.value.status_code == 502, (e.value.status_code, str(e.value))
    assert "stage 1" in str(e.value) and "layers 3:output" in str(e.value), str(e.value)
    assert t_err - killed[0] < TIMEOUT_S + 3
    wait_route(coord, "incomplete")
    dist["start_worker"]()
    assert greedy(coord) == greedy(dist["ref"])


def test_hung_worker_is_detected_within_the_bound(dist):
    coord, w = dist["coord"], dist["workers"][-1]
    msg, dt = stream_then_break(coord, lambda: w.proc.send_signal(signal.SIGSTOP))
    assert "stage 1" in msg and "layers 3:output" in msg, msg
    assert dt < TIMEOUT_S + 3, f"error after {dt:.1f}s"
    # Resumed, the worker finds its connection gone and registers again.
    w.proc.send_signal(signal.SIGCONT)
    # The resumed process first notices its old connection is gone (the route may flip back to
    # incomplete for a moment under load), then registers again: wait for a stable complete route.
    wait_route(coord, "complete")
    time.sleep(TIMEOUT_S + 0.5)
    wait_route(coord, "complete")
    assert greedy(coord, "another prompt, after the hang") == greedy(dist["ref"], "another prompt, after the hang")


def test_hung_compute_with_live_heartbeats_fails_the_stream_naming_the_stage(dist):
    """The worker stays connected and its heartbeat thread goes on, but its compute thread blocks in
    its 40th forward request (test-only DS4_DIST_TEST_HANG: a deadlock or GPU hang), mid-stream: the
    heartbeats show no progress, so the stream gets an error event naming the stage, the timeout after
    the last token; a restarted worker serves the next request with the reference output."""
    coord = dist["coord"]
    dist["workers"][-1].stop()
    wait_route(coord, "incomplete")
    hung = dist["start_worker"]({"DS4_DIST_TEST_HANG": "40"})
    stream = client(coord).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "[[long]] go"}], max_tokens=900, stream=True)
    seen, t_last = 0, None
    with pytest.raises(openai.APIError) as e:
        for ch in stream:
            if ch.choices and (ch.choices[0].delta.content or getattr(ch.choices[0].delta, "reasoning_content", None)):
                seen += 1
                t_last = time.time()
            assert not (ch.choices and ch.choices[0].finish_reason), "the stream finished although the worker hung"
    dt = time.time() - t_last
    msg = str(e.value)
    assert seen >= 5, f"the hang came before the stream got going ({seen} deltas)"
    assert "stage 1" in msg and "layers 3:output" in msg and "compute hung" in msg, msg
    assert TIMEOUT_S - 0.3 <= dt < TIMEOUT_S + 3, f"error {dt:.1f}s after the last token"
    assert hung.proc.poll() is None, "the hung worker is still running (only its compute thread is stuck)"
    wait_route(coord, "incomplete")
    hung.stop()
    dist["start_worker"]()
    assert greedy(coord) == greedy(dist["ref"])


@pytest.mark.parametrize("args,want", [
    (["--layers", "0:2"], "--layers requires --role"),
    (["--role", "coordinator", "--layers", "0:2"], "--listen"),
    (["--role", "coordinator", "--layers", "3:5", "--listen", "127.0.0.1", "0"], "0:K"),
    (["--role", "coordinator", "--layers", "0:2", "--listen", "127.0.0.1", "0", "--dist-activation-bits", "12"], "32, 16 or 8"),
    (["--role", "worker", "--layers", "3:output", "--coordinator", "127.0.0.1", "1"], "ds4 --role worker"),
    (["--role", "coordinator", "--layers", "0:2", "--listen", "127.0.0.1", "0", "--kv-disk-dir", "/tmp/x"], "--kv-disk-dir"),
    (["--dist-token", "s"], "requires --role"),
    (["--role", "coordinator", "--layers", "0:2", "--listen", "nosuchhost.invalid", "9000"], "does not resolve"),
])
def test_bad_distributed_flags_exit_2(args, want):
    from conftest import BIN
    r = subprocess.run([str(BIN)] + args, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert want in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_bad_test_hang_value_exits_2():
    r = subprocess.run([DS4, "--role", "worker", "--layers", "3:output", "--coordinator", "127.0.0.1", "1"],
                       capture_output=True, text=True, timeout=30, env={**os.environ, "DS4_DIST_TEST_HANG": "soon"})
    assert r.returncode == 2, r.stderr
    assert "DS4_DIST_TEST_HANG" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
