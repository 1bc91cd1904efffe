"""Weights become resident once, at load: /metrics shows map/bind operations only in the load phase,
and none during prefill or decode, however many requests are served (seed 001)."""


def test_no_residency_operations_after_load(make_server):
    s = make_server(name="residency")
    from openai import OpenAI

    client = OpenAI(base_url=s.base + "/v1", api_key="x")
    for i in range(3):
        client.chat.completions.create(
            model="deepseek-v4-flash", messages=[{"role": "user", "content": f"count {i}"}], max_tokens=16, temperature=0
        )
    m = s.metrics()
    key = 'ds4_weight_residency_ops_total{{phase="{}",op="{}"}}'
    assert m[key.format("load", "map")] >= 1
    assert m[key.format("load", "bind")] > 0
    for phase in ("prefill", "decode"):
        for op in ("map", "bind", "upload"):
            assert m[key.format(phase, op)] == 0, (phase, op)
