#!/usr/bin/env python3
"""A tiny DeepSeek-V4 trained on a copy task, converted to the ds4 GGUF layout.

Random-weight test models have nearly flat logits: their top-1 margins are so small that any
perturbation of the hidden state (a 1e-5 relative change, f16 rounding) can change a greedy token.
A trained model's predictions have margins. This script trains the smallest DeepSeek-V4 that runs
every kind of layer (4 layers: sliding-window only, CSA ratio 4 with the indexer, HCA ratio 128;
hash-routed and biased top-k MoE; mHC) on a task that needs attention: each sequence is a random
segment of PERIOD tokens repeated, so from the second period on the next token is the one PERIOD
positions back. The trained checkpoint is converted by our converter (`ds4-gguf convert --mix q4`).

Independent of our engine: transformers 5.17.0 `DeepseekV4ForCausalLM` trains and evaluates it
(float32, CPU, one thread, fixed seeds: re-running re-creates the files byte-identically).

Usage (venv at .venv-ref, see HF_MAPPING.md):
    .venv-ref/bin/python tools/reference/trained_tiny.py --convert-bin target/release/ds4-gguf

Output (crates/dist/tests/fixtures/copy_task/):
    copy_q4.gguf     the trained model, ds4 layout, q4 mix
    copy_mtp.gguf    a trained MTP block for it (the C engine's MTP GGUF layout, `mtp.0.*`): the main
                     model frozen, the block learns to predict the token after next from the main
                     model's last HC streams and the next token (DeepSeek-V3 pairing); converted with
                     the same converter (as layer 4 of a 5-layer checkpoint) and renamed with gguf-py
    reference.json   task, training summary, held-out accuracy and top-1 margins under HF (float32
                     weights), the MTP block's training and held-out draft accuracy, and the test
                     prompts with the task's continuation
"""
import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import forward_fixtures as ff  # noqa: E402

REPO = ff.REPO
OUT_DIR = os.path.join(REPO, "crates", "dist", "tests", "fixtures", "copy_task")
PERIOD = 8
SEQ = 48
FIRST_TOKEN = 2  # 0 and 1 are bos / eos


def config():
    c = ff.tiny_q_config()
    c.update({
        "num_hidden_layers": 4,
        "compress_ratios": [0, 4, 128, 4],
        "num_hash_layers": 1,
        # Pinned: the committed fixture was trained with a 32-token window (forward_fixtures' tiny
        # configs moved to the real 128 later).
        "sliding_window": 32,
    })
    return c


def batch(g, n, vocab):
    seg = torch.randint(FIRST_TOKEN, vocab, (n, PERIOD), generator=g, dtype=torch.long)
    return seg.repeat(1, SEQ // PERIOD)


def loss_fn(model, x):
    logits = model(input_ids=x, use_cache=False).logits
    # From the second period on, every next token is determined by the one PERIOD back.
    pred = logits[:, PERIOD - 1:-1, :]
    tgt = x[:, PERIOD:]
    return torch.nn.functional.cross_entropy(pred.reshape(-1, pred.shape[-1]), tgt.reshape(-1)), pred, tgt


def evaluate(model, x):
    with torch.no_grad():
        _, pred, tgt = loss_fn(model, x)
        top2 = pred.topk(2, dim=-1)
        acc = (top2.indices[..., 0] == tgt).float().mean().item()
        margin = (top2.values[..., 0] - top2.values[..., 1])
        return acc, margin.min().item(), margin.median().item()


class MtpBlock(torch.nn.Module):
    """The MTP block: e = e_proj(enorm(embed(t))), h = h_proj(hnorm(H)) per stream, one decoder layer
    (window-only, its own rope), then its own HC head and norm, and the main model's lm_head."""

    def __init__(self, main_model, seed):
        super().__init__()
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RMSNorm
        c5 = mtp_config()
        host, cfg5 = ff.build_model(c5, seed=seed)
        self.cfg = cfg5
        self.block = host.model.layers[4]
        self.rotary = host.model.rotary_emb
        self.hc_head = host.model.hc_head
        d = cfg5.hidden_size
        g = torch.Generator().manual_seed(seed + 7)
        self.e_proj = torch.nn.Linear(d, d, bias=False)
        self.h_proj = torch.nn.Linear(d, d, bias=False)
        with torch.no_grad():
            self.e_proj.weight.copy_(torch.randn((d, d), generator=g) / d ** 0.5)
            self.h_proj.weight.copy_(torch.randn((d, d), generator=g) / d ** 0.5)
        self.enorm = DeepseekV4RMSNorm(d, eps=cfg5.rms_norm_eps)
        self.hnorm = DeepseekV4RMSNorm(d, eps=cfg5.rms_norm_eps)
        self.norm = DeepseekV4RMSNorm(d, eps=cfg5.rms_norm_eps)
        # Shared with the (frozen) main model, not parameters of the block.
        self._embed = [main_model.model.embed_tokens]
        self._lm_head = [main_model.lm_head]

    def forward(self, hidden, ids):
        from transformers.masking_utils import create_sliding_window_causal_mask
        e = self.e_proj(self.enorm(self._embed[0](ids)))
        x = e.unsqueeze(2) + self.h_proj(self.hnorm(hidden))
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        pe = {k: self.rotary(e, position_ids=pos, layer_type=k) for k in ("main", "compress")}
        mask = create_sliding_window_causal_mask(config=self.cfg, inputs_embeds=e, attention_mask=None,
                                                 past_key_values=None, position_ids=pos)
        y = self.block(x, position_embeddings=pe, position_ids=pos, attention_mask=mask, input_ids=ids,
                       past_key_values=None)
        return self._lm_head[0](self.norm(self.hc_head(y)))


def mtp_config():
    """The main config with the MTP block appended as a window-only layer 4."""
    c = config()
    c.update({"num_hidden_layers": 5, "compress_ratios": [0, 4, 128, 4, 0]})
    return c


def main_streams(model, x):
    """The main model's HC streams after its last layer, [B, T, hc, D] (what drafting starts from)."""
    out = {}
    h = model.model.layers[-1].register_forward_hook(lambda m, i, o: out.__setitem__("h", o))
    with torch.no_grad():
        model(input_ids=x, use_cache=False)
    h.remove()
    return out["h"]


def mtp_loss(mtp, model, x):
    # Pair i = (streams at i, token i+1) predicts token i+2; deterministic from the second period on.
    logits = mtp(main_streams(model, x)[:, :-1], x[:, 1:])
    pred = logits[:, PERIOD - 2:-1, :]
    tgt = x[:, PERIOD:]
    return torch.nn.functional.cross_entropy(pred.reshape(-1, pred.shape[-1]), tgt.reshape(-1)), pred, tgt


def train_mtp(model, steps, bs, lr, vocab):
    for p in model.parameters():
        p.requires_grad_(False)
    model.eval()
    mtp = MtpBlock(model, seed=20261204)
    mtp.train()
    opt = torch.optim.AdamW([p for p in mtp.parameters()], lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(1204)
    held_out = batch(torch.Generator().manual_seed(98), 64, vocab)
    log = []
    for step in range(1, steps + 1):
        loss, _, _ = mtp_loss(mtp, model, batch(g, bs, vocab))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(mtp.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == steps:
            mtp.eval()
            with torch.no_grad():
                _, pred, tgt = mtp_loss(mtp, model, held_out)
                acc = (pred.argmax(-1) == tgt).float().mean().item()
            mtp.train()
            log.append({"step": step, "loss": round(loss.item(), 5), "held_out_draft_accuracy": acc})
            print(f"mtp step {step}: loss {loss.item():.4f}, held-out draft accuracy {acc:.4f}", flush=True)
    mtp.eval()
    return mtp, log


def write_mtp_gguf(model, mtp, convert_bin, out_path):
    """Converts the block as layer 4 of a 5-layer checkpoint with our converter, then writes its
    `blk.4.*` tensors as `mtp.0.*` plus the MTP's own input/head tensors (F32)."""
    import numpy as np
    from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType
    ckpt = os.path.join(REPO, "tools", "reference", ".cache", "copy_task_mtp")
    os.makedirs(ckpt, exist_ok=True)
    state = ff.in_memory_state(model)
    for k, v in mtp.block.state_dict().items():
        state[f"model.layers.4.{k}"] = v.detach().contiguous().clone()
    ff.write_json(os.path.join(ckpt, "config.json"), mtp_config())
    ff.save_safetensors(os.path.join(ckpt, "model.safetensors"), dict(sorted(state.items())))
    five = os.path.join(ckpt, "five_layers_q4.gguf")
    subprocess.run([convert_bin, "convert", ckpt, five, "--mix", "q4"], check=True)
    r = GGUFReader(five)
    w = GGUFWriter(out_path, arch="deepseek4_mtp_support")
    w.add_name("DwarfStar copy-task MTP block (tools/reference/trained_tiny.py)")
    w.add_uint32("deepseek4.embedding_length", model.config.hidden_size)
    w.add_uint32("deepseek4.block_count", model.config.num_hidden_layers)
    for t in r.tensors:
        if not t.name.startswith("blk.4."):
            continue
        name = "mtp.0." + t.name[len("blk.4."):]
        if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            w.add_tensor(name, np.array(t.data))
        else:
            w.add_tensor(name, np.array(t.data), raw_dtype=t.tensor_type)
    f32 = lambda p: p.detach().float().contiguous().numpy()
    extra = {
        "e_proj.weight": mtp.e_proj.weight, "h_proj.weight": mtp.h_proj.weight,
        "enorm.weight": mtp.enorm.weight, "hnorm.weight": mtp.hnorm.weight, "norm.weight": mtp.norm.weight,
        "hc_head_fn.weight": mtp.hc_head.hc_fn, "hc_head_base.weight": mtp.hc_head.hc_base,
        "hc_head_scale.weight": mtp.hc_head.hc_scale,
    }
    for k, v in extra.items():
        w.add_tensor("mtp.0." + k, f32(v))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--convert-bin", required=True, help="path of the ds4-gguf binary (has `convert`)")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--mtp-steps", type=int, default=300)
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cfg_dict = config()
    model, cfg = ff.build_model(cfg_dict, seed=20261203)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(1203)
    held_out = batch(torch.Generator().manual_seed(99), 64, cfg.vocab_size)
    log = []
    for step in range(1, args.steps + 1):
        x = batch(g, args.batch, cfg.vocab_size)
        loss, _, _ = loss_fn(model, x)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps:
            model.eval()
            acc, mmin, mmed = evaluate(model, held_out)
            model.train()
            log.append({"step": step, "loss": round(loss.item(), 5), "held_out_accuracy": acc, "min_margin": mmin, "median_margin": mmed})
            print(f"step {step}: loss {loss.item():.4f}, held-out accuracy {acc:.4f}, top-1 margin min {mmin:.3f} median {mmed:.3f}", flush=True)
    model.eval()
    acc, mmin, mmed = evaluate(model, held_out)

    os.makedirs(OUT_DIR, exist_ok=True)
    ckpt = os.path.join(REPO, "tools", "reference", ".cache", "copy_task")
    os.makedirs(ckpt, exist_ok=True)
    ff.write_json(os.path.join(ckpt, "config.json"), cfg_dict)
    ff.save_safetensors(os.path.join(ckpt, "model.safetensors"), ff.in_memory_state(model))
    gguf_path = os.path.join(OUT_DIR, "copy_q4.gguf")
    subprocess.run([args.convert_bin, "convert", ckpt, gguf_path, "--mix", "q4"], check=True)

    mtp, mtp_log = train_mtp(model, args.mtp_steps, args.batch, args.lr, cfg.vocab_size)
    mtp_path = os.path.join(OUT_DIR, "copy_mtp.gguf")
    write_mtp_gguf(model, mtp, args.convert_bin, mtp_path)

    # Test prompts: held-out segments given twice; the task's continuation repeats them.
    pg = torch.Generator().manual_seed(4242)
    prompts = []
    for _ in range(4):
        seg = torch.randint(FIRST_TOKEN, cfg.vocab_size, (PERIOD,), generator=pg, dtype=torch.long).tolist()
        prompts.append({"prompt": seg * 2, "continuation": (seg * 3)[:16]})
    # The MTP block's drafts under HF over prompt + continuation: pair i (streams at i, token i+1)
    # gives draft_argmax[i] (the token after i+1) with its top-1 margin.
    mtp_drafts = []
    for p in prompts:
        x = torch.tensor([p["prompt"] + p["continuation"]])
        with torch.no_grad():
            l = mtp(main_streams(model, x)[:, :-1], x[:, 1:])[0]
        top2 = l.topk(2, dim=-1)
        mtp_drafts.append({"tokens": x[0].tolist(), "draft_argmax": top2.indices[:, 0].tolist(),
                           "draft_margin": (top2.values[:, 0] - top2.values[:, 1]).tolist()})
    ff.write_json(os.path.join(OUT_DIR, "reference.json"), {
        "generator": "tools/reference/trained_tiny.py",
        "reference": "transformers 5.17.0 DeepseekV4ForCausalLM, float32, CPU, trained with AdamW on the copy task",
        "task": f"random segments of {PERIOD} tokens in [{FIRST_TOKEN}, {cfg.vocab_size}) repeated; from the second "
                f"period on the next token is the one {PERIOD} positions back",
        "config": cfg_dict,
        "training": log,
        "held_out": {"sequences": 64, "accuracy": acc, "min_top1_margin": mmin, "median_top1_margin": mmed},
        "mtp": {"file": "copy_mtp.gguf", "pairing": "streams after the last layer at i + token i+1 -> token i+2",
                "training": mtp_log, "held_out_draft_accuracy": mtp_log[-1]["held_out_draft_accuracy"],
                "drafts": mtp_drafts},
        "prompts": prompts,
    })
    print(f"wrote {gguf_path}: held-out accuracy {acc:.4f}, top-1 margin min {mmin:.3f} median {mmed:.3f}")


if __name__ == "__main__":
    main()
