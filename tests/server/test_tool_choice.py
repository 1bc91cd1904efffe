"""tool_choice that forces a call, on every API, streamed and not.

The server starts the reply with the DSML opening of a tool-call block (through the `invoke` header for
a named tool) and parses the model's continuation as the rest of that call. Scripted continuations
(`[[forced-named]]`, `[[forced-any]]` in conftest) check the arguments parse; unscripted requests get the
tiny model's random tokens, which never form a call: the reply must still be a call to the forced tool
(arguments `{}` or whatever parses), never text.
"""
import json

import pytest

from conftest import WEATHER_SCHEMA

ARGS = {"city": "Paris", "days": 2}
SEARCH_SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}},
              {"type": "function", "function": {"name": "search", "parameters": SEARCH_SCHEMA}}]
RESP_TOOLS = [{"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA},
              {"type": "function", "name": "search", "parameters": SEARCH_SCHEMA}]
CLAUDE_TOOLS = [{"name": "get_weather", "input_schema": WEATHER_SCHEMA}, {"name": "search", "input_schema": SEARCH_SCHEMA}]
NAMES = {"get_weather", "search"}


def chat_named(name):
    return {"type": "function", "function": {"name": name}}


def chat_stream_calls(chunks):
    calls, finish, text = {}, None, ""
    for ch in chunks:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        text += d.content or ""
        for t in d.tool_calls or []:
            e = calls.setdefault(t.index, {"id": None, "name": "", "arguments": ""})
            e["id"] = t.id or e["id"]
            e["name"] += t.function.name or ""
            e["arguments"] += t.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    return list(calls.values()), finish, text


@pytest.mark.parametrize("prompt,choice", [("[[forced-named]] weather?", chat_named("get_weather")),
                                           ("[[forced-any]] weather?", "required")])
def test_chat_forced_call_parses_the_continuation(oai, prompt, choice):
    kw = dict(model="m", messages=[{"role": "user", "content": prompt}], tools=CHAT_TOOLS, tool_choice=choice, max_tokens=200)
    r = oai.chat.completions.create(**kw)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    # The forced reply has no reasoning (the server default is thinking mode): the call starts the turn.
    assert not (c.message.model_extra or {}).get("reasoning_content")
    (tc,) = c.message.tool_calls
    assert tc.id.startswith("call_") and tc.function.name == "get_weather" and json.loads(tc.function.arguments) == ARGS
    calls, finish, text = chat_stream_calls(oai.chat.completions.create(stream=True, **kw))
    assert finish == "tool_calls" and text == ""
    assert [(x["name"], json.loads(x["arguments"])) for x in calls] == [("get_weather", ARGS)]


@pytest.mark.parametrize("choice,want", [(chat_named("search"), {"search"}), ("required", NAMES)])
def test_chat_forced_call_from_random_tokens_is_still_a_call(oai, choice, want):
    kw = dict(model="m", messages=[{"role": "user", "content": "no script here"}], tools=CHAT_TOOLS, tool_choice=choice,
              max_tokens=12, temperature=0)
    c = oai.chat.completions.create(**kw).choices[0]
    assert c.finish_reason == "tool_calls" and not c.message.content
    assert len(c.message.tool_calls) >= 1
    tc = c.message.tool_calls[0]
    assert tc.function.name in want and isinstance(json.loads(tc.function.arguments), dict)
    calls, finish, text = chat_stream_calls(oai.chat.completions.create(stream=True, **kw))
    assert finish == "tool_calls" and text == ""
    assert calls[0]["name"] == tc.function.name and json.loads(calls[0]["arguments"]) == json.loads(tc.function.arguments)


def test_chat_auto_with_random_tokens_is_text(oai):
    # The control: the same request without forcing answers with text, no call.
    c = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "no script here"}], tools=CHAT_TOOLS,
                                    max_tokens=12, temperature=0, reasoning_effort="none").choices[0]
    assert c.finish_reason != "tool_calls" and not c.message.tool_calls


def test_unknown_forced_tool_is_a_400(server, oai, claude):
    import anthropic
    import openai
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="m", messages=msgs, tools=CHAT_TOOLS, tool_choice=chat_named("nope"), max_tokens=4)
    assert e.value.status_code == 400 and "nope" in e.value.body["message"] and e.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model="m", input="hi", tools=RESP_TOOLS, tool_choice={"type": "function", "name": "nope"}, max_output_tokens=4)
    assert "nope" in e.value.body["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="m", max_tokens=4, tools=CLAUDE_TOOLS, tool_choice={"type": "tool", "name": "nope"}, messages=msgs)
    assert e.value.body["type"] == "error" and "nope" in e.value.body["error"]["message"]
    # "required" without tools, and values that are no tool_choice at all.
    st, body = server.post_raw("/v1/chat/completions", json.dumps({"messages": msgs, "tool_choice": "required"}).encode())
    assert st == 400 and "tools" in body["error"]["message"]
    st, body = server.post_raw("/v1/chat/completions", json.dumps({"messages": msgs, "tools": CHAT_TOOLS, "tool_choice": "sometimes"}).encode())
    assert st == 400 and body["error"]["param"] == "tool_choice"


def test_responses_forced_call(oai):
    for prompt, choice in [("[[forced-named]] r", {"type": "function", "name": "get_weather"}), ("[[forced-any]] r", "required")]:
        kw = dict(model="m", input=prompt, tools=RESP_TOOLS, tool_choice=choice, max_output_tokens=200)
        r = oai.responses.create(**kw)
        assert [o.type for o in r.output] == ["function_call"]
        assert r.output[0].name == "get_weather" and json.loads(r.output[0].arguments) == ARGS
        with oai.responses.stream(**kw) as st:
            final = st.get_final_response()
        assert [o.type for o in final.output] == ["function_call"] and json.loads(final.output[0].arguments) == ARGS
    kw = dict(model="m", input="random", tools=RESP_TOOLS, tool_choice={"type": "function", "name": "search"}, max_output_tokens=12)
    r = oai.responses.create(**kw)
    assert [(o.type, o.name) for o in r.output] == [("function_call", "search")]
    with oai.responses.stream(**kw) as st:
        final = st.get_final_response()
    assert [(o.type, o.name) for o in final.output] == [("function_call", "search")]


def test_messages_forced_tool_use(claude):
    for prompt, choice in [("[[forced-named]] a", {"type": "tool", "name": "get_weather"}), ("[[forced-any]] a", {"type": "any"})]:
        kw = dict(model="m", max_tokens=200, tools=CLAUDE_TOOLS, tool_choice=choice, messages=[{"role": "user", "content": prompt}])
        r = claude.messages.create(**kw)
        assert r.stop_reason == "tool_use"
        assert [(b.type, b.name, b.input) for b in r.content] == [("tool_use", "get_weather", ARGS)]
        with claude.messages.stream(**kw) as s:
            final = s.get_final_message()
        assert final.stop_reason == "tool_use" and [(b.type, b.input) for b in final.content] == [("tool_use", ARGS)]
    kw = dict(model="m", max_tokens=12, tools=CLAUDE_TOOLS, tool_choice={"type": "tool", "name": "search"},
              messages=[{"role": "user", "content": "random"}])
    r = claude.messages.create(**kw)
    assert r.stop_reason == "tool_use" and [(b.type, b.name) for b in r.content] == [("tool_use", "search")]
    with claude.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use" and [(b.type, b.name) for b in final.content] == [("tool_use", "search")]


def test_messages_forced_tool_use_refuses_extended_thinking(claude):
    import anthropic
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="m", max_tokens=2048, tools=CLAUDE_TOOLS, tool_choice={"type": "any"},
                               thinking={"type": "enabled", "budget_tokens": 1024}, messages=[{"role": "user", "content": "hi"}])
    assert "thinking" in e.value.body["error"]["message"].lower()


def test_one_call_when_parallel_calls_are_off(server, oai):
    # Scripted: two complete calls in one block; with parallel calls off only the first is returned.
    def messages(extra):
        body = {"model": "m", "max_tokens": 200, "tools": CLAUDE_TOOLS, "messages": [{"role": "user", "content": "[[forced-two]] x"}],
                "tool_choice": {"type": "any", **extra}}
        st, r = server.post_raw("/v1/messages", json.dumps(body).encode())
        assert st == 200 and r["stop_reason"] == "tool_use", r
        return [b["name"] for b in r["content"]]
    assert messages({}) == ["search", "get_weather"]
    assert messages({"disable_parallel_tool_use": True}) == ["search"]
    kw = dict(model="m", messages=[{"role": "user", "content": "[[forced-two]] y"}], tools=CHAT_TOOLS, tool_choice="required", max_tokens=200)
    assert [t.function.name for t in oai.chat.completions.create(**kw).choices[0].message.tool_calls] == ["search", "get_weather"]
    c = oai.chat.completions.create(parallel_tool_calls=False, **kw).choices[0]
    assert c.finish_reason == "tool_calls" and [t.function.name for t in c.message.tool_calls] == ["search"]


def test_forced_call_reuses_the_kv_prefix(server, oai):
    user = {"role": "user", "content": "[[forced-named]] kv reuse"}
    r1 = oai.chat.completions.create(model="m", messages=[user], tools=CHAT_TOOLS, tool_choice=chat_named("get_weather"), max_tokens=200)
    tc = r1.choices[0].message.tool_calls[0]
    m = server.metrics()
    history = [user, {"role": "assistant", "content": None, "tool_calls": [tc.model_dump()]},
               {"role": "tool", "tool_call_id": tc.id, "content": "sunny-result: 18C"}]
    r2 = oai.chat.completions.create(model="m", messages=history, tools=CHAT_TOOLS, max_tokens=200)
    assert r2.choices[0].message.content == "It is sunny in Paris."
    # The forced opening was part of the first prompt and is part of the replayed history: the whole
    # first turn comes from the live KV state.
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached >= r1.usage.prompt_tokens + r1.usage.completion_tokens - 2, (cached, r1.usage)
    assert server.metrics().get("ds4_tool_replay_exact_total", 0) - m.get("ds4_tool_replay_exact_total", 0) == 1


def test_count_tokens_counts_the_forced_opening(claude):
    kw = dict(model="m", tools=CLAUDE_TOOLS, messages=[{"role": "user", "content": "hi"}])
    auto = claude.messages.count_tokens(**kw).input_tokens
    forced = claude.messages.count_tokens(tool_choice={"type": "tool", "name": "search"}, **kw).input_tokens
    assert forced > auto


def test_forced_call_with_batched_sessions(make_server):
    from openai import OpenAI
    s = make_server("--ctx", "4096", "--batched-session", "2", name="batched")
    oai = OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=120)
    kw = dict(model="m", messages=[{"role": "user", "content": "[[forced-named]] batched"}], tools=CHAT_TOOLS,
              tool_choice=chat_named("get_weather"), max_tokens=200)
    (tc,) = oai.chat.completions.create(**kw).choices[0].message.tool_calls
    assert tc.function.name == "get_weather" and json.loads(tc.function.arguments) == ARGS
    calls, finish, _ = chat_stream_calls(oai.chat.completions.create(stream=True, **kw))
    assert finish == "tool_calls" and [json.loads(x["arguments"]) for x in calls] == [ARGS]


@pytest.mark.parametrize("limit", [1, 2])
def test_forced_call_cut_by_the_token_limit_reports_the_limit(oai, claude, limit):
    # Audit: a forced call cut by max_tokens was reported finished (`tool_calls` / `tool_use` /
    # `completed`), so a client ran the made-up call (arguments `{}`, required `city` missing) as if the
    # model had written it. It is still a well-formed call, but the finish names the limit, as
    # OpenAI and Anthropic report a call they cut.
    named = chat_named("get_weather")
    kw = dict(model="m", messages=[{"role": "user", "content": "[[forced-named]] cut"}], tools=CHAT_TOOLS, tool_choice=named,
              max_completion_tokens=limit)
    c = oai.chat.completions.create(**kw).choices[0]
    assert c.finish_reason == "length" and c.message.content is None
    (tc,) = c.message.tool_calls
    assert tc.id.startswith("call_") and tc.function.name == "get_weather" and json.loads(tc.function.arguments) == {}
    chunks = list(oai.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    calls, finish, text = chat_stream_calls(chunks)
    assert finish == "length" and text == "" and [(x["name"], x["arguments"]) for x in calls] == [("get_weather", "{}")]
    assert chunks[-1].usage.completion_tokens == limit
    r = oai.responses.create(model="m", input="[[forced-named]] cut", tools=RESP_TOOLS, tool_choice={"type": "function", "name": "get_weather"},
                             max_output_tokens=limit)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [(o.type, o.name, o.arguments) for o in r.output] == [("function_call", "get_weather", "{}")]
    akw = dict(model="m", max_tokens=limit, tools=CLAUDE_TOOLS, tool_choice={"type": "tool", "name": "get_weather"},
               messages=[{"role": "user", "content": "[[forced-named]] cut"}])
    m = claude.messages.create(**akw)
    assert m.stop_reason == "max_tokens" and [(b.type, b.name, b.input) for b in m.content] == [("tool_use", "get_weather", {})]
    with claude.messages.stream(**akw) as s:
        final = s.get_final_message()
    assert final.stop_reason == "max_tokens" and [(b.type, b.input) for b in final.content] == [("tool_use", {})]
    # With room to finish, the same call is complete and says so.
    full = oai.chat.completions.create(**{**kw, "max_completion_tokens": 200}).choices[0]
    assert full.finish_reason == "tool_calls" and json.loads(full.message.tool_calls[0].function.arguments) == ARGS


def test_forced_call_cut_by_a_stop_string_reports_the_stop(oai, claude):
    # Audit: a stop string matched inside the forced DSML ended the call early but the reply said
    # `tool_calls` / `tool_use` (Anthropic's `stop_sequence` was null).
    kw = dict(model="m", messages=[{"role": "user", "content": "[[forced-named]] stop"}], tools=CHAT_TOOLS,
              tool_choice=chat_named("get_weather"), max_tokens=200, stop=["Paris"])
    c = oai.chat.completions.create(**kw).choices[0]
    assert c.finish_reason == "stop" and [t.function.name for t in c.message.tool_calls] == ["get_weather"]
    calls, finish, _ = chat_stream_calls(oai.chat.completions.create(stream=True, **kw))
    assert finish == "stop" and [x["name"] for x in calls] == ["get_weather"]
    m = claude.messages.create(model="m", max_tokens=200, tools=CLAUDE_TOOLS, tool_choice={"type": "tool", "name": "get_weather"},
                               stop_sequences=["Paris"], messages=[{"role": "user", "content": "[[forced-named]] stop"}])
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", "Paris") and [b.type for b in m.content] == ["tool_use"]
    # A stop string the call never contains changes nothing.
    c = oai.chat.completions.create(**{**kw, "stop": ["zzz-never"]}).choices[0]
    assert c.finish_reason == "tool_calls" and json.loads(c.message.tool_calls[0].function.arguments) == ARGS


def test_tool_choice_none_never_returns_a_call(oai, claude):
    # Audit: with `tool_choice: none` (schemas left out of the prompt) a tool-call block the model wrote
    # anyway (scripted `[[weather]]`) came back as a call with finish `tool_calls` / `tool_use`. It is
    # the model's text now, in every API, streamed or not.
    from conftest import TOOL_OUTPUT
    block = TOOL_OUTPUT.split("</think>", 1)[1].lstrip()
    kw = dict(model="m", messages=[{"role": "user", "content": "[[weather]] none"}], tools=CHAT_TOOLS, tool_choice="none", max_tokens=300)
    c = oai.chat.completions.create(**kw).choices[0]
    assert c.finish_reason == "stop" and not c.message.tool_calls and block in c.message.content
    calls, finish, text = chat_stream_calls(oai.chat.completions.create(stream=True, **kw))
    assert (calls, finish) == ([], "stop") and text == c.message.content
    r = oai.responses.create(model="m", input="[[weather]] none", tools=RESP_TOOLS, tool_choice="none", max_output_tokens=300)
    assert [o.type for o in r.output] == ["reasoning", "message"] and block in r.output_text
    with oai.responses.stream(model="m", input="[[weather]] none", tools=RESP_TOOLS, tool_choice="none", max_output_tokens=300) as st:
        final = st.get_final_response()
    assert [o.type for o in final.output] == ["reasoning", "message"] and final.output_text == r.output_text
    akw = dict(model="m", max_tokens=300, tools=CLAUDE_TOOLS, tool_choice={"type": "none"}, messages=[{"role": "user", "content": "[[weather]] none"}])
    m = claude.messages.create(**akw)
    assert m.stop_reason == "end_turn" and [b.type for b in m.content] == ["thinking", "text"] and block in m.content[1].text
    with claude.messages.stream(**akw) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[1].text == m.content[1].text
    # The same request with tool_choice auto is a call.
    auto = oai.chat.completions.create(**{**kw, "tool_choice": "auto"}).choices[0]
    assert auto.finish_reason == "tool_calls" and auto.message.tool_calls[0].function.name == "get_weather"
