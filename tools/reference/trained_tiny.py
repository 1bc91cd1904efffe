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
    reference.json   task, training summary, held-out accuracy and top-1 margins under HF (float32
                     weights), and the test prompts with the task's continuation
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--convert-bin", required=True, help="path of the ds4-gguf binary (has `convert`)")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
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

    # Test prompts: held-out segments given twice; the task's continuation repeats them.
    pg = torch.Generator().manual_seed(4242)
    prompts = []
    for _ in range(4):
        seg = torch.randint(FIRST_TOKEN, cfg.vocab_size, (PERIOD,), generator=pg, dtype=torch.long).tolist()
        prompts.append({"prompt": seg * 2, "continuation": (seg * 3)[:16]})
    ff.write_json(os.path.join(OUT_DIR, "reference.json"), {
        "generator": "tools/reference/trained_tiny.py",
        "reference": "transformers 5.17.0 DeepseekV4ForCausalLM, float32, CPU, trained with AdamW on the copy task",
        "task": f"random segments of {PERIOD} tokens in [{FIRST_TOKEN}, {cfg.vocab_size}) repeated; from the second "
                f"period on the next token is the one {PERIOD} positions back",
        "config": cfg_dict,
        "training": log,
        "held_out": {"sequences": 64, "accuracy": acc, "min_top1_margin": mmin, "median_top1_margin": mmed},
        "prompts": prompts,
    })
    print(f"wrote {gguf_path}: held-out accuracy {acc:.4f}, top-1 margin min {mmin:.3f} median {mmed:.3f}")


if __name__ == "__main__":
    main()
