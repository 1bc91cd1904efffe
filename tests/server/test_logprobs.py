"""OpenAI logprobs (chat, completions, responses; streamed and not) through the official SDK, and the
numbers checked against the CLI and against a log-softmax recomputed here from the raw logits.

Logprobs are log_softmax(raw logits), before temperature/top-p, so for greedy decoding the chosen token
is the most likely one."""
import json
import math
import os
import subprocess
from pathlib import Path

from conftest import ROOT

CLI = Path(os.environ.get("DS4_BIN", ROOT / "target" / "release" / "ds4"))
BOS = "<｜begin▁of▁sentence｜>"
RAW_PROMPT = BOS + "The quick brown fox"
TOL = 1e-4


def check_greedy_entry(e, k):
    """One chat/responses entry of a greedy generation: k alternatives, sorted, the chosen one on top."""
    assert len(e.top_logprobs) == k
    lps = [t.logprob for t in e.top_logprobs]
    assert lps == sorted(lps, reverse=True)
    assert all(lp <= 0 for lp in lps)
    assert abs(e.logprob - lps[0]) < 1e-6, (e, lps)
    assert bytes(e.bytes) == e.token.encode() or "\ufffd" in e.token
    # A tie at the top is the only way the chosen token may be another than the first listed.
    assert e.token == e.top_logprobs[0].token or abs(lps[0] - lps[1]) < 1e-6


def joined(entries):
    return b"".join(bytes(e.bytes) for e in entries)


def chat_kw(content="logprobs please", **kw):
    return dict(model="m", messages=[{"role": "user", "content": content}], max_tokens=6, temperature=0,
                reasoning_effort="none", **kw)


def test_chat_logprobs_greedy_streamed_and_not(oai):
    r = oai.chat.completions.create(logprobs=True, top_logprobs=3, **chat_kw())
    c = r.choices[0]
    content = c.logprobs.content
    assert c.finish_reason == "length"
    assert len(content) == r.usage.completion_tokens == 6
    for e in content:
        check_greedy_entry(e, 3)
    try:
        text = joined(content).decode()
    except UnicodeDecodeError:
        text = None
    if text is not None:
        assert text == c.message.content
    # Same numbers when streamed; every token's logprobs arrive exactly once, in order.
    chunks = list(oai.chat.completions.create(logprobs=True, top_logprobs=3, stream=True, **chat_kw()))
    streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [(e.token, e.logprob, [t.logprob for t in e.top_logprobs]) for e in streamed] == \
        [(e.token, e.logprob, [t.logprob for t in e.top_logprobs]) for e in content]
    # Off by default, and without alternatives when top_logprobs is not given.
    assert oai.chat.completions.create(**chat_kw()).choices[0].logprobs is None
    plain = oai.chat.completions.create(logprobs=True, **chat_kw()).choices[0].logprobs.content
    assert [e.logprob for e in plain] == [e.logprob for e in content]
    assert all(e.top_logprobs == [] for e in plain)


def test_chat_logprobs_cover_only_the_visible_content(oai):
    # [[hello]] is scripted: "Thinking about hello.</think>Hello there, friend." (thinking mode).
    r = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "[[hello]]"}], max_tokens=64,
                                    logprobs=True, top_logprobs=2)
    c = r.choices[0]
    assert c.message.content == "Hello there, friend."
    assert joined(c.logprobs.content).decode() == "Hello there, friend."
    assert r.usage.completion_tokens_details.reasoning_tokens > 0
    for e in c.logprobs.content:
        assert len(e.top_logprobs) == 2
        # Scripted tokens are not the model's choice: only bounded by the top alternative.
        assert e.logprob <= e.top_logprobs[0].logprob + 1e-6


def test_top_logprobs_over_20_is_rejected(server):
    st, body = server.post_raw("/v1/chat/completions", json.dumps(
        {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21}).encode())
    assert st == 400 and body["error"]["param"] == "top_logprobs", body
    st, body = server.post_raw("/v1/completions", json.dumps({"prompt": "x", "logprobs": 21}).encode())
    assert st == 400 and body["error"]["param"] == "logprobs", body


def completion(oai, **kw):
    return oai.completions.create(model="m", prompt=RAW_PROMPT, max_tokens=4, temperature=0, logprobs=5, **kw)


def test_completions_logprobs_streamed_and_not(oai):
    r = completion(oai)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    for tok, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        # Keys are token texts: two tokens with the same (lossy) text share one key.
        assert 1 <= len(top) <= 5
        assert abs(max(top.values()) - v) < 1e-6
        assert tok in top
    offs = [0]
    for t in lp.tokens[:-1]:
        offs.append(offs[-1] + len(t))
    assert lp.text_offset == offs
    chunks = list(completion(oai, stream=True))
    toks = [t for ch in chunks if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens]
    vals = [v for ch in chunks if ch.choices and ch.choices[0].logprobs for v in ch.choices[0].logprobs.token_logprobs]
    offs_s = [o for ch in chunks if ch.choices and ch.choices[0].logprobs for o in ch.choices[0].logprobs.text_offset]
    assert (toks, vals, offs_s) == (lp.tokens, lp.token_logprobs, lp.text_offset)


def test_responses_logprobs_streamed_and_not(oai):
    kw = dict(model="m", input="logprobs please", max_output_tokens=5, temperature=0, reasoning={"effort": "none"},
              include=["message.output_text.logprobs"], top_logprobs=2)
    r = oai.responses.create(**kw)
    msg = [o for o in r.output if o.type == "message"][0]
    entries = msg.content[0].logprobs
    assert len(entries) == r.usage.output_tokens == 5
    for e in entries:
        check_greedy_entry(e, 2)
    deltas, done = [], None
    for ev in oai.responses.create(stream=True, **kw):
        if ev.type == "response.output_text.delta":
            deltas.extend(ev.logprobs)
        elif ev.type in ("response.completed", "response.incomplete"):
            done = ev.response
    assert [(e.token, e.logprob) for e in deltas] == [(e.token, e.logprob) for e in entries]
    final = [o for o in done.output if o.type == "message"][0].content[0].logprobs
    assert [(e.token, e.logprob) for e in final] == [(e.token, e.logprob) for e in entries]
    # Without `include` or `top_logprobs` the content carries none.
    plain = oai.responses.create(**{k: v for k, v in kw.items() if k not in ("include", "top_logprobs")})
    assert not getattr([o for o in plain.output if o.type == "message"][0].content[0], "logprobs", None)


def cli(tmp_path, *args):
    assert CLI.exists(), f"{CLI} missing: build with `cargo build --release -p ds4-cli --bin ds4`"
    # Run where no ./ds4flash.gguf exists: the CLI then uses the same embedded tiny model as the server.
    r = subprocess.run([str(CLI), "--threads", "2", *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def log_softmax(logits):
    m = max(logits)
    lse = m + math.log(sum(math.exp(x - m) for x in logits))
    return [x - lse for x in logits]


def test_completions_logprobs_match_the_cli_and_a_recomputation(oai, tmp_path):
    lp = completion(oai).choices[0].logprobs
    # The CLI's --logprobs-top-k: same prompt (already starting with BOS: tokenized as written), greedy.
    lines = [json.loads(l) for l in cli(tmp_path, "-p", RAW_PROMPT, "--temp", "0", "-n", "4", "--logprobs-top-k", "5").splitlines()]
    assert len(lines) == 4
    for i, step in enumerate(lines):
        assert step["text"] == lp.tokens[i]
        assert abs(step["logprob"] - lp.token_logprobs[i]) < TOL
        assert {t["text"]: t["logprob"] for t in step["top_logprobs"]}.keys() == lp.top_logprobs[i].keys()
    # Independent of our logprob code: log_softmax of the raw logits the CLI dumps for the same prompt.
    f = tmp_path / "logits.json"
    cli(tmp_path, "-p", RAW_PROMPT, "--dump-logits", str(f))
    ref = log_softmax(json.loads(f.read_text())["logits"])
    order = sorted(range(len(ref)), key=lambda i: -ref[i])
    assert order[0] == lines[0]["id"]
    assert abs(ref[order[0]] - lp.token_logprobs[0]) < TOL
    assert [t["id"] for t in lines[0]["top_logprobs"]] == order[:5]
    got = sorted(lp.top_logprobs[0].values(), reverse=True)
    assert all(abs(a - ref[i]) < TOL for a, i in zip(got, order[:5]))


def test_chat_logprobs_leave_out_a_tool_call_block(oai):
    from conftest import WEATHER_SCHEMA
    # [[weather]] is scripted: reasoning, "</think>\n\n", then a DSML tool-call block.
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}}]
    r = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "[[weather]]"}], tools=tools,
                                    max_tokens=200, logprobs=True)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    text = joined(c.logprobs.content).decode()
    assert "DSML" not in text and "get_weather" not in text and "Paris" not in text, text
