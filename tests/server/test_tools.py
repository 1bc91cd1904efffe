"""Tool-call round trips on every API.

With random weights the model never calls a tool on its own, so the first turn is scripted through the
server's test-only `--test-script` (see conftest): the scripted DSML tokens run through the model and
the real streaming DSML parser, which turns them into OpenAI `tool_calls` / Anthropic `tool_use` /
Responses `function_call`. The client then sends the call back with a tool result; the server must
replay the exact sampled DSML for that id (history byte-identical), which shows up as a live-KV
extension: every token of the first turn is reused and only the tool result is prefilled.
"""
import json

from conftest import WEATHER_SCHEMA

ARGS = {"city": "Paris", "days": 2}
REASONING = "I should call the weather tool."
ANSWER = "It is sunny in Paris."
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                                 "parameters": WEATHER_SCHEMA}}]


def delta(server, before, key):
    return server.metrics().get(key, 0) - before.get(key, 0)


def assert_reused(server, before, first_prompt, first_completion, cached):
    # The whole first turn (prompt + the scripted tokens that were fed back) came from the live KV state.
    assert cached >= first_prompt + first_completion - 2, (cached, first_prompt, first_completion)
    assert delta(server, before, "ds4_tool_replay_exact_total") == 1
    assert delta(server, before, 'ds4_kv_reuse_total{kind="extend"}') == 1


def test_chat_tool_round_trip(server, oai):
    user = {"role": "user", "content": "[[weather]] What is the weather in Paris?"}
    r1 = oai.chat.completions.create(model="m", messages=[user], tools=CHAT_TOOLS, max_tokens=300)
    c = r1.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.content is None
    assert c.message.model_extra["reasoning_content"] == REASONING
    (tc,) = c.message.tool_calls
    assert tc.id.startswith("call_") and tc.type == "function"
    assert tc.function.name == "get_weather" and json.loads(tc.function.arguments) == ARGS

    before = server.metrics()
    history = [user,
               {"role": "assistant", "content": None, "reasoning_content": REASONING,
                "tool_calls": [tc.model_dump()]},
               {"role": "tool", "tool_call_id": tc.id, "content": "sunny-result: 18C"}]
    r2 = oai.chat.completions.create(model="m", messages=history, tools=CHAT_TOOLS, max_tokens=300)
    assert r2.choices[0].message.content == ANSWER and r2.choices[0].finish_reason == "stop"
    assert_reused(server, before, r1.usage.prompt_tokens, r1.usage.completion_tokens,
                  r2.usage.prompt_tokens_details.cached_tokens)


def test_chat_tool_call_streaming(oai):
    user = {"role": "user", "content": "[[weather]] stream it"}
    chunks = list(oai.chat.completions.create(model="m", messages=[user], tools=CHAT_TOOLS, max_tokens=300, stream=True))
    calls = {}
    finish = None
    for ch in chunks:
        d = ch.choices[0].delta
        for t in d.tool_calls or []:
            e = calls.setdefault(t.index, {"id": None, "name": "", "arguments": ""})
            e["id"] = t.id or e["id"]
            if t.function:
                e["name"] += t.function.name or ""
                e["arguments"] += t.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert list(calls) == [0]
    assert calls[0]["id"].startswith("call_") and calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == ARGS


def test_chat_stream_with_a_tool_call_cut_short(oai):
    # The output limit falls inside the DSML block: the call never completes and comes back as text.
    # Streamed, no tool call may be announced (before: its id and name went out with empty arguments,
    # then the block's text followed as content); the text equals the non-streamed answer's.
    user = {"role": "user", "content": "[[weather]] cut short"}
    kw = dict(model="m", messages=[user], tools=CHAT_TOOLS, max_tokens=60)
    chunks = list(oai.chat.completions.create(stream=True, **kw))
    assert not any(ch.choices and ch.choices[0].delta.tool_calls for ch in chunks)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["length"]
    r = oai.chat.completions.create(**kw)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "length"
    assert "get_weather" in text and r.choices[0].message.content == text


def test_chat_edited_tool_call_is_not_replayed(server, oai):
    user = {"role": "user", "content": "[[weather]] edited history"}
    r1 = oai.chat.completions.create(model="m", messages=[user], tools=CHAT_TOOLS, max_tokens=300)
    tc = r1.choices[0].message.tool_calls[0].model_dump()
    tc["function"]["arguments"] = json.dumps({"city": "London", "days": 2})
    before = server.metrics()
    history = [user, {"role": "assistant", "content": None, "reasoning_content": REASONING, "tool_calls": [tc]},
               {"role": "tool", "tool_call_id": tc["id"], "content": "sunny-result"}]
    r2 = oai.chat.completions.create(model="m", messages=history, tools=CHAT_TOOLS, max_tokens=300)
    assert r2.choices[0].message.content == ANSWER
    # The edited call is rendered canonically (not the sampled DSML), so it diverges from the live state;
    # the server rewinds to the snapshot taken at the end of the first prompt.
    assert delta(server, before, "ds4_tool_replay_exact_total") == 0
    assert delta(server, before, 'ds4_kv_reuse_total{kind="snapshot"}') == 1
    assert r2.usage.prompt_tokens_details.cached_tokens == r1.usage.prompt_tokens


def test_responses_tool_round_trip(server, oai):
    tools = [{"type": "function", "name": "get_weather", "description": "Weather forecast", "parameters": WEATHER_SCHEMA}]
    user = {"role": "user", "content": "[[weather]] Responses API"}
    r1 = oai.responses.create(model="m", input=[user], tools=tools, max_output_tokens=300)
    assert [o.type for o in r1.output] == ["reasoning", "function_call"]
    fc = r1.output[1]
    assert fc.call_id.startswith("call_") and fc.name == "get_weather" and json.loads(fc.arguments) == ARGS

    before = server.metrics()
    items = [user] + [o.model_dump(exclude_none=True) for o in r1.output] + [
        {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny-result: 18C"}]
    r2 = oai.responses.create(model="m", input=items, tools=tools, max_output_tokens=300)
    assert r2.output_text == ANSWER and r2.status == "completed"
    assert_reused(server, before, r1.usage.input_tokens, r1.usage.output_tokens, r2.usage.input_tokens_details.cached_tokens)

    events = list(oai.responses.create(model="m", input=[user], tools=tools, max_output_tokens=300, stream=True))
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments) == ARGS
    assert events[-1].type == "response.completed"
    assert events[-1].response.output[-1].type == "function_call"


def test_messages_tool_round_trip(server, claude):
    tools = [{"name": "get_weather", "description": "Weather forecast", "input_schema": WEATHER_SCHEMA}]
    user = {"role": "user", "content": "[[weather]] Anthropic API"}
    r1 = claude.messages.create(model="m", max_tokens=300, tools=tools, messages=[user])
    assert r1.stop_reason == "tool_use"
    assert [b.type for b in r1.content] == ["thinking", "tool_use"]
    tu = r1.content[1]
    assert tu.id.startswith("toolu_") and tu.name == "get_weather" and tu.input == ARGS

    before = server.metrics()
    history = [user, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r1.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu.id, "content": "sunny-result: 18C"}]}]
    r2 = claude.messages.create(model="m", max_tokens=300, tools=tools, messages=history)
    assert r2.content[-1].text == ANSWER and r2.stop_reason == "end_turn"
    assert_reused(server, before, r1.usage.input_tokens, r1.usage.output_tokens, r2.usage.cache_read_input_tokens)

    with claude.messages.stream(model="m", max_tokens=300, tools=tools, messages=[user]) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    assert final.content[-1].type == "tool_use" and final.content[-1].input == ARGS


def test_responses_stream_with_a_tool_call_cut_short(oai):
    # The output limit falls inside the DSML block: the call never completes and comes back as text.
    # The stream must stay well formed for the SDK's accumulator: before, the call's item was added
    # when its name was parsed, never finished, and the text's item was added at the same output_index
    # (the SDK raised "Duplicate response output index").
    tools = [{"type": "function", "name": "get_weather", "description": "Weather forecast", "parameters": WEATHER_SCHEMA}]
    kw = dict(model="m", input="[[weather]] cut short", tools=tools, max_output_tokens=60)
    with oai.responses.stream(**kw) as st:
        events = list(st)
    added = [e.output_index for e in events if e.type == "response.output_item.added"]
    assert len(added) == len(set(added)), added
    last = events[-1]
    assert last.type == "response.incomplete"
    assert [o.type for o in last.response.output] == ["reasoning", "message"]
    text = last.response.output[1].content[0].text
    assert "get_weather" in text
    # The same as the non-streamed answer.
    r = oai.responses.create(**kw)
    assert [o.type for o in r.output] == ["reasoning", "message"] and r.output[1].content[0].text == text
    # A complete call is still a function_call item, streamed and not.
    with oai.responses.stream(model="m", input="[[weather]] complete", tools=tools, max_output_tokens=300) as st:
        final = st.get_final_response()
    assert [o.type for o in final.output] == ["reasoning", "function_call"]
    assert json.loads(final.output[1].arguments) == ARGS
