"""Bad input → a clear 4xx in the API's own error shape (never a panic, never 200 with nothing)."""
import json
import threading
import time
import urllib.error

import anthropic
import openai
import pytest

OPENAI_PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/responses"]


def assert_openai_error(status, body, want_status, param=None):
    assert status == want_status, body
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"]
    if param:
        assert err["param"] == param, err


def assert_anthropic_error(status, body, want_status, want_type="invalid_request_error"):
    assert status == want_status, body
    assert body["type"] == "error"
    assert body["error"]["type"] == want_type and body["error"]["message"]


@pytest.mark.parametrize("path", OPENAI_PATHS)
def test_malformed_json_openai(server, path):
    for body in [b"{not json", b"", b"[1,2]", b'{"messages": [}', "{\"prompt\": \"\xff\"}".encode("latin-1")]:
        st, b = server.post_raw(path, body)
        assert_openai_error(st, b, 400)


def test_malformed_json_anthropic(server):
    st, b = server.post_raw("/v1/messages", b"{nope")
    assert_anthropic_error(st, b, 400)


@pytest.mark.parametrize("field,value", [
    ("temperature", "hot"), ("max_tokens", "ten"), ("max_tokens", -3), ("max_tokens", 0), ("top_p", 7),
    ("stream", "yes"), ("stop", 5), ("messages", "hello"), ("seed", 1.5), ("top_k", -1), ("tools", {}),
    ("reasoning_effort", "extreme"), ("thinking", "on"),
])
def test_wrong_types_chat(server, field, value):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    body[field] = value
    st, b = server.post_raw("/v1/chat/completions", json.dumps(body).encode())
    assert_openai_error(st, b, 400)


def test_wrong_types_sdk(oai, claude):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], temperature="hot")
    assert e.value.status_code == 400 and "temperature" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model="m", messages=[{"role": "wizard", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model="m", prompt={"a": 1}, max_tokens=3)
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model="m", input=42)
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="m", max_tokens="lots", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 400 and e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="m", max_tokens=4, messages=[{"role": "system", "content": "x"}])


def test_empty_messages(oai, claude, server):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="m", messages=[])
    assert "messages" in str(e.value)
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="m", max_tokens=4, messages=[])
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model="m", input=[])
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model="m", prompt=[], max_tokens=3)
    st, b = server.post_raw("/v1/chat/completions", b"{}")
    assert_openai_error(st, b, 400, "messages")


def test_prompt_longer_than_context(server, oai, claude):
    long = "many words here " * 3000  # well over --ctx 4096 tokens, well under the body limit
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": long}], max_tokens=4)
    err = e.value.body
    assert err["code"] == "context_length_exceeded" and err["n_prompt_tokens"] > 4096
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model="m", prompt=long, max_tokens=4, stream=True)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model="m", input=long)
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": long}])
    assert "context" in e.value.body["error"]["message"]


def test_body_over_limit(server):
    big = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * (2 << 20)}]}).encode()
    st, b = server.post_raw("/v1/chat/completions", big)
    assert_openai_error(st, b, 413)
    st, b = server.post_raw("/v1/messages", big)
    assert_anthropic_error(st, b, 413, "request_too_large")


def test_unknown_endpoint_and_method(server):
    st, b = server.post_raw("/v1/nope", b"{}")
    assert_openai_error(st, b, 404)
    try:
        server.get("/v1/chat/completions")
        assert False, "GET on a POST endpoint must fail"
    except Exception as e:  # urllib HTTPError
        assert e.code == 405 and json.loads(e.read())["error"]["message"]
    with pytest.raises(Exception) as e:
        server.get("/v1/models/gpt-nope")
    assert e.value.code == 404


def test_previous_response_id_rejected(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model="m", input="hi", previous_response_id="resp_123")
    assert "previous_response_id" in str(e.value)


def test_api_key(make_server):
    s = make_server("--ctx", "1024", "--api-key", "sekret", name="auth")
    bad = openai.OpenAI(base_url=s.base + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    badc = anthropic.Anthropic(base_url=s.base, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        badc.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["error"]["type"] == "authentication_error"
    good = openai.OpenAI(base_url=s.base + "/v1", api_key="sekret", max_retries=0)
    assert good.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2).choices
    goodc = anthropic.Anthropic(base_url=s.base, api_key="sekret", max_retries=0)  # sends x-api-key
    assert goodc.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "x"}]).content is not None
    assert s.get_json("/health")["status"] == "ok"  # health stays open


def test_queue_full_gets_429(make_server):
    s = make_server("--ctx", "8192", "--max-queue", "1", name="queue")
    c = openai.OpenAI(base_url=s.base + "/v1", api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "long one"}]
    running = c.chat.completions.create(model="m", messages=msgs, max_tokens=6000, temperature=0,
                                        reasoning_effort="none", stream=True)
    next(iter(running))  # the worker is busy with it now
    queued_result = {}

    def queued():
        queued_result["r"] = c.chat.completions.create(model="m", messages=msgs, max_tokens=3, reasoning_effort="none")

    t = threading.Thread(target=queued)
    t.start()
    deadline = time.time() + 10
    while s.metrics()["ds4_queue_depth"] < 1 and time.time() < deadline:
        time.sleep(0.01)
    with pytest.raises(openai.APIStatusError) as e:
        c.chat.completions.create(model="m", messages=msgs, max_tokens=3)
    assert e.value.status_code == 429 and e.value.body["code"] == "queue_full"
    running.close()  # disconnect: the worker stops that generation and takes the queued one
    t.join(30)
    assert queued_result["r"].choices[0].finish_reason in ("length", "stop")
    m = s.metrics()
    assert m["ds4_queue_rejected_total"] == 1 and m["ds4_jobs_cancelled_total"] == 1


@pytest.mark.parametrize("args,want", [
    (["--backend", "tpu"], "unknown backend"),
    (["--mem-limit-gb=-1"], "--mem-limit-gb"),
    (["--mem-limit-gb", "0"], "--mem-limit-gb"),
    (["--backend", "cuda", "--role", "coordinator", "--layers", "0:2", "--listen", "127.0.0.1", "0"], "coordinator"),
])
def test_bad_backend_and_budget_flags_exit_2(args, want):
    import subprocess
    from conftest import BIN
    r = subprocess.run([str(BIN)] + args, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert want in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_budget_below_plan_refuses_to_start(tmp_path):
    # The memory plan is printed at start-up and a budget below it stops the server with the remedy.
    import subprocess
    from conftest import BIN
    r = subprocess.run([str(BIN), "--mem-limit-gb", "0.0001", "--port", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "memory:" in r.stderr and "--mem-limit-gb" in r.stderr, r.stderr


def test_cuda_backend_without_cuda_build_is_a_clear_error():
    import subprocess
    from conftest import BIN
    r = subprocess.run([str(BIN), "--backend", "cuda", "--port", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "CUDA" in r.stderr, r.stderr


def test_cuda_backend_accepts_the_disk_kv_cache(tmp_path):
    # The disk KV cache works on every backend: the flags pass validation; a build without CUDA then
    # stops at the backend with the usual clear error (exit 1), not at the flag combination (exit 2).
    import subprocess
    from conftest import BIN
    r = subprocess.run([str(BIN), "--backend", "cuda", "--kv-disk-dir", str(tmp_path), "--port", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "CUDA" in r.stderr and "not available" not in r.stderr, r.stderr


def test_n_other_than_one_is_rejected(server, oai):
    # Before, chat ignored `n` and answered one choice to a request for two (and accepted n=-1).
    for n in (2, 0):
        with pytest.raises(openai.BadRequestError) as e:
            oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2, n=n)
        assert e.value.body["param"] == "n"
    st, b = server.post_raw("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}], "n": -1}).encode())
    assert_openai_error(st, b, 400, "n")
    r = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2, n=1)
    assert len(r.choices) == 1


def test_model_path_that_is_not_utf8_is_a_json_error(server):
    # `/v1/models/%ff` used to get axum's plain-text 400 ("Invalid URL: ..."), which the SDKs cannot parse.
    with pytest.raises(urllib.error.HTTPError) as e:
        server.get("/v1/models/%ff")
    assert e.value.code == 400
    assert e.value.headers["content-type"] == "application/json"
    err = json.loads(e.value.read())["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
