"""Each API, non-streamed and streamed, through the official SDKs."""
import json

import anthropic
import openai
import pytest


def test_models_and_health(server, oai):
    ids = [m.id for m in oai.models.list().data]
    assert "deepseek-v4-flash" in ids
    m = oai.models.retrieve("deepseek-v4-flash")
    assert m.id == "deepseek-v4-flash"
    assert server.get_json("/health")["status"] == "ok"
    assert "ds4_kv_reuse_hits_total" in server.get("/metrics")


def test_chat_non_streaming(oai):
    r = oai.chat.completions.create(model="deepseek-v4-flash", messages=[{"role": "user", "content": "hi"}],
                                    max_tokens=8, temperature=0, reasoning_effort="none")
    c = r.choices[0]
    assert r.object == "chat.completion"
    assert c.message.role == "assistant"
    assert c.finish_reason in ("length", "stop")
    assert r.usage.completion_tokens >= 1 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_greedy_is_deterministic(oai):
    kw = dict(model="m", messages=[{"role": "user", "content": "determinism"}], max_tokens=12, temperature=0,
              reasoning_effort="none")
    a = oai.chat.completions.create(**kw).choices[0].message.content
    b = oai.chat.completions.create(**kw).choices[0].message.content
    assert a == b


def test_chat_streaming_matches_non_streaming(oai):
    kw = dict(model="m", messages=[{"role": "user", "content": "stream me"}], max_tokens=10, temperature=0,
              reasoning_effort="none")
    full = oai.chat.completions.create(**kw)
    chunks = list(oai.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert text == full.choices[0].message.content
    assert finish == [full.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_chat_thinking_streams_reasoning(oai):
    # [[hello]] is scripted: "Thinking about hello.</think>Hello there, friend."
    r = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "[[hello]]"}], max_tokens=64)
    msg = r.choices[0].message
    assert msg.content == "Hello there, friend."
    assert msg.model_extra["reasoning_content"] == "Thinking about hello."
    assert r.choices[0].finish_reason == "stop"
    chunks = list(oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "[[hello]]"}],
                                              max_tokens=64, stream=True))
    reasoning = "".join((ch.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for ch in chunks)
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert reasoning == "Thinking about hello." and content == "Hello there, friend."


def test_chat_stop_string(oai):
    r = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "[[hello]]"}], max_tokens=64,
                                    stop=["friend"])
    assert r.choices[0].message.content == "Hello there, "
    assert r.choices[0].finish_reason == "stop"


def test_completions(oai):
    r = oai.completions.create(model="m", prompt="Once upon a time", max_tokens=8, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.completion_tokens >= 1
    chunks = list(oai.completions.create(model="m", prompt="Once upon a time", max_tokens=8, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text


def test_responses(oai):
    r = oai.responses.create(model="m", input="[[hello]]", max_output_tokens=64, reasoning={"summary": "auto"})
    assert r.status == "completed"
    assert r.output_text == "Hello there, friend."
    kinds = [o.type for o in r.output]
    assert kinds == ["reasoning", "message"]
    assert r.output[0].summary[0].text == "Thinking about hello."
    assert r.usage.output_tokens >= 1
    events = list(oai.responses.create(model="m", input="[[hello]]", max_output_tokens=64, stream=True))
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Hello there, friend."
    assert events[-1].response.output[-1].content[0].text == "Hello there, friend."
    # length limit -> incomplete
    r = oai.responses.create(model="m", input="write a lot", max_output_tokens=4, reasoning={"effort": "none"})
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"


def test_responses_stream_helper(oai):
    with oai.responses.stream(model="m", input="[[hello]]", max_output_tokens=64) as s:
        for _ in s:
            pass
        final = s.get_final_response()
    assert final.output_text == "Hello there, friend."


def test_messages(claude):
    r = claude.messages.create(model="deepseek-v4-flash", max_tokens=64, messages=[{"role": "user", "content": "[[hello]]"}])
    assert r.type == "message" and r.role == "assistant"
    assert [b.type for b in r.content] == ["thinking", "text"]
    assert r.content[0].thinking == "Thinking about hello."
    assert r.content[1].text == "Hello there, friend."
    assert r.stop_reason == "end_turn"
    # input_tokens excludes the cache reads (an identical earlier request may have left it all cached).
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens > 0 and r.usage.output_tokens > 0


def test_messages_count_tokens(claude):
    # The count is the prompt /v1/messages builds from the same body: equal to its reported usage.
    body = dict(model="m", system="be brief", thinking={"type": "disabled"},
                messages=[{"role": "user", "content": "count these words please"}])
    n = claude.messages.count_tokens(**body).input_tokens
    r = claude.messages.create(max_tokens=1, **body)
    assert n == r.usage.input_tokens + r.usage.cache_read_input_tokens + (r.usage.cache_creation_input_tokens or 0)
    longer = dict(body, messages=body["messages"] + [{"role": "assistant", "content": "ok"},
                                                     {"role": "user", "content": "and these too"}])
    assert claude.messages.count_tokens(**longer).input_tokens > n
    tools = [{"name": "get_weather", "description": "Weather of a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    assert claude.messages.count_tokens(tools=tools, **body).input_tokens > n
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.count_tokens(model="m", messages=[])


def test_messages_assistant_prefill_is_continued(claude, oai):
    """A conversation ending in an assistant message continues that turn (Anthropic's prefill): the
    reply is what the model writes after the prefill text, i.e. the raw completion of the prompt with
    that turn left open (written here by hand from the chat template), and only the new text."""
    B, U, A = "<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"
    msgs = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}]
    for thinking in ({"type": "disabled"}, {"type": "enabled", "budget_tokens": 1024}):
        r = claude.messages.create(model="m", max_tokens=8, extra_body={"temperature": 0}, thinking=thinking, messages=msgs)
        assert [b.type for b in r.content] == ["text"], r.content  # the answer goes on: no thinking block
        raw = oai.completions.create(model="m", prompt=f"{B}{U}Name a colour.{A}</think>The colour is", max_tokens=8, temperature=0)
        assert r.content[0].text == raw.choices[0].text and r.content[0].text
        assert not r.content[0].text.startswith("The colour is")
    # The same through OpenAI chat's `continue_final_message` (vLLM's name).
    c = oai.chat.completions.create(model="m", max_tokens=8, temperature=0, reasoning_effort="none",
                                    messages=msgs, extra_body={"continue_final_message": True})
    assert c.choices[0].message.content == r.content[0].text
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model="m", max_tokens=1, messages=msgs[:1], extra_body={"continue_final_message": True})
    # As Anthropic: a prefill ending in whitespace, or a last turn with an unanswered tool call, is a 400.
    with pytest.raises(anthropic.BadRequestError, match="trailing whitespace"):
        claude.messages.create(model="m", max_tokens=4, messages=[msgs[0], {"role": "assistant", "content": "The colour is "}])
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]}
    with pytest.raises(anthropic.BadRequestError, match="tool_result"):
        claude.messages.create(model="m", max_tokens=4, messages=[msgs[0], call])


def test_messages_streaming(claude):
    with claude.messages.stream(model="m", max_tokens=64, messages=[{"role": "user", "content": "[[hello]]"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == "Hello there, friend."
    assert final.content[0].type == "thinking" and final.content[0].thinking == "Thinking about hello."
    assert final.stop_reason == "end_turn"


def test_messages_nothink_limits(claude):
    r = claude.messages.create(model="m", max_tokens=5, extra_body={"temperature": 0}, thinking={"type": "disabled"},
                               system="be brief", messages=[{"role": "user", "content": "hello"}])
    assert r.stop_reason == "max_tokens"
    assert all(b.type == "text" for b in r.content)
    r = claude.messages.create(model="m", max_tokens=64, stop_sequences=["friend"],
                               messages=[{"role": "user", "content": "[[hello]]"}])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == "friend"
    assert r.content[-1].text == "Hello there, "


def test_sse_keepalive_during_prefill(make_server):
    """While a long prefill runs, a streaming client gets `: prefill` comments (here every second)."""
    import http.client
    s = make_server("--ctx", "8192", "--keepalive-secs", "1", "--prefill-chunk", "8", name="keepalive")
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "alpha beta gamma delta " * 180}],
                       "max_tokens": 2, "stream": True, "reasoning_effort": "none"})
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("content-type").startswith("text/event-stream")
    lines = r.read().decode().splitlines()
    conn.close()
    prefill_s = s.metrics()["ds4_prefill_microseconds_total"] / 1e6
    assert prefill_s > 1.0, f"prefill took only {prefill_s:.2f}s: make the prompt longer"
    assert lines.count(": prefill") >= 1, lines[:5]
    assert lines[-1] == "data: [DONE]" or "data: [DONE]" in lines


def test_requests_without_a_seed_sample_anew(oai, make_server):
    # Before, every request without `seed` used seed 0: at temperature 1 each "regenerate" gave the
    # same text. Now only an explicit seed (in the request, or the server's --seed) repeats a sample.
    kw = dict(model="m", messages=[{"role": "user", "content": "tell me something"}], max_tokens=16,
              temperature=1.0, extra_body={"min_p": 0.0}, reasoning_effort="none")
    unseeded = {oai.chat.completions.create(**kw).choices[0].message.content for _ in range(4)}
    assert len(unseeded) > 1, unseeded
    seeded = {oai.chat.completions.create(seed=42, **kw).choices[0].message.content for _ in range(3)}
    assert len(seeded) == 1, seeded
    s = make_server("--ctx", "1024", "--seed", "7", name="seeded")
    c = openai.OpenAI(base_url=s.base + "/v1", api_key="x", max_retries=0)
    fixed = {c.chat.completions.create(**kw).choices[0].message.content for _ in range(3)}
    assert len(fixed) == 1, fixed
