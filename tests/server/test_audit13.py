"""Audit 13: regressions for stop-sequence reporting and the Responses object's request echo."""
import json

from conftest import WEATHER_SCHEMA


def test_messages_stop_sequence_after_an_empty_entry(claude):
    # An empty stop string can never match; the hit must still name the entry that matched (it was
    # reported as "" because the matcher's index skipped the empty entry and the reply's did not).
    kw = dict(model="m", max_tokens=64, stop_sequences=["", "scripted", ""], thinking={"type": "disabled"},
              messages=[{"role": "user", "content": "[[plain]]"}])
    r = claude.messages.create(**kw)
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == "scripted"
    assert r.content[0].text == "Plain "
    with claude.messages.stream(**kw) as s:
        m = s.get_final_message()
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "scripted"
    assert m.content[0].text == "Plain "


def test_chat_stop_list_with_empty_strings(oai):
    r = oai.chat.completions.create(model="m", max_tokens=64, stop=["", "friend"], reasoning_effort="none",
                                    messages=[{"role": "user", "content": "[[hello]]"}])
    assert r.choices[0].finish_reason == "stop"
    assert "friend" not in (r.choices[0].message.content or "")


def test_responses_echo_request_fields(oai):
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA}]
    kw = dict(model="m", input="[[plain]]", instructions="be brief", tools=tools, tool_choice="auto",
              metadata={"k": "v"}, max_output_tokens=200, temperature=0, top_p=1, reasoning={"effort": "none"})
    r = oai.responses.create(**kw)
    with oai.responses.stream(**kw) as s:
        created = None
        for e in s:
            if e.type == "response.created":
                created = e.response
        f = s.get_final_response()
    for resp in (r, f, created):
        assert resp.instructions == "be brief"
        assert [t.name for t in resp.tools] == ["get_weather"]
        assert resp.metadata == {"k": "v"}
        assert resp.max_output_tokens == 200 and resp.temperature == 0 and resp.top_p == 1
        assert resp.tool_choice == "auto"
    assert r.output_text == f.output_text == "Plain scripted answer."
    # Without them the defaults stay.
    d = oai.responses.create(model="m", input="[[plain]]", max_output_tokens=200, reasoning={"effort": "none"})
    assert d.instructions is None and d.tools == [] and d.metadata == {}


def test_responses_echo_keeps_raw_json_shape(server):
    body = {"model": "m", "input": "[[plain]]", "max_output_tokens": 50, "reasoning": {"effort": "none"},
            "text": {"format": {"type": "json_object"}}, "parallel_tool_calls": False, "user": "u1"}
    status, r = server.post_raw("/v1/responses", json.dumps(body).encode())
    assert status == 200
    assert r["text"] == {"format": {"type": "json_object"}}
    assert r["parallel_tool_calls"] is False and r["user"] == "u1"
