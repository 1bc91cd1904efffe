"""Live KV reuse: a request extending the live session prefills only its suffix (from /metrics and the
usage's cached tokens), a divergent one rewinds to a snapshot, and greedy output equals a cold run's
(a fresh server with snapshots off)."""
import pytest
from openai import OpenAI

SYS = {"role": "system", "content": "You are a terse assistant. Answer in one line."}


def client(s):
    return OpenAI(base_url=s.base + "/v1", api_key="x", max_retries=0, timeout=120)


def chat(c, messages, n=16):
    r = c.chat.completions.create(model="m", messages=messages, max_tokens=n, temperature=0, reasoning_effort="none")
    return r.choices[0].message.content, r.usage


def counters(s):
    m = s.metrics()
    return {k: m.get(k, 0) for k in ["ds4_prefilled_tokens_total", "ds4_cached_tokens_total",
                                     'ds4_kv_reuse_total{kind="extend"}', 'ds4_kv_reuse_total{kind="snapshot"}',
                                     "ds4_kv_reuse_misses_total"]}


def diff(a, b):
    return {k: b[k] - a[k] for k in a}


@pytest.fixture
def pair(make_server):
    warm = make_server("--ctx", "4096", name="warm")
    cold = make_server("--ctx", "4096", "--kv-snapshots", "0", name="cold")
    return warm, cold


def cold_run(cold, messages, n=16):
    c = client(cold)
    # Reset the cold server's live state with an unrelated prompt, so nothing can be reused.
    chat(c, [{"role": "user", "content": "unrelated reset prompt"}], 2)
    before = counters(cold)
    out = chat(c, messages, n)
    d = diff(before, counters(cold))
    assert d["ds4_kv_reuse_misses_total"] == 1 and d["ds4_cached_tokens_total"] == 0
    return out[0]


def test_extension_prefills_only_the_suffix(pair):
    warm, cold = pair
    c = client(warm)
    first = [SYS, {"role": "user", "content": "[[plain]] first question"}]
    a1, u1 = chat(c, first)
    assert a1 == "Plain scripted answer."
    second = first + [{"role": "assistant", "content": a1}, {"role": "user", "content": "and a follow-up question"}]
    before = counters(warm)
    a2, u2 = chat(c, second)
    d = diff(before, counters(warm))
    assert d['ds4_kv_reuse_total{kind="extend"}'] == 1
    cached = u2.prompt_tokens_details.cached_tokens
    # everything of turn one (prompt + answer tokens) was reused; only the new suffix was prefilled
    assert cached >= u1.prompt_tokens + u1.completion_tokens - 1
    assert d["ds4_prefilled_tokens_total"] == u2.prompt_tokens - cached
    assert d["ds4_prefilled_tokens_total"] < 20
    assert a2 == cold_run(cold, second)

    # Same request again (regenerate): the prompt is a prefix of the live state -> the snapshot taken at
    # the end of its prefill is restored and nothing is prefilled.
    before = counters(warm)
    a3, u3 = chat(c, second)
    d = diff(before, counters(warm))
    assert d['ds4_kv_reuse_total{kind="snapshot"}'] == 1 and d["ds4_prefilled_tokens_total"] == 0
    assert a3 == a2


def test_divergent_prompt_rewinds_to_common_prefix(pair):
    warm, cold = pair
    c = client(warm)
    chat(c, [SYS, {"role": "user", "content": "tell me about rivers"}])
    other = [SYS, {"role": "user", "content": "tell me about mountains instead"}]
    before = counters(warm)
    a, u = chat(c, other)
    d = diff(before, counters(warm))
    # rewound to the snapshot at the start of the (shared) system prompt's user turn
    assert d['ds4_kv_reuse_total{kind="snapshot"}'] == 1
    cached = u.prompt_tokens_details.cached_tokens
    assert cached > 10 and d["ds4_prefilled_tokens_total"] == u.prompt_tokens - cached
    assert a == cold_run(cold, other)


def test_completions_extension(pair):
    warm, cold = pair
    c = client(warm)
    p1 = "The quick brown fox"
    r1 = c.completions.create(model="m", prompt=p1, max_tokens=4, temperature=0)
    before = counters(warm)
    # token ids: the first prompt's ids are a prefix of the second's by construction
    ids1 = list(range(5, 40))
    c.completions.create(model="m", prompt=ids1, max_tokens=1, temperature=0)
    ids2 = ids1 + list(range(40, 60))
    r2 = c.completions.create(model="m", prompt=ids2, max_tokens=8, temperature=0)
    d = diff(before, counters(warm))
    assert r2.usage.prompt_tokens_details.cached_tokens >= len(ids1)
    # live = ids1 + one generated token, so ids2 rewinds to the snapshot at the end of ids1
    assert d['ds4_kv_reuse_total{kind="snapshot"}'] == 1
    assert d["ds4_prefilled_tokens_total"] == len(ids1) + len(ids2) - len(ids1)
    cc = client(cold)
    cc.completions.create(model="m", prompt="reset", max_tokens=1)
    assert r2.choices[0].text == cc.completions.create(model="m", prompt=ids2, max_tokens=8, temperature=0).choices[0].text
    assert r1.choices[0].text == cc.completions.create(model="m", prompt=p1, max_tokens=4, temperature=0).choices[0].text
