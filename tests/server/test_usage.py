"""Usage fields in each API's own semantics, OPTIONS without --cors, and the listed model id."""
import urllib.request


def prompt_delta(server, before):
    return server.metrics()["ds4_prompt_tokens_total"] - before


def test_options_is_204_without_cors(server):
    for path in ["/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/models", "/health"]:
        req = urllib.request.Request(server.base + path, method="OPTIONS")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 204, path
            assert "POST" in r.headers["allow"]


def test_models_lists_the_loaded_model_only(server, oai):
    # The embedded model has a Flash-like shape (not Pro's 61 layers / 384 experts).
    assert [m.id for m in oai.models.list().data] == ["deepseek-v4-flash"]
    assert server.get_json("/health")["model"] == "deepseek-v4-flash"
    # Both ids still resolve (aliases of the loaded model).
    assert oai.models.retrieve("deepseek-v4-pro").id == "deepseek-v4-pro"


def test_responses_reasoning_tokens(oai):
    full = oai.responses.create(model="m", input="[[hello]] usage", max_output_tokens=64)
    u = full.usage
    assert full.output_text == "Hello there, friend."
    r = u.output_tokens_details.reasoning_tokens
    assert 0 < r < u.output_tokens
    # The strict SDK fields are present.
    assert u.input_tokens_details.cached_tokens >= 0
    assert u.input_tokens_details.cache_write_tokens == 0
    assert u.total_tokens == u.input_tokens + u.output_tokens
    # Cut exactly after the reasoning (its last token is </think>): no answer text yet.
    cut = oai.responses.create(model="m", input="[[hello]] usage", max_output_tokens=r)
    assert cut.status == "incomplete" and cut.output_text == ""
    assert [o.type for o in cut.output] == ["reasoning"]
    assert cut.usage.output_tokens == r and cut.usage.output_tokens_details.reasoning_tokens == r
    # Every token reasoning (cut inside it): all of them count.
    short = oai.responses.create(model="m", input="[[hello]] usage", max_output_tokens=3)
    assert short.usage.output_tokens == 3 and short.usage.output_tokens_details.reasoning_tokens == 3
    # No thinking: no reasoning tokens.
    plain = oai.responses.create(model="m", input="[[plain]]", max_output_tokens=32, reasoning={"effort": "none"})
    assert plain.output_text == "Plain scripted answer."
    assert plain.usage.output_tokens_details.reasoning_tokens == 0


def test_chat_usage_details(oai):
    r = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "[[hello]] chat usage"}], max_tokens=64)
    u = r.usage
    assert 0 < u.completion_tokens_details.reasoning_tokens < u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens >= 0
    assert u.prompt_tokens_details.cache_write_tokens == 0


def test_responses_cached_tokens_on_a_follow_up(oai):
    first = oai.responses.create(model="m", input="[[plain]] follow-up base", max_output_tokens=32, reasoning={"effort": "none"})
    follow = oai.responses.create(model="m", max_output_tokens=8, reasoning={"effort": "none"}, input=[
        {"role": "user", "content": "[[plain]] follow-up base"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "and then?"},
    ])
    d = follow.usage.input_tokens_details
    assert 0 < d.cached_tokens < follow.usage.input_tokens


def test_messages_usage_excludes_cache_reads(server, claude):
    conv = [{"role": "user", "content": "[[plain]] anthropic usage"}]
    before = server.metrics()["ds4_prompt_tokens_total"]
    a = claude.messages.create(model="m", max_tokens=32, thinking={"type": "disabled"}, messages=conv)
    total_a = prompt_delta(server, before)
    ua = a.usage
    assert ua.input_tokens + ua.cache_read_input_tokens + ua.cache_creation_input_tokens == total_a
    conv2 = conv + [{"role": "assistant", "content": a.content[-1].text}, {"role": "user", "content": "more"}]
    before = server.metrics()["ds4_prompt_tokens_total"]
    b = claude.messages.create(model="m", max_tokens=4, thinking={"type": "disabled"}, messages=conv2)
    total_b = prompt_delta(server, before)
    ub = b.usage
    # The follow-up reuses the first turn's KV: those tokens are cache reads, not input.
    assert ub.cache_read_input_tokens > 0
    assert ub.input_tokens + ub.cache_read_input_tokens + ub.cache_creation_input_tokens == total_b
    assert ub.input_tokens < total_b


def test_one_log_line_per_request_and_quiet(make_server):
    import re
    loud = make_server("--ctx", "2048", name="loud")
    quiet = make_server("--ctx", "2048", "--quiet", name="quiet")
    for s in (loud, quiet):
        import openai
        c = openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=60)
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "[[plain]] log"}], max_tokens=16,
                                  reasoning_effort="none")
    loud.stop(); quiet.stop()
    text = open(loud.log.name).read()
    lines = [l for l in text.splitlines() if l.startswith("ds4-server: req ")]
    assert len(lines) == 1, text
    assert re.match(r"ds4-server: req \d+ /v1/chat/completions prompt=\d+ cached=0 gen=\d+ prefill=[\d.]+ t/s "
                    r"decode=[\d.]+ t/s time=[\d.]+s finish=stop$", lines[0]), lines[0]
    assert "ds4-server: req " not in open(quiet.log.name).read()
