#!/usr/bin/env python3
"""Reference fixtures for the DwarfStar forward pass, from transformers' DeepseekV4ForCausalLM.

Independent reference: transformers==5.17.0 (`DeepseekV4ForCausalLM`), torch==2.15.0, float32, CPU.
Our engine is never used to produce an expected value.

Usage (venv at .venv-ref, see HF_MAPPING.md):
    .venv-ref/bin/python tools/reference/forward_fixtures.py tiny-f32
    .venv-ref/bin/python tools/reference/forward_fixtures.py tiny-steer
    .venv-ref/bin/python tools/reference/forward_fixtures.py tiny-imatrix
    .venv-ref/bin/python tools/reference/forward_fixtures.py tiny-q --convert-bin target/debug/ds4-gguf --mixes q4,q2

Deterministic: fixed seeds, one torch thread; re-running re-creates the fixtures byte-identically with the
same torch build (PyPI's torch 2.15.0 wheel, instead of the CPU index's, gives logits ~2e-6 of max|logit| apart).

Output of `tiny-steer`: crates/model/tests/fixtures/hf_tiny_steer/ (the tiny-f32 model and tokens, QAT off, with two
directional-steering slots inserted by hooks: install_steering; the seed gives no router/indexer near-tie).

Output of `tiny-f32`: crates/model/tests/fixtures/hf_tiny/ (QAT off, as transformers ships) and
crates/model/tests/fixtures/hf_tiny_qat/ (the same model and tokens with the shipped FP8 KV / FP4 indexer
rounding inserted by hooks, see install_qat; no config/checkpoint there: it uses hf_tiny's):
    config.json          official-style config (compress_ratios, num_hash_layers, rope_scaling, qk_rope_head_dim)
    model.safetensors    every parameter and persistent buffer under its IN-MEMORY name
                         (model.named_parameters() + persistent buffers; NOT save_pretrained names)
    reference.json       index: tokens, positions, file names, dtypes, shapes, margins (see "format" in it)
    logits.bin           f32 LE [seq_len, vocab]           logits at every position
    hc_states.bin        f32 LE [n_layers+1, n_state_pos, hc_mult, hidden]
                         index 0 = HC state entering layer 0 (embedding broadcast to the streams),
                         index l+1 = HC state after layer l (after its FFN HC-post), at `state_positions`
    router_margin.bin    f32 LE [n_layers, seq_len]  top-k margin of the router at every position:
                         sorted(sqrtsoftplus(logit)+bias)[k-1] - [k]; +inf on hash-routed layers
    indexer_margin.bin   f32 LE [n_layers, seq_len]  top-k margin of the indexer among the causally visible
                         compressed rows: sorted(score)[topk-1] - [topk] when visible > index_topk, else +inf;
                         +inf on layers without an indexer
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys

import numpy as np
import torch

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIX_DIR = os.path.join(REPO, "crates", "model", "tests", "fixtures")

# ---------------------------------------------------------------------------------------------
# configs


def tiny_f32_config():
    # Layer map: il0 ratio 0 (hash-routed), il1 ratio 4 (hash-routed), il2 ratio 128 (biased top-k),
    # il3 ratio 4 (biased top-k). Real ratios 4 and 128; YaRN explicit (HF otherwise uses plain RoPE);
    # qk_rope_head_dim = 64 as in Flash so the YaRN ramp (low 15, high 25) is the real one.
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": 256,
        "hidden_size": 64,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 128,
        "qk_rope_head_dim": 64,
        "q_lora_rank": 16,
        "o_groups": 2,
        "o_lora_rank": 16,
        "n_routed_experts": 6,
        "num_experts_per_tok": 3,
        "n_shared_experts": 1,
        "scoring_func": "sqrtsoftplus",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0,
        "num_hash_layers": 2,
        "compress_ratios": [0, 4, 128, 4],
        "compress_rope_theta": 160000.0,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 16,
            "original_max_position_embeddings": 65536,
            "beta_fast": 32,
            "beta_slow": 1,
        },
        "max_position_embeddings": 1048576,
        "sliding_window": 128,
        "index_n_heads": 16,
        "index_head_dim": 128,
        "index_topk": 16,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "num_nextn_predict_layers": 0,
        "torch_dtype": "float32",
    }


def tiny_q_config():
    # hidden and moe_intermediate are multiples of 256 (Q4_K / Q2_K / IQ2_XXS blocks), every other
    # Q8_0 row a multiple of 32; one CSA layer (compressor + indexer), biased top-k routing. Small so
    # that the committed GGUFs stay ~1.5 MB each.
    c = tiny_f32_config()
    c.update({
        "vocab_size": 128,
        "hidden_size": 256,
        "moe_intermediate_size": 256,
        "num_hidden_layers": 1,
        "compress_ratios": [4],
        "num_hash_layers": 0,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "num_attention_heads": 2,
        "o_groups": 1,
        "o_lora_rank": 32,
        "q_lora_rank": 32,
        "index_n_heads": 16,
        "index_head_dim": 128,
        "index_topk": 8,
    })
    return c


SEQ_LEN_F32 = 640   # 5 ratio-128 windows, 160 ratio-4 windows, the real window 128 wraps 5 times
SEQ_LEN_Q = 160


# ---------------------------------------------------------------------------------------------
# model construction


def build_model(cfg_dict, seed):
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    torch.manual_seed(seed)
    kw = {k: v for k, v in cfg_dict.items() if k not in ("architectures", "model_type", "torch_dtype")}
    cfg = DeepseekV4Config(**kw)
    cfg._attn_implementation = "eager"
    model = DeepseekV4ForCausalLM(cfg).float().eval()
    g = torch.Generator().manual_seed(seed + 1)

    def rn(shape, std):
        return torch.randn(shape, generator=g, dtype=torch.float32) * std

    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda t: t[0]):
            shp = tuple(p.shape)
            if name.endswith("embed_tokens.weight"):
                p.copy_(rn(shp, 1.0))
            elif name.endswith("experts.gate_up_proj"):
                # std 4/sqrt(in): some gate/up pre-activations exceed the swiglu clamp (10)
                p.copy_(rn(shp, 4.0 / math.sqrt(shp[-1])))
            elif name.endswith("experts.down_proj"):
                p.copy_(rn(shp, 1.0 / math.sqrt(shp[-1])))
            elif name.endswith("shared_experts.gate_proj.weight") or name.endswith("shared_experts.up_proj.weight"):
                p.copy_(rn(shp, 4.0 / math.sqrt(shp[-1])))
            elif name.endswith("norm.weight"):
                # every RMSNorm weight perturbed away from 1
                p.copy_(1.0 + rn(shp, 0.2))
            elif name.endswith("self_attn.sinks"):
                p.copy_(rn(shp, 1.0))
            elif name.endswith("_hc.fn") or name.endswith("hc_head.hc_fn"):
                p.copy_(rn(shp, 0.1))
            elif name.endswith("_hc.base") or name.endswith("hc_head.hc_base"):
                p.copy_(rn(shp, 0.5))
            elif name.endswith("_hc.scale") or name.endswith("hc_head.hc_scale"):
                p.copy_(1.0 + rn(shp, 0.3))
            elif name.endswith("position_bias"):
                p.copy_(rn(shp, 0.5))
            elif p.dim() == 2:
                # plain linear weights [out, in]
                p.copy_(rn(shp, 1.0 / math.sqrt(shp[-1])))
            else:
                raise RuntimeError(f"unhandled parameter {name} {shp}")
        n_exp = cfg.n_routed_experts
        k = cfg.num_experts_per_tok
        for name, b in sorted(model.named_buffers(), key=lambda t: t[0]):
            if name.endswith("e_score_correction_bias"):
                b.copy_(rn(tuple(b.shape), 0.1))
            elif name.endswith("tid2eid"):
                rows = [torch.randperm(n_exp, generator=g)[:k] for _ in range(b.shape[0])]
                b.copy_(torch.stack(rows).to(torch.long))
    # sanity: lm_head is not tied to the embedding
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    return model, cfg


def in_memory_state(model):
    """Parameters + persistent buffers under their in-memory names (what the converter reads)."""
    sd = model.state_dict()
    return {k: v.detach().contiguous().clone() for k, v in sorted(sd.items())}


# ---------------------------------------------------------------------------------------------
# running with probes


def run_with_probes(model, cfg, tokens, qat=False, steering=None):
    """Full-sequence float32 forward (use_cache=False). Returns logits [S, V], hc states list
    (n_layers+1) of [S, hc, hidden], router margins [L, S], indexer margins [L, S].
    qat: with the shipped FP8 KV / FP4 indexer rounding (install_qat).
    steering: directional steering slots (install_steering)."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M

    L = cfg.num_hidden_layers
    S = tokens.shape[1]
    states = [None] * (L + 1)
    router_margin = np.full((L, S), np.inf, dtype=np.float32)
    indexer_margin = np.full((L, S), np.inf, dtype=np.float32)
    hooks = []

    def layer_pre(idx):
        def f(mod, args, kwargs):
            if idx == 0:
                hs = args[0] if args else kwargs["hidden_states"]
                states[0] = hs[0].detach().clone()
        return f

    def layer_post(idx):
        def f(mod, args, kwargs, out):
            o = out[0] if isinstance(out, tuple) else out
            states[idx + 1] = o[0].detach().clone()
        return f

    def router_hook(idx):
        def f(mod, args, out):
            if isinstance(mod, M.DeepseekV4HashRouter):
                return
            hs = args[0]
            flat = hs.reshape(-1, mod.hidden_dim)
            scores = mod.score_fn(torch.nn.functional.linear(flat, mod.weight))
            biased = (scores + mod.e_score_correction_bias).double()
            srt = torch.sort(biased, dim=-1, descending=True).values
            k = mod.top_k
            if srt.shape[-1] > k:
                router_margin[idx] = (srt[:, k - 1] - srt[:, k]).float().numpy()
        return f

    def scorer_hook(idx, index_topk, ratio):
        def f(mod, args, out):
            sc = out[0].double()  # [S, T]
            T = sc.shape[-1]
            for t in range(S):
                vis = min((t + 1) // ratio, T)
                if vis > index_topk:
                    srt = torch.sort(sc[t, :vis], descending=True).values
                    indexer_margin[idx, t] = float(srt[index_topk - 1] - srt[index_topk])
        return f

    for i, layer in enumerate(model.model.layers):
        hooks.append(layer.register_forward_pre_hook(layer_pre(i), with_kwargs=True))
        hooks.append(layer.register_forward_hook(layer_post(i), with_kwargs=True))
        hooks.append(layer.mlp.gate.register_forward_hook(router_hook(i)))
        comp = layer.self_attn.compressor
        if comp is not None and hasattr(comp, "indexer"):
            hooks.append(comp.indexer.scorer.register_forward_hook(
                scorer_hook(i, cfg.index_topk, comp.indexer.compress_rate)))
    if qat:
        hooks += install_qat(model, cfg)
    if steering:
        hooks += install_steering(model, steering)
    with torch.no_grad():
        out = model(input_ids=tokens, use_cache=False)
    for h in hooks:
        h.remove()
    logits = out.logits[0].detach().float()
    return logits, states, router_margin, indexer_margin



# ---------------------------------------------------------------------------------------------
# QAT: the official inference's FP8 KV and FP4 indexer rounding, inserted into transformers with hooks
#
# transformers omits these steps (spec §6 items 1-2). They are written here against torch's own float8
# type and the spec, independently of the engine (tools/reference/qat_fixtures.py tests the same formulas
# alone):
#   * raw KV row and compressed KV rows: FP8 E4M3 (torch.float8_e4m3fn cast, round to nearest even) in
#     64-blocks with a power-of-two (ue8m0) scale on the nope part [0, head_dim - rope_dim). RoPE only
#     rotates the trailing rope slice, so rounding the kv_norm output's nope part is the same as rounding
#     after RoPE; a forward hook on each kv_norm (attention and compressor) does it.
#   * indexer keys and queries (after RoPE): 128-point Walsh-Hadamard (Sylvester order, / sqrt(128)) then
#     FP4 E2M1 in 32-blocks with a power-of-two scale; a forward pre-hook on the indexer's scorer rounds
#     both of its inputs.
#   * indexer top-k: FP4 makes exact score ties common, so the reference picks with an explicit rule:
#     higher score first, and among equal scores the LOWER compressed-row index (torch.topk's choice among
#     ties is unspecified). A forward hook on the indexer recomputes its selection from the scorer output
#     with that rule, with transformers' causal mask and -1 sentinel.


def qat_fp8_blocks(v, block=64):
    shp = v.shape
    x = v.reshape(-1, block).float()
    amax = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-4)
    s = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    q = (x / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * s
    return q.reshape(shp).to(v.dtype)


def qat_e2m1(a):
    """Round |v| <= 6 to the E2M1 grid {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to the even code (torch.round)."""
    mag = a.abs()
    step = torch.where(mag < 2.0, torch.full_like(mag, 0.5), torch.where(mag < 4.0, torch.ones_like(mag), torch.full_like(mag, 2.0)))
    return torch.sign(a) * torch.round(mag / step) * step


def qat_fp4_blocks(v, block=32):
    shp = v.shape
    x = v.reshape(-1, block).float()
    amax = x.abs().amax(dim=-1, keepdim=True).clamp_min(6.0 * 2.0 ** -126)
    s = torch.exp2(torch.ceil(torch.log2(amax / 6.0)))
    q = qat_e2m1((x / s).clamp(-6.0, 6.0)) * s
    return q.reshape(shp).to(v.dtype)


def sylvester(n):
    h = torch.ones((1, 1), dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    return h


def qat_indexer(v):
    n = v.shape[-1]
    y = (v.double() @ sylvester(n).T) / math.sqrt(n)
    return qat_fp4_blocks(y.float())


def install_qat(model, cfg, selections=None):
    """Hooks that make transformers run the shipped (QAT-on) numerics. Returns the hook handles.
    `selections[layer]` receives the indexer's [S, k] selection (lowest index wins ties)."""
    rope = cfg.qk_rope_head_dim
    hooks = []

    def kv_fp8(mod, args, out):
        nope = out.shape[-1] - rope
        return torch.cat([qat_fp8_blocks(out[..., :nope]), out[..., nope:]], dim=-1)

    def scorer_pre(mod, args):
        q, keys, hs = args
        return (qat_indexer(q), qat_indexer(keys), hs)

    def indexer_post(idx, scorer, ratio, topk):
        def f(mod, args, kwargs, out):
            sc = scorer.last_scores[0].double()  # [S, T]
            S_, T = sc.shape
            keyed = []
            picks = torch.full((S_, min(topk, T)), -1, dtype=torch.long)
            for t in range(S_):
                vis = min((t + 1) // ratio, T)
                order = sorted(range(vis), key=lambda j: (-float(sc[t, j]), j))[: min(topk, T)]
                for c, j in enumerate(order):
                    picks[t, c] = j
            if selections is not None:
                selections[idx] = picks
            return picks.unsqueeze(0)
        return f

    def keep_scores(mod, args, out):
        mod.last_scores = out.detach()

    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        hooks.append(attn.kv_norm.register_forward_hook(kv_fp8))
        comp = attn.compressor
        if comp is None:
            continue
        hooks.append(comp.kv_norm.register_forward_hook(kv_fp8))
        if hasattr(comp, "indexer"):
            ix = comp.indexer
            hooks.append(ix.scorer.register_forward_pre_hook(scorer_pre))
            hooks.append(ix.scorer.register_forward_hook(keep_scores))
            hooks.append(ix.register_forward_hook(indexer_post(i, ix.scorer, ix.compress_rate, ix.index_topk), with_kwargs=True))
    return hooks


# ---------------------------------------------------------------------------------------------
# Directional steering (ds4's --dir-steering-*), inserted with hooks: the output y of every layer's
# attention (self_attn) and FFN (mlp) sub-layer, before it is mixed into the HC streams, becomes
# y - s * v * (v . y), slot after slot, with v the slot's direction for that layer and s its attn / ffn scale.


def steering_slots(cfg, seed):
    """Two slots of random unit directions per layer (float32 [L, hidden]) with their scales."""
    g = torch.Generator().manual_seed(seed)
    slots = []
    for name, ffn, attn in (("dir_a.f32", 2.0, -1.0), ("dir_b.f32", -0.5, 0.5)):
        d = torch.randn((cfg.num_hidden_layers, cfg.hidden_size), generator=g, dtype=torch.float32)
        d = d / d.norm(dim=-1, keepdim=True)
        slots.append({"file": name, "ffn": ffn, "attn": attn, "dirs": d})
    return slots


def install_steering(model, slots):
    def edit(idx, site):
        def f(mod, args, out):
            y = out[0] if isinstance(out, tuple) else out
            for sl in slots:
                sc = sl[site]
                if sc != 0.0:
                    v = sl["dirs"][idx].to(y.dtype)
                    y = y - sc * (y * v).sum(-1, keepdim=True) * v
            return (y,) + tuple(out[1:]) if isinstance(out, tuple) else y
        return f

    hooks = []
    for i, layer in enumerate(model.model.layers):
        hooks.append(layer.self_attn.register_forward_hook(edit(i, "attn")))
        hooks.append(layer.mlp.register_forward_hook(edit(i, "ffn")))
    return hooks


# ---------------------------------------------------------------------------------------------
# writing


def f32_bytes(arr):
    a = np.ascontiguousarray(np.asarray(arr, dtype="<f4"))
    return a.tobytes()


def write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True, allow_nan=False)
        f.write("\n")


def save_safetensors(path, tensors):
    from safetensors.torch import save_file
    save_file(tensors, path, metadata={"format": "pt"})


def finite_or_none(x):
    return None if not math.isfinite(x) else float(x)


def pick_logit_positions(S, cfg):
    W = cfg.sliding_window
    pos = {0, 1, 2, 3, 4, W - 2, W - 1, W, W + 1, 2 * W - 1, 2 * W}
    for e in range(127, S, 128):
        pos |= {e, e + 1}
    pos |= {67, 68, 200, 301, 450, S - 2, S - 1}
    pos = sorted(p for p in pos if 0 <= p < S)
    return pos


def pick_state_positions(S):
    """Where the per-layer HC states are stored: every 32nd position, the window and compressor edges."""
    pos = set(range(0, S, 32)) | {31, 127, 128, 129, 255, 256, 383, 384, 511, 512, S - 1}
    return sorted(p for p in pos if 0 <= p < S)


def tiny_f32_model_and_tokens():
    """The tiny-f32 model (fixed seed) and its reference tokens, on one deterministic torch thread."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cfg_dict = tiny_f32_config()
    model, cfg = build_model(cfg_dict, seed=20260501)
    g = torch.Generator().manual_seed(777)
    tokens = torch.randint(0, cfg.vocab_size, (1, SEQ_LEN_F32), generator=g, dtype=torch.long)
    return model, cfg, cfg_dict, tokens


def cmd_tiny_f32(args):
    model, cfg, cfg_dict, tokens = tiny_f32_model_and_tokens()
    write_tiny_set(model, cfg, cfg_dict, tokens, os.path.join(FIX_DIR, "hf_tiny"), qat=False)
    write_tiny_set(model, cfg, cfg_dict, tokens, os.path.join(FIX_DIR, "hf_tiny_qat"), qat=True)


def cmd_tiny_imatrix(args):
    """ds4's routed-expert imatrix statistics of the tiny-f32 model over its reference tokens (QAT off):
    crates/model/tests/fixtures/hf_tiny_imatrix/. Per layer and expert, over the tokens routed to it:
    the mean square of each column of the experts' input (the FFN's normalised input, what gate and up
    read) and of the down projection's input, taken as ds4 takes it: the SwiGLU output times the
    token's route weight (transformers applies the weight after down; the product is the same)."""
    model, cfg, cfg_dict, tokens = tiny_f32_model_and_tokens()
    L, E, H, FF = cfg.num_hidden_layers, cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
    gate_up = np.zeros((L, E, H), dtype=np.float64)
    down = np.zeros((L, E, FF), dtype=np.float64)
    counts = np.zeros((L, E), dtype=np.int64)

    def capture(il):
        def f(mod, args):
            x, idx, w = args[0].double(), args[1], args[2].double()
            for t in range(x.shape[0]):
                for s in range(idx.shape[1]):
                    e = int(idx[t, s])
                    gu = torch.nn.functional.linear(x[t], mod.gate_up_proj[e].double())
                    mid = mod._apply_gate(gu) * w[t, s]
                    gate_up[il, e] += (x[t] ** 2).numpy()
                    down[il, e] += (mid ** 2).numpy()
                    counts[il, e] += 1
        return f

    hooks = [layer.mlp.experts.register_forward_pre_hook(capture(i)) for i, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        model(input_ids=tokens, use_cache=False)
    for h in hooks:
        h.remove()
    c = np.maximum(counts, 1)[..., None]
    gu_mean = np.where(counts[..., None] > 0, gate_up / c, 1.0)
    dn_mean = np.where(counts[..., None] > 0, down / c, 1.0)
    out_dir = os.path.join(FIX_DIR, "hf_tiny_imatrix")
    os.makedirs(out_dir, exist_ok=True)
    write_bytes(os.path.join(out_dir, "gate_up.bin"), f32_bytes(gu_mean))
    write_bytes(os.path.join(out_dir, "down.bin"), f32_bytes(dn_mean))
    write_json(os.path.join(out_dir, "reference.json"), {
        "generator": "tools/reference/forward_fixtures.py tiny-imatrix",
        "reference": "transformers 5.17.0 DeepseekV4ForCausalLM (the hf_tiny checkpoint and tokens, QAT off), a forward "
                     "pre-hook on every layer's mlp.experts; sums in float64",
        "format": "gate_up.bin f32 LE [n_layers, n_experts, hidden]: mean over routed tokens of x^2 (x: the experts' "
                  "input); down.bin f32 LE [n_layers, n_experts, moe_intermediate]: mean of (swiglu(x) * route weight)^2; "
                  "1.0 for an expert no token reached (as ds4 writes it)",
        "counts": counts.tolist(),
        "seq_len": int(tokens.shape[1]),
    })
    print(f"tiny-imatrix: wrote {out_dir}; routes per layer {counts.sum(axis=1).tolist()}, unreached experts {int((counts == 0).sum())}")


def cmd_tiny_steer(args):
    """The tiny-f32 model and tokens with two steering slots (QAT off): crates/model/tests/fixtures/hf_tiny_steer/."""
    model, cfg, cfg_dict, tokens = tiny_f32_model_and_tokens()
    write_tiny_set(model, cfg, cfg_dict, tokens, os.path.join(FIX_DIR, "hf_tiny_steer"), qat=False,
                   steering=steering_slots(cfg, seed=4244))


def write_tiny_set(model, cfg, cfg_dict, tokens, out_dir, qat, steering=None):
    os.makedirs(out_dir, exist_ok=True)
    S = tokens.shape[1]
    logits, states, rmargin, imargin = run_with_probes(model, cfg, tokens, qat=qat, steering=steering)
    L = cfg.num_hidden_layers
    logit_pos = list(range(S))
    state_pos = pick_state_positions(S)

    if not qat and not steering:
        write_json(os.path.join(out_dir, "config.json"), cfg_dict)
        save_safetensors(os.path.join(out_dir, "model.safetensors"), in_memory_state(model))
    if steering:
        for sl in steering:
            write_bytes(os.path.join(out_dir, sl["file"]), f32_bytes(sl["dirs"].numpy()))
        write_json(os.path.join(out_dir, "steering.json"),
                   {"slots": [{"file": sl["file"], "ffn": sl["ffn"], "attn": sl["attn"]} for sl in steering],
                    "meaning": "per layer l and sub-layer output y (attention, FFN), slot after slot: "
                               "y -= scale * v[l] * dot(v[l], y); v: float32 LE [n_layers, hidden]"})
    write_bytes(os.path.join(out_dir, "logits.bin"), f32_bytes(logits[logit_pos].numpy()))
    hc = np.stack([states[l][state_pos].numpy() for l in range(L + 1)])  # [L+1, P, hc, hidden]
    write_bytes(os.path.join(out_dir, "hc_states.bin"), f32_bytes(hc))
    write_bytes(os.path.join(out_dir, "router_margin.bin"), f32_bytes(rmargin))
    write_bytes(os.path.join(out_dir, "indexer_margin.bin"), f32_bytes(imargin))

    index = {
        "generator": "tools/reference/forward_fixtures.py tiny-f32",
        "reference": "transformers 5.17.0 DeepseekV4ForCausalLM, torch 2.15.0, float32, CPU, eager, use_cache=False, "
                     "one forward over the whole sequence (prefill)"
                     + ("; WITH the shipped QAT numerics inserted by hooks (install_qat in the generator): FP8 E4M3 "
                        "64-block ue8m0 on the nope part of raw and compressed KV, Hadamard-128 + FP4 E2M1 32-block "
                        "on indexer queries and keys, indexer top-k ties to the lower row index" if qat else
                        "; QAT simulation OFF (transformers omits it)"),
        "qat": qat,
        "checkpoint": "../hf_tiny (config.json, model.safetensors)" if qat or steering else "this directory",
        "steering": "steering.json (directional steering inserted by hooks: install_steering)" if steering else None,
        "format": "all .bin files are raw little-endian float32, C order, shapes below; +inf = not applicable",
        "seq_len": S,
        "tokens": tokens[0].tolist(),
        "vocab_size": cfg.vocab_size,
        "n_layers": L,
        "hc_mult": cfg.hc_mult,
        "hidden_size": cfg.hidden_size,
        "sliding_window": cfg.sliding_window,
        "layer_compress_ratios": cfg_dict["compress_ratios"],
        "layer_hash_routed": [t == "hash_moe" for t in cfg.mlp_layer_types],
        "logit_positions": logit_pos,
        "state_positions": state_pos,
        "files": {
            "logits": {"file": "logits.bin", "shape": [len(logit_pos), cfg.vocab_size],
                       "meaning": "logits[i] = model logits at position logit_positions[i] (every position)"},
            "hc_states": {"file": "hc_states.bin", "shape": [L + 1, len(state_pos), cfg.hc_mult, cfg.hidden_size],
                          "meaning": "[0] = HC state entering layer 0 (embedding copied to every stream); "
                                     "[l+1] = HC state after layer l; stream-major X[s][d] at state_positions[j]"},
            "router_margin": {"file": "router_margin.bin", "shape": [L, S],
                              "meaning": "sorted desc (sqrt(softplus(logit)) + exp_probs_b)[k-1] - [k]; "
                                         "+inf on hash-routed layers"},
            "indexer_margin": {"file": "indexer_margin.bin", "shape": [L, S],
                               "meaning": "sorted desc indexer score over visible rows [(t+1)//4]: "
                                          "[topk-1] - [topk] when visible > index_topk; +inf otherwise / no indexer"
                                          + ("; 0 = exact tie, resolved by the lower row index on both sides" if qat else "")},
        },
        "logits_summary": {
            "argmax": [int(logits[p].argmax()) for p in logit_pos],
            "max_abs": float(logits[logit_pos].abs().max()),
        },
    }
    write_json(os.path.join(out_dir, "reference.json"), index)
    print(f"tiny-f32{' qat' if qat else ''}{' steering' if steering else ''}: wrote {out_dir}")
    for fn in sorted(os.listdir(out_dir)):
        print(f"  {fn}: {os.path.getsize(os.path.join(out_dir, fn))} bytes")
    print(f"  min router margin {np.min(rmargin):.3e}, min indexer margin {np.min(imargin):.3e}")


# ---------------------------------------------------------------------------------------------
# tiny-q: HF checkpoint -> our converter (quantized experts) -> GGUF -> gguf-py dequant -> HF logits


def gguf_to_hf(name):
    """GGUF tensor name -> (in-memory HF name, None | 'gate' | 'up'). Inverse of HF_MAPPING.md section 1."""
    top = {
        "token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
        "output_norm.weight": "model.norm.weight", "output_hc_fn.weight": "model.hc_head.hc_fn",
        "output_hc_base.weight": "model.hc_head.hc_base", "output_hc_scale.weight": "model.hc_head.hc_scale",
    }
    if name in top:
        return top[name], None
    _, il, rest = name.split(".", 2)
    per = {
        "hc_attn_fn.weight": "attn_hc.fn", "hc_attn_scale.weight": "attn_hc.scale", "hc_attn_base.weight": "attn_hc.base",
        "hc_ffn_fn.weight": "ffn_hc.fn", "hc_ffn_scale.weight": "ffn_hc.scale", "hc_ffn_base.weight": "ffn_hc.base",
        "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
        "attn_q_a.weight": "self_attn.q_a_proj.weight", "attn_q_a_norm.weight": "self_attn.q_a_norm.weight",
        "attn_q_b.weight": "self_attn.q_b_proj.weight", "attn_kv.weight": "self_attn.kv_proj.weight",
        "attn_kv_a_norm.weight": "self_attn.kv_norm.weight", "attn_sinks.weight": "self_attn.sinks",
        "attn_output_a.weight": "self_attn.o_a_proj.weight", "attn_output_b.weight": "self_attn.o_b_proj.weight",
        "attn_compressor_ape.weight": "self_attn.compressor.position_bias",
        "attn_compressor_kv.weight": "self_attn.compressor.kv_proj.weight",
        "attn_compressor_gate.weight": "self_attn.compressor.gate_proj.weight",
        "attn_compressor_norm.weight": "self_attn.compressor.kv_norm.weight",
        "indexer.attn_q_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
        "indexer.proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
        "indexer_compressor_ape.weight": "self_attn.compressor.indexer.position_bias",
        "indexer_compressor_kv.weight": "self_attn.compressor.indexer.kv_proj.weight",
        "indexer_compressor_gate.weight": "self_attn.compressor.indexer.gate_proj.weight",
        "indexer_compressor_norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
        "ffn_gate_inp.weight": "mlp.gate.weight", "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
        "ffn_gate_tid2eid.weight": "mlp.gate.tid2eid", "ffn_down_exps.weight": "mlp.experts.down_proj",
        "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
        "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
        "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
    }
    if rest in ("ffn_gate_exps.weight", "ffn_up_exps.weight"):
        return f"model.layers.{il}.mlp.experts.gate_up_proj", rest.split("_")[1]
    return f"model.layers.{il}.{per[rest]}", None


def cmd_tiny_q(args):
    import gguf

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cfg_dict = tiny_q_config()
    model, cfg = build_model(cfg_dict, seed=20260502)
    out_dir = os.path.join(FIX_DIR, "hf_tiny_q")
    os.makedirs(out_dir, exist_ok=True)
    ckpt = args.ckpt_dir or os.path.join(REPO, "tools", "reference", ".cache", "hf_tiny_q")
    os.makedirs(ckpt, exist_ok=True)
    write_json(os.path.join(ckpt, "config.json"), cfg_dict)
    save_safetensors(os.path.join(ckpt, "model.safetensors"), in_memory_state(model))
    write_json(os.path.join(out_dir, "config.json"), cfg_dict)

    g = torch.Generator().manual_seed(778)
    S = SEQ_LEN_Q
    tokens = torch.randint(0, cfg.vocab_size, (1, S), generator=g, dtype=torch.long)
    logit_pos = list(range(S))  # every position
    result = {
        "generator": "tools/reference/forward_fixtures.py tiny-q",
        "reference": "transformers 5.17.0 float32 CPU, with EVERY weight replaced by the gguf-py (gguf==0.19.0) "
                     "dequantization of the corresponding tensor of the converted GGUF (experts Q4_K etc., "
                     "attention/shared/output Q8_0, F16 tensors as F16): the HF math on exactly the GGUF's weights",
        "format": "logits_<mix>.bin: raw little-endian float32 [n_logit_pos, vocab]",
        "seq_len": S,
        "tokens": tokens[0].tolist(),
        "vocab_size": cfg.vocab_size,
        "logit_positions": logit_pos,
        "mixes": {},
    }
    for mix in args.mixes.split(","):
        gguf_path = os.path.join(out_dir, f"tiny_q_{mix}.gguf")
        subprocess.run([args.convert_bin, "convert", ckpt, gguf_path, "--mix", mix], check=True)
        reader = gguf.GGUFReader(gguf_path)
        by_name = {t.name: t for t in reader.tensors}
        with torch.no_grad():
            sd = model.state_dict()
            loaded = set()
            for t in reader.tensors:
                hf, part = gguf_to_hf(t.name)
                ne = [int(x) for x in t.shape]
                if t.tensor_type == gguf.GGMLQuantizationType.I32:
                    arr = torch.from_numpy(np.array(t.data, dtype=np.int64).reshape(list(reversed(ne))))
                else:
                    arr = gguf.quants.dequantize(t.data, t.tensor_type)
                    arr = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32).reshape(list(reversed(ne))))
                dst = sd[hf]
                if part is None:
                    dst.copy_(arr.reshape(dst.shape))
                else:
                    inter = dst.shape[1] // 2
                    rows = slice(0, inter) if part == "gate" else slice(inter, 2 * inter)
                    dst[:, rows, :].copy_(arr)
                loaded.add((hf, part))
            missing = [k for k in sd if (k, None) not in loaded and not k.endswith("gate_up_proj")]
            assert not missing, f"GGUF lacks tensors for {missing}"
            for il in range(cfg.num_hidden_layers):
                result["mixes"].setdefault(mix, {})[f"blk.{il}"] = {
                    p: by_name[f"blk.{il}.ffn_{p}_exps.weight"].tensor_type.name for p in ("gate", "up", "down")}
            out = model(input_ids=tokens, use_cache=False)
        logits = out.logits[0][logit_pos].float().numpy()
        write_bytes(os.path.join(out_dir, f"logits_{mix}.bin"), f32_bytes(logits))
        result["mixes"][mix]["gguf"] = os.path.basename(gguf_path)
        result["mixes"][mix]["logits"] = f"logits_{mix}.bin"
        # reload the pristine experts for the next mix
        model, cfg = build_model(cfg_dict, seed=20260502)
    write_json(os.path.join(out_dir, "reference.json"), result)
    for fn in sorted(os.listdir(out_dir)):
        print(f"  {fn}: {os.path.getsize(os.path.join(out_dir, fn))} bytes")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("tiny-f32")
    sub.add_parser("tiny-steer")
    sub.add_parser("tiny-imatrix")
    q = sub.add_parser("tiny-q")
    q.add_argument("--convert-bin", required=True, help="path of the ds4-gguf binary (has `convert`)")
    q.add_argument("--mixes", default="q4,q2")
    q.add_argument("--ckpt-dir", default=None, help="where to write the (uncommitted) HF checkpoint")
    args = ap.parse_args()
    if args.cmd == "tiny-f32":
        cmd_tiny_f32(args)
    elif args.cmd == "tiny-steer":
        cmd_tiny_steer(args)
    elif args.cmd == "tiny-imatrix":
        cmd_tiny_imatrix(args)
    else:
        cmd_tiny_q(args)


if __name__ == "__main__":
    main()
