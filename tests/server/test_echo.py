"""`/v1/completions` with `echo: true`: the text starts with the prompt (a token-id prompt detokenized),
streamed (the prompt is the first chunk) and not; `max_tokens: 0` returns just the prompt; prompt
logprobs are not computed, so `echo` with `logprobs` is a 400 naming the combination."""
import json

import openai
import pytest

PROMPT = "Once upon a time"


def test_echo_prepends_the_prompt(oai):
    kw = dict(model="m", prompt=PROMPT, max_tokens=6, temperature=0)
    plain = oai.completions.create(**kw).choices[0].text
    r = oai.completions.create(echo=True, **kw)
    assert r.choices[0].text == PROMPT + plain
    assert r.usage.completion_tokens == 6
    chunks = list(oai.completions.create(echo=True, stream=True, **kw))
    assert chunks[0].choices[0].text == PROMPT
    assert "".join(c.choices[0].text for c in chunks if c.choices) == PROMPT + plain


def test_echo_of_token_ids_is_the_detokenized_prompt(oai):
    ids = [300, 301, 302, 303]
    only = oai.completions.create(model="m", prompt=ids, max_tokens=0, echo=True)
    text = only.choices[0].text
    assert text and only.usage.prompt_tokens == len(ids) and only.usage.completion_tokens == 0
    r = oai.completions.create(model="m", prompt=ids, max_tokens=4, temperature=0, echo=True)
    plain = oai.completions.create(model="m", prompt=ids, max_tokens=4, temperature=0)
    assert r.choices[0].text == text + plain.choices[0].text


def test_echo_with_zero_max_tokens_returns_the_prompt(oai):
    r = oai.completions.create(model="m", prompt=PROMPT, max_tokens=0, echo=True)
    assert r.choices[0].text == PROMPT and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens > 0
    chunks = list(oai.completions.create(model="m", prompt=PROMPT, max_tokens=0, echo=True, stream=True,
                                         stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == PROMPT
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == 0
    # Without echo, 0 is still refused.
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model="m", prompt=PROMPT, max_tokens=0)


def test_echo_with_logprobs_is_a_400(server):
    st, body = server.post_raw("/v1/completions", json.dumps({"prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 2}).encode())
    assert st == 400 and body["error"]["param"] == "echo"
    assert "echo" in body["error"]["message"] and "logprobs" in body["error"]["message"]


@pytest.mark.parametrize("extra,param", [({"suffix": " The end."}, "suffix"), ({"suffix": 7}, "suffix"),
                                         ({"best_of": 2}, "best_of"), ({"best_of": 0}, "best_of")])
def test_suffix_and_best_of_are_refused_not_ignored(server, extra, param):
    # Audit: `suffix` and `best_of` > 1 were silently ignored (a reply as if neither had been sent).
    body = {"prompt": PROMPT, "max_tokens": 2, "echo": True, **extra}
    st, r = server.post_raw("/v1/completions", json.dumps(body).encode())
    assert st == 400 and r["error"]["param"] == param and param in r["error"]["message"]
    # Their no-op values are fine.
    st, r = server.post_raw("/v1/completions", json.dumps({"prompt": PROMPT, "max_tokens": 2, "suffix": None, "best_of": 1}).encode())
    assert st == 200 and r["choices"][0]["finish_reason"] == "length"
