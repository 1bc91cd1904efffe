"""Fixtures: real `ds4-server` processes on 127.0.0.1 with random free ports.

The model is the embedded tiny default (random weights, gibberish text), so tests assert protocol
behaviour, and determinism through greedy (temperature 0) equality between runs. Tool calls are
driven by the server's test-only `--test-script` option: a request whose last message contains a
`when` marker gets the scripted `output` tokens instead of sampled ones; those tokens still run through
the model, so KV state, streaming, DSML parsing and the tool-id replay map are all exercised for real.
"""
import json
import os
import re
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("DS4_SERVER_BIN", ROOT / "target" / "release" / "ds4-server"))

D = "｜DSML｜"
TOOL_OUTPUT = (
    "I should call the weather tool.</think>\n\n"
    f"<{D}tool_calls>\n"
    f'<{D}invoke name="get_weather">\n'
    f'<{D}parameter name="city" string="true">Paris</{D}parameter>\n'
    f'<{D}parameter name="days" string="false">2</{D}parameter>\n'
    f"</{D}invoke>\n"
    f"</{D}tool_calls>"
)
ANSWER_OUTPUT = "The tool says sunny.</think>It is sunny in Paris."
# The rest of a forced call (tool_choice naming get_weather): the prompt already ends in its opening
# through the `invoke` header, so the model writes only the parameters and the closing tags.
FORCED_REST = (
    f'<{D}parameter name="city" string="true">Paris</{D}parameter>\n'
    f'<{D}parameter name="days" string="false">2</{D}parameter>\n'
    f"</{D}invoke>\n"
    f"</{D}tool_calls>"
)
SCRIPT = [
    {"when": "[[weather]]", "output": TOOL_OUTPUT},
    {"when": "sunny-result", "output": ANSWER_OUTPUT},
    {"when": "[[hello]]", "output": "Thinking about hello.</think>Hello there, friend."},
    {"when": "[[plain]]", "output": "Plain scripted answer."},
    # tool_choice naming get_weather / "required": the continuation of the forced opening.
    {"when": "[[forced-named]]", "output": FORCED_REST},
    {"when": "[[forced-any]]", "output": f'<{D}invoke name="get_weather">\n' + FORCED_REST},
    {"when": "[[forced-two]]", "output": f'<{D}invoke name="search">\n</{D}invoke>\n<{D}invoke name="get_weather">\n' + FORCED_REST},
    # A long answer (about 1000 tokens) that is still streaming when a test breaks something.
    {"when": "[[long]]", "output": "tick tock " * 500},
    # About 24000 tokens: still streaming long after any grace period (no EOS can end it early).
    {"when": "[[endless]]", "output": "tick tock " * 12000},
]

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, tmp: Path, args, name="server"):
        assert BIN.exists(), f"{BIN} missing: build with `cargo build --release -p ds4-server`"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        script = tmp / f"{name}-script.json"
        script.write_text(json.dumps(SCRIPT, ensure_ascii=False))
        self.trace = tmp / f"{name}-trace.log"
        self.log = open(tmp / f"{name}.log", "w")
        cmd = [str(BIN), "--host", "127.0.0.1", "--port", str(self.port), "--threads", "2",
               "--test-script", str(script), "--trace", str(self.trace)] + list(args)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ds4-server exited with {self.proc.returncode}: {(tmp / f'{name}.log').read_text()}")
            try:
                # Loaded: "ok", or (a coordinator without its workers yet) "route_incomplete" with 503.
                if self.get_json("/health")["status"] in ("ok", "route_incomplete"):
                    break
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)

    def get(self, path, headers=None):
        req = urllib.request.Request(self.base + path, headers=headers or {})
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read().decode()

    def get_json(self, path, headers=None):
        """The JSON body, also of an error answer (/health is 503 while loading or while a route is incomplete)."""
        try:
            return json.loads(self.get(path, headers))
        except urllib.error.HTTPError as e:
            return json.loads(e.read())

    def metrics(self, headers=None):
        out = {}
        for line in self.get("/metrics", headers).splitlines():
            if line.startswith("#") or not line.strip():
                continue
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
        return out

    def post_raw(self, path, body: bytes, headers=None):
        """POST without an SDK (malformed bodies); returns (status, parsed JSON body)."""
        h = {"content-type": "application/json"}
        h.update(headers or {})
        req = urllib.request.Request(self.base + path, data=body, headers=h, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()

    def alive(self):
        return self.proc.poll() is None


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("main"), ["--ctx", "4096", "--max-body-bytes", "1048576"], "main")
    yield s
    s.stop()


@pytest.fixture
def make_server(tmp_path):
    started = []

    def make(*args, name="extra"):
        s = Server(tmp_path, args, f"{name}{len(started)}")
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


@pytest.fixture
def oai(server):
    from openai import OpenAI
    return OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def claude(server):
    from anthropic import Anthropic
    return Anthropic(base_url=server.base, api_key="unused", max_retries=0, timeout=120)
