"""Bounded loopback load test: 16 concurrent clients x 8 requests (a mix of APIs, streamed and not),
4 of which disconnect mid-stream. Every other request must complete with the same greedy output as a
serial reference run, the cancelled generations must stop (and free the worker), the server must stay
healthy, and its memory must not grow across rounds. Prints p50/p99 latency."""
import statistics
import threading
import time

import anthropic
import openai

CLIENTS = 16
PER_CLIENT = 8
MAX_TOKENS = 8
PROMPTS = [f"load prompt number {i} about topic {i * 7}" for i in range(4)]


def do_request(oc, ac, kind, prompt):
    """One greedy request; returns the visible text (comparable across kinds of the same API)."""
    msgs = [{"role": "user", "content": prompt}]
    if kind == "chat":
        r = oc.chat.completions.create(model="m", messages=msgs, max_tokens=MAX_TOKENS, temperature=0, reasoning_effort="none")
        assert r.choices[0].finish_reason in ("length", "stop")
        return ("chat", r.choices[0].message.content)
    if kind == "chat-stream":
        text, fin = "", None
        for ch in oc.chat.completions.create(model="m", messages=msgs, max_tokens=MAX_TOKENS, temperature=0,
                                             reasoning_effort="none", stream=True):
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                fin = ch.choices[0].finish_reason or fin
        assert fin in ("length", "stop")
        return ("chat", text)
    if kind == "messages":
        r = ac.messages.create(model="m", max_tokens=MAX_TOKENS, messages=msgs, thinking={"type": "disabled"},
                               extra_body={"temperature": 0})
        assert r.stop_reason in ("max_tokens", "end_turn")
        return ("chat", "".join(b.text for b in r.content if b.type == "text"))
    if kind == "responses":
        r = oc.responses.create(model="m", input=prompt, max_output_tokens=MAX_TOKENS, temperature=0,
                                reasoning={"effort": "none"})
        assert r.status in ("completed", "incomplete")
        return ("chat", r.output_text)
    if kind == "completions":
        r = oc.completions.create(model="m", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
        return ("completions", r.choices[0].text)
    raise AssertionError(kind)


KINDS = ["chat", "chat-stream", "messages", "responses", "completions"]


def disconnect_mid_stream(oc):
    s = oc.chat.completions.create(model="m", messages=[{"role": "user", "content": "a very long story please"}],
                                   max_tokens=3000, temperature=0, reasoning_effort="none", stream=True)
    n = 0
    for _ in s:
        n += 1
        if n >= 3:
            break
    s.close()


def run_round(server, reference, cancel_clients):
    latencies, errors, wrong = [], [], []
    lock = threading.Lock()

    def client(ci):
        oc = openai.OpenAI(base_url=server.base + "/v1", api_key="x", max_retries=0, timeout=300)
        ac = anthropic.Anthropic(base_url=server.base, api_key="x", max_retries=0, timeout=300)
        for k in range(PER_CLIENT):
            try:
                if ci in cancel_clients and k == 0:
                    disconnect_mid_stream(oc)
                    continue
                kind = KINDS[(ci + k) % len(KINDS)]
                prompt = PROMPTS[(ci * 3 + k) % len(PROMPTS)]
                t0 = time.perf_counter()
                got = do_request(oc, ac, kind, prompt)
                dt = time.perf_counter() - t0
                with lock:
                    latencies.append(dt)
                    if got[1] != reference[(got[0], prompt)]:
                        wrong.append((kind, prompt, got, reference[(got[0], prompt)]))
            except Exception as e:  # noqa: BLE001 - collected and asserted below
                with lock:
                    errors.append(f"client {ci} req {k}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return latencies, errors, wrong, time.perf_counter() - t0


def test_load(make_server, capsys):
    s = make_server("--ctx", "8192", "--max-queue", "64", name="load")
    oc = openai.OpenAI(base_url=s.base + "/v1", api_key="x", max_retries=0)
    ac = anthropic.Anthropic(base_url=s.base, api_key="x", max_retries=0)
    reference = {}
    for p in PROMPTS:  # serial reference outputs
        reference[("chat", p)] = do_request(oc, ac, "chat", p)[1]
        reference[("completions", p)] = do_request(oc, ac, "completions", p)[1]
    rss = []
    all_lat = []
    for rnd, cancel_clients in enumerate([{1, 5, 9, 13}, {2, 6, 10, 14}]):
        before = s.metrics()
        lat, errors, wrong, wall = run_round(s, reference, cancel_clients)
        after = s.metrics()
        assert not errors, errors[:5]
        assert not wrong, wrong[:3]
        assert len(lat) == CLIENTS * PER_CLIENT - len(cancel_clients)
        assert after["ds4_jobs_cancelled_total"] - before["ds4_jobs_cancelled_total"] == len(cancel_clients)
        assert after["ds4_jobs_failed_total"] == 0
        # cancelled generations stopped early: far fewer tokens than their 3000-token budgets
        gen = after["ds4_generated_tokens_total"] - before["ds4_generated_tokens_total"]
        assert gen < len(lat) * MAX_TOKENS + len(cancel_clients) * 1000, gen
        assert s.alive() and s.get_json("/health")["status"] == "ok"
        assert after["ds4_queue_depth"] == 0
        rss.append(after["ds4_process_resident_bytes"])
        all_lat += lat
        lat.sort()
        with capsys.disabled():
            print(f"\nload round {rnd}: {len(lat)} requests + {len(cancel_clients)} disconnects in {wall:.2f}s, "
                  f"p50 {statistics.median(lat) * 1000:.0f} ms, p99 {lat[int(0.99 * (len(lat) - 1))] * 1000:.0f} ms, "
                  f"rss {rss[-1] / 2**20:.1f} MiB")
    # memory does not grow across rounds (allow small allocator noise)
    assert rss[1] <= rss[0] * 1.10 + 8 * 2**20, rss
    # the server still answers normally afterwards
    assert do_request(oc, ac, "chat", PROMPTS[0])[1] == reference[("chat", PROMPTS[0])]
