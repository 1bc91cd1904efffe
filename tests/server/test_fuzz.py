"""Mutated requests to the four APIs (wrong types, huge or nested values, unknown fields, random bytes,
streamed or not): every answer is a 2xx or a 4xx with a JSON error body, never a 5xx, and the server
keeps serving. A fixed seed makes the run repeatable; a by-hand run of 4,500 such requests found none."""
import json
import random
import urllib.error
import urllib.request

BASE = {
    "/v1/chat/completions": {"model": "deepseek-v4-flash", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
                             "max_tokens": 4, "temperature": 0, "stream": False, "stop": ["x"], "logprobs": True, "top_logprobs": 2, "seed": 1,
                             "top_p": 0.9, "reasoning_effort": "none",
                             "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}]},
    "/v1/completions": {"model": "x", "prompt": "hello", "max_tokens": 4, "temperature": 0.5, "stop": "\n", "logprobs": 2, "stream": False},
    "/v1/responses": {"model": "x", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}], "max_output_tokens": 4, "instructions": "be brief", "stream": False},
    "/v1/messages": {"model": "x", "max_tokens": 4, "system": "s", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "stream": False,
                     "tools": [{"name": "t", "input_schema": {"type": "object"}}], "thinking": {"type": "disabled"}},
}
WEIRD = [None, True, False, 0, -1, 1e308, -1e308, 2**63, "", "x" * 5000, [], {}, [1, "a", None], {"a": [{}]}, "NaN", 3.5, [[[]]], "\u0000"]
EXTRA = ["n", "logit_bias", "tool_choice", "response_format", "max_completion_tokens", "top_k", "min_p", "presence_penalty", "stream_options", "parallel_tool_calls", "metadata", "user"]


def mutate(rnd, v):
    if rnd.random() < 0.15:
        return rnd.choice(WEIRD)
    if isinstance(v, dict):
        v = dict(v)
        for k in list(v):
            if rnd.random() < 0.3:
                v[k] = mutate(rnd, v[k])
            elif rnd.random() < 0.05:
                del v[k]
        if rnd.random() < 0.1:
            v[rnd.choice(EXTRA)] = rnd.choice(WEIRD + [1, 2, {"type": "json_object"}, "auto", "required", {"include_usage": True}])
        return v
    if isinstance(v, list):
        v = [mutate(rnd, x) if rnd.random() < 0.3 else x for x in v]
        if v and rnd.random() < 0.2:
            v = v * rnd.randint(2, 50)
        return v
    return v


def post(base, path, data):
    req = urllib.request.Request(base + path, data=data, headers={"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def test_mutated_requests_get_2xx_or_a_json_4xx(make_server):
    s = make_server("--ctx", "512", "--tokens", "16")
    rnd = random.Random(20261206)
    codes = {}
    for _ in range(250):
        path = rnd.choice(list(BASE))
        body = mutate(rnd, BASE[path])
        if isinstance(body, dict) and rnd.random() < 0.3:
            body["stream"] = True
        data = json.dumps(body).encode() if rnd.random() > 0.05 else bytes(rnd.getrandbits(8) for _ in range(rnd.randint(0, 300)))
        st, text = post(s.base, path, data)
        codes[st] = codes.get(st, 0) + 1
        assert st < 500, f"{st} for {path} {data[:300]!r}: {text[:300]}"
        if st >= 400:
            assert "error" in json.loads(text), f"{st} without a JSON error for {path}: {text[:300]}"
    print("status codes:", codes)
    assert s.alive()
    assert codes.get(200, 0) > 50 and sum(v for k, v in codes.items() if 400 <= k < 500) > 50, codes
