//! The FFN-side ops on the test adapter against the CPU model (`ds4_model`): embedding, the
//! hyper-connection entry / exit / head, the router (biased and hash), the routed-expert product
//! (every type, experts straddling binding parts) and the whole MoE sub-layer of a tiny synthetic
//! model (q2 and q4 mixes), one token and a prefill batch. Weight products of the reference run
//! under `Precision::Exact` (dequantized weights, f64 dots); the GPU sums in f32.
mod common;

use std::sync::{Arc, OnceLock};

use ds4_gguf::GgufFile;
use ds4_model::synth::{self, Mix, SynthSpec};
use ds4_model::weights::{HcWeights, LayerWeights, Mat};
use ds4_model::{hc, moe, ops as cops, Config, LayerRange, Weights};
use ds4_quant::{matmul, GgmlType, Precision};
use ds4_wgpu::ops::{Embed, ExpertGroups, ExpertMatVec, Experts, HcDims, HcHead, HcPost, HcPre, HeadRows, Moe, MoeScratch, RouteConfig, Router, Routing};
use ds4_wgpu::{Gpu, GpuBuffer, ResidentTensor, Step};

/// Weight binding cap: the tiny model's expert stacks (and its embedding) split into several parts,
/// with experts straddling part boundaries.
const BINDING: u64 = 20 << 10;
/// Tokens the ops are built for (steps use 1 and 5).
const MAXT: u32 = 8;

struct Model {
    cfg: Config,
    w: Weights,
}

fn model(mix: Mix) -> &'static Model {
    static Q2: OnceLock<Model> = OnceLock::new();
    static Q4: OnceLock<Model> = OnceLock::new();
    let (cell, tag) = match mix {
        Mix::Q2 => (&Q2, "q2"),
        Mix::Q4 => (&Q4, "q4"),
        Mix::F16 => panic!("not used"),
    };
    cell.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("ds4-wgpu-ffn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("tiny-{tag}.gguf"));
        let spec = SynthSpec { shape: "tiny", mix, seed: 7, layers: None, vocab: None };
        synth::write(&spec, &path, |_, _| {}).unwrap();
        let f = Arc::new(GgufFile::open(&path).unwrap());
        let cfg = Config::from_gguf(&f).unwrap();
        let w = Weights::bind(f, &cfg, LayerRange::full(&cfg)).unwrap();
        Model { cfg, w }
    })
}

fn upload(gpu: &Gpu, w: &Weights, m: &Mat, name: &str) -> ResidentTensor {
    let r = w.mat(m);
    ResidentTensor::upload(gpu, name, r.ty, r.data, r.rows, r.cols).unwrap()
}

fn dims(cfg: &Config, iters: usize) -> HcDims {
    HcDims { n_hc: cfg.n_hc, n_embd: cfg.n_embd, sinkhorn_iters: iters, hc_eps: cfg.hc_eps, rms_eps: cfg.rms_eps }
}

fn buf(gpu: &Gpu, n: usize) -> GpuBuffer {
    GpuBuffer::new(gpu, "t", n).unwrap()
}

/// CPU product under the exact path (dequantized weights, f64 dots).
fn mm(w: &Weights, m: &Mat, x: &[f32], n: usize) -> Vec<f32> {
    let r = w.mat(m);
    let mut y = vec![0f32; n * r.rows];
    matmul(&r, x, n, &mut y, Precision::Exact);
    y
}

/// Streams with per-stream scales (so the collapse weights matter).
fn streams(cfg: &Config, ntok: usize, seed: u64) -> Vec<f32> {
    let e = cfg.n_embd;
    common::normals(seed, ntok * cfg.hc_dim()).iter().enumerate().map(|(i, v)| v * (1.0 + ((i / e) % cfg.n_hc) as f32 * 0.5)).collect()
}

/// max |got - want| / max |want|.
fn rel(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let m = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    got.iter().zip(want).fold(0f32, |a, (g, w)| common::worse32(a, (g - w).abs())) / m
}

/// The CPU sub-layer entry (as `Stage::hc_pre` + the sub-layer norm): xn rows and the mixes.
fn cpu_pre(cfg: &Config, w: &Weights, hcw: &HcWeights, norm: &[f32], x: &[f32], n: usize, iters: usize) -> (Vec<f32>, Vec<hc::HcMix>) {
    let (hd, e, nm) = (cfg.hc_dim(), cfg.n_embd, cfg.hc_mix());
    let mut flat = vec![0f32; n * hd];
    for i in 0..n {
        hc::flat_norm(&x[i * hd..(i + 1) * hd], &mut flat[i * hd..(i + 1) * hd], cfg.rms_eps);
    }
    let mix = mm(w, &hcw.fn_, &flat, n);
    let mut xn = vec![0f32; n * e];
    let mixes = (0..n)
        .map(|i| hc::pre_from_mix(&mix[i * nm..(i + 1) * nm], &hcw.scale, &hcw.base, cfg.n_hc, iters, cfg.hc_eps, &x[i * hd..(i + 1) * hd], &mut xn[i * e..(i + 1) * e]))
        .collect();
    for r in xn.chunks_mut(e) {
        cops::rms_norm(r, Some(norm), cfg.rms_eps);
    }
    (xn, mixes)
}

/// A token's coefficients as the `coef` buffer lays them out: post, then comb.
fn coef_of(m: &hc::HcMix, n: usize) -> Vec<f32> {
    m.post[..n].iter().chain(&m.comb[..n * n]).copied().collect()
}

/// The CPU routing of one token (`moe::route`), slots sorted by expert id (stable), as the GPU writes them.
fn cpu_route(cfg: &Config, lw: &LayerWeights, logits: &[f32], token: u32) -> (Vec<u32>, Vec<f32>) {
    let k = cfg.n_expert_used;
    let hash = lw.tid2eid.as_ref().map(|t| &t[token as usize * k..(token as usize + 1) * k]);
    let (mut ids, mut ws) = (vec![0u32; k], vec![0f32; k]);
    moe::route(logits, lw.exp_bias.as_deref(), hash, k, cfg.expert_weights_norm, cfg.expert_weights_scale, &mut ids, &mut ws);
    let mut order: Vec<usize> = (0..k).collect();
    order.sort_by_key(|&s| ids[s]);
    (order.iter().map(|&s| ids[s]).collect(), order.iter().map(|&s| ws[s]).collect())
}

#[test]
fn embedding_matches_cpu_rows() {
    let m = model(Mix::Q2);
    let Some(gpu) = common::gpu(common::opts(false, Some(BINDING))) else { return };
    let (cfg, w) = (&m.cfg, &m.w);
    let (e, hd, nv) = (cfg.n_embd, cfg.hc_dim(), cfg.n_vocab);
    let ids: Vec<u32> = vec![0, nv as u32 - 1, 17, 300, 17];
    // The model's F16 table, then F32 and Q8_0 tables of the same shape.
    let emb = w.embed.as_ref().unwrap();
    let f16 = w.mat(emb).data.to_vec();
    let q8 = ds4_quant::random_valid_blocks(GgmlType::Q8_0, 5, nv * e / 32);
    let f32t = ds4_quant::random_valid_blocks(GgmlType::F32, 6, nv * e);
    for (ty, bytes) in [(GgmlType::F16, &f16), (GgmlType::Q8_0, &q8), (GgmlType::F32, &f32t)] {
        let t = ResidentTensor::upload(&gpu, "embd", ty, bytes, nv, e).unwrap();
        assert!(t.parts.len() > 3, "{ty:?}: the table should be split ({} parts)", t.parts.len());
        let tok = buf(&gpu, MAXT as usize);
        let x = buf(&gpu, MAXT as usize * hd);
        let op = Embed::new(&gpu, &t, &tok, &x, cfg.n_hc, MAXT).unwrap();
        assert!(op.check_ids(&[nv as u32]).is_err() && op.check_ids(&ids).is_ok());
        for ntok in [1, ids.len()] {
            tok.write_u32(&gpu, &ids[..ntok]).unwrap();
            gpu.run(Step { ntok: ntok as u32, pos: 0 }, |enc| op.encode(enc)).unwrap();
            let got = x.read(&gpu, ntok * hd).unwrap();
            let rb = ty.row_bytes(e).unwrap();
            for (i, &id) in ids[..ntok].iter().enumerate() {
                let mut row = vec![0f32; e];
                if ty == GgmlType::F16 {
                    w.embed_row(id, &mut row).unwrap();
                } else {
                    ds4_quant::dequantize(ty, &bytes[id as usize * rb..(id as usize + 1) * rb], &mut row).unwrap();
                }
                for s in 0..cfg.n_hc {
                    let o = i * hd + s * e;
                    assert!(got[o..o + e].iter().zip(&row).all(|(a, b)| a.to_bits() == b.to_bits()), "{ty:?} token {id} stream {s} differs");
                }
            }
        }
    }
}

#[test]
fn hc_entry_exit_and_head_match_cpu() {
    let m = model(Mix::Q2);
    let Some(gpu) = common::gpu(common::opts(false, Some(BINDING))) else { return };
    let (cfg, w) = (&m.cfg, &m.w);
    let (hd, e, nm, n) = (cfg.hc_dim(), cfg.n_embd, cfg.hc_mix(), cfg.n_hc);
    let d = dims(cfg, cfg.sinkhorn_iters);
    let mt = MAXT as usize;
    let (xb, mix, xn, coef, yb, out) = (buf(&gpu, mt * hd), buf(&gpu, mt * nm), buf(&gpu, mt * e), buf(&gpu, mt * d.coef_len()), buf(&gpu, mt * e), buf(&gpu, mt * e));
    let lw = w.layer(3);
    let (mut w_xn, mut w_coef, mut w_post, mut w_head) = (0f32, 0f32, 0f32, 0f32);
    let (mut w_miss, mut w_last, mut w_trans) = (f32::MAX, f32::MAX, f32::MAX);
    for ntok in [1usize, 5] {
        let x = streams(cfg, ntok, 100 + ntok as u64);
        let step = Step { ntok: ntok as u32, pos: 0 };
        for (hcw, norm) in [(&lw.hc_attn, &lw.attn_norm), (&lw.hc_ffn, &lw.ffn_norm)] {
            xb.write(&gpu, &x).unwrap();
            let fn_t = upload(&gpu, w, &hcw.fn_, "hc_fn");
            let pre = HcPre::new(&gpu, &d, &fn_t, &hcw.scale, &hcw.base, norm, &xb, &mix, &xn, &coef, MAXT).unwrap();
            gpu.run(step, |enc| pre.encode(enc)).unwrap();
            let (want_xn, mixes) = cpu_pre(cfg, w, hcw, norm, &x, ntok, cfg.sinkhorn_iters);
            w_xn = common::worse32(w_xn, rel(&xn.read(&gpu, ntok * e).unwrap(), &want_xn));
            let want_coef: Vec<f32> = mixes.iter().flat_map(|m| coef_of(m, n)).collect();
            let got_coef = coef.read(&gpu, ntok * d.coef_len()).unwrap();
            w_coef = common::worse32(w_coef, rel(&got_coef, &want_coef));

            // Injected mistakes: the Sinkhorn loop cut to its first normalisation, or to all but
            // its last iteration (converged by then: measured at the f32 noise level, not asserted).
            for (iters, worst) in [(1, &mut w_miss), (cfg.sinkhorn_iters - 1, &mut w_last)] {
                let short = HcPre::new(&gpu, &dims(cfg, iters), &fn_t, &hcw.scale, &hcw.base, norm, &xb, &mix, &xn, &coef, MAXT).unwrap();
                gpu.run(step, |enc| short.encode(enc)).unwrap();
                *worst = worst.min(rel(&coef.read(&gpu, ntok * d.coef_len()).unwrap(), &want_coef));
            }

            // Exit on the CPU's coefficients and a random sub-layer output.
            coef.write(&gpu, &want_coef).unwrap();
            let y = common::normals(200 + ntok as u64, ntok * e);
            yb.write(&gpu, &y).unwrap();
            let post = HcPost::new(&gpu, &d, &xb, &yb, &coef, MAXT).unwrap();
            gpu.run(step, |enc| post.encode(enc)).unwrap();
            let mut want_x = x.clone();
            let mut tmp = vec![0f32; hd];
            for i in 0..ntok {
                hc::post(&mixes[i], n, &y[i * e..(i + 1) * e], &mut want_x[i * hd..(i + 1) * hd], &mut tmp);
            }
            w_post = common::worse32(w_post, rel(&xb.read(&gpu, ntok * hd).unwrap(), &want_x));
            // Injected mistake: comb read transposed (comb[c][r]).
            let transposed: Vec<f32> = mixes
                .iter()
                .flat_map(|m| {
                    let mut t = *m;
                    (0..n).for_each(|r| (0..n).for_each(|c| t.comb[r * n + c] = m.comb[c * n + r]));
                    coef_of(&t, n)
                })
                .collect();
            coef.write(&gpu, &transposed).unwrap();
            xb.write(&gpu, &x).unwrap();
            gpu.run(step, |enc| post.encode(enc)).unwrap();
            w_trans = w_trans.min(rel(&xb.read(&gpu, ntok * hd).unwrap(), &want_x));
        }
        // Output head: every row, and the last row only.
        xb.write(&gpu, &x).unwrap();
        let hw = w.head.as_ref().unwrap();
        let hfn = upload(&gpu, w, &hw.hc_fn, "output_hc_fn");
        let mut flat = vec![0f32; ntok * hd];
        for i in 0..ntok {
            hc::flat_norm(&x[i * hd..(i + 1) * hd], &mut flat[i * hd..(i + 1) * hd], cfg.rms_eps);
        }
        let hmix = mm(w, &hw.hc_fn, &flat, ntok);
        let mut want = vec![0f32; ntok * e];
        for i in 0..ntok {
            hc::head_collapse(&hmix[i * n..(i + 1) * n], hw.hc_scale[0], &hw.hc_base, cfg.hc_eps, &x[i * hd..(i + 1) * hd], &mut want[i * e..(i + 1) * e]);
            cops::rms_norm(&mut want[i * e..(i + 1) * e], Some(&hw.norm), cfg.rms_eps);
        }
        for rows in [HeadRows::All, HeadRows::Last] {
            let head = HcHead::new(&gpu, &d, &hfn, hw.hc_scale[0], &hw.hc_base, &hw.norm, &xb, &mix, &out, rows, MAXT).unwrap();
            gpu.run(step, |enc| head.encode(enc)).unwrap();
            let (got, want) = match rows {
                HeadRows::All => (out.read(&gpu, ntok * e).unwrap(), &want[..]),
                HeadRows::Last => (out.read(&gpu, e).unwrap(), &want[(ntok - 1) * e..]),
            };
            w_head = common::worse32(w_head, rel(&got, want));
        }
    }
    eprintln!("hc: xn {w_xn:.2e}, post/comb {w_coef:.2e}, exit {w_post:.2e}, head {w_head:.2e} of the largest value");
    eprintln!("injected: Sinkhorn cut to 1 iteration {w_miss:.2e}, to {} {w_last:.2e}; comb transposed {w_trans:.2e}", cfg.sinkhorn_iters - 1);
    // Relative to the largest value (measured <= 1.8e-7): f32 sums of 1024 (mix) and 256 (norm)
    // terms against f64, exp in the sigmoids and the softmax.
    const BOUND: f32 = 1e-6;
    assert!(w_xn <= BOUND && w_coef <= BOUND && w_post <= BOUND && w_head <= BOUND, "hc ops off the CPU beyond {BOUND}");
    assert!(w_miss > 10.0 * BOUND, "the Sinkhorn loop cut short should fail the bound (got {w_miss:.2e})");
    assert!(w_trans > 10.0 * BOUND, "a transposed comb should fail the bound (got {w_trans:.2e})");
}

/// The entry and the output head's collapse at the model shapes (Flash 4 x 4096, Pro 4 x 7168), with
/// fewer streams and a width not a multiple of 256 (3 x 264), 8 streams and a width over 8192, one
/// token and 3, against the CPU on a random F16 projection.
#[test]
fn hc_entry_at_model_shapes_matches_cpu() {
    let Some(gpu) = common::gpu(common::opts(false, None)) else { return };
    let cfg = synth::shape("flash").unwrap();
    let mut worst = 0f32;
    for (i, (n, e)) in [(4usize, 4096usize), (4, 7168), (3, 264), (8, 512), (4, 8224)].into_iter().enumerate() {
        let d = HcDims { n_hc: n, n_embd: e, sinkhorn_iters: cfg.sinkhorn_iters, hc_eps: cfg.hc_eps, rms_eps: cfg.rms_eps };
        let (hd, nm, seed) = (d.hc_dim(), d.n_mix(), 300 + 10 * i as u64);
        // Mix values of order 1 (unit-RMS flat streams), so the sigmoids and the softmax do not saturate.
        let wf: Vec<f32> = common::normals(seed, nm * hd).iter().map(|v| v / (hd as f32).sqrt()).collect();
        let wq = ds4_quant::quantize(GgmlType::F16, &wf).unwrap();
        let mut wd = vec![0f32; nm * hd];
        ds4_quant::dequantize(GgmlType::F16, &wq, &mut wd).unwrap();
        let fn_t = ResidentTensor::upload(&gpu, "hc_fn", GgmlType::F16, &wq, nm, hd).unwrap();
        let scale = [0.6f32, 0.8, 1.3];
        let base: Vec<f32> = common::normals(seed + 1, nm).iter().map(|v| v * 0.5).collect();
        let norm: Vec<f32> = common::normals(seed + 2, e).iter().map(|v| 1.0 + 0.2 * v).collect();
        let (xb, mix, xn, coef) = (buf(&gpu, 3 * hd), buf(&gpu, 3 * nm), buf(&gpu, 3 * e), buf(&gpu, 3 * d.coef_len()));
        let pre = HcPre::new(&gpu, &d, &fn_t, &scale, &base, &norm, &xb, &mix, &xn, &coef, 3).unwrap();
        // The output head's collapse at the same shape: the projection's first n rows, its base's first n.
        let head_fn = ResidentTensor::upload(&gpu, "output_hc_fn", GgmlType::F16, &ds4_quant::quantize(GgmlType::F16, &wf[..n * hd]).unwrap(), n, hd).unwrap();
        let (hmix, hout, head_scale) = (buf(&gpu, 3 * n), buf(&gpu, 3 * e), 0.7f32);
        let head = HcHead::new(&gpu, &d, &head_fn, head_scale, &base[..n], &norm, &xb, &hmix, &hout, HeadRows::All, 3).unwrap();
        for ntok in [1usize, 3] {
            let x: Vec<f32> = common::normals(seed + 3 + ntok as u64, ntok * hd).iter().enumerate().map(|(j, v)| v * (1.0 + ((j / e) % n) as f32 * 0.5)).collect();
            xb.write(&gpu, &x).unwrap();
            gpu.run(Step { ntok: ntok as u32, pos: 0 }, |enc| pre.encode(enc)).unwrap();
            let (mut want_xn, mut want_coef) = (vec![0f32; ntok * e], Vec::new());
            let mut flat = vec![0f32; hd];
            for t in 0..ntok {
                let xt = &x[t * hd..(t + 1) * hd];
                hc::flat_norm(xt, &mut flat, cfg.rms_eps);
                let m: Vec<f32> = wd.chunks(hd).map(|r| r.iter().zip(&flat).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() as f32).collect();
                let out = &mut want_xn[t * e..(t + 1) * e];
                let hm = hc::pre_from_mix(&m, &scale, &base, n, cfg.sinkhorn_iters, cfg.hc_eps, xt, out);
                cops::rms_norm(out, Some(&norm), cfg.rms_eps);
                want_coef.extend(coef_of(&hm, n));
            }
            let (rx, rc) = (rel(&xn.read(&gpu, ntok * e).unwrap(), &want_xn), rel(&coef.read(&gpu, ntok * d.coef_len()).unwrap(), &want_coef));
            gpu.run(Step { ntok: ntok as u32, pos: 0 }, |enc| head.encode(enc)).unwrap();
            let mut want_head = vec![0f32; ntok * e];
            for t in 0..ntok {
                let xt = &x[t * hd..(t + 1) * hd];
                hc::flat_norm(xt, &mut flat, cfg.rms_eps);
                let m: Vec<f32> = wd[..n * hd].chunks(hd).map(|r| r.iter().zip(&flat).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() as f32).collect();
                let out = &mut want_head[t * e..(t + 1) * e];
                hc::head_collapse(&m, head_scale, &base[..n], cfg.hc_eps, xt, out);
                cops::rms_norm(out, Some(&norm), cfg.rms_eps);
            }
            let rh = rel(&hout.read(&gpu, ntok * e).unwrap(), &want_head);
            eprintln!("hc entry {n} x {e}, {ntok} tokens: xn {rx:.2e}, post/comb {rc:.2e}, head {rh:.2e} of the largest value");
            worst = common::worse32(common::worse32(common::worse32(worst, rx), rc), rh);
        }
    }
    // As the tiny model's entry (measured <= 1.8e-7 there).
    const BOUND: f32 = 1e-6;
    assert!(worst <= BOUND, "hc entry off the CPU beyond {BOUND}: {worst:.2e}");
}

/// Routes `xn` (ntok rows) on the device; returns (logits, ids, weights).
#[allow(clippy::too_many_arguments)]
fn gpu_route(gpu: &Gpu, rc: &RouteConfig, gate: &ResidentTensor, routing: Routing, xn: &[f32], tokens: &[u32]) -> (Vec<f32>, Vec<u32>, Vec<f32>) {
    let (mt, ne, k, ntok) = (MAXT as usize, rc.n_expert, rc.k, tokens.len());
    let (xb, lb, tb, ib, wb) = (buf(gpu, mt * gate.cols), buf(gpu, mt * ne), buf(gpu, mt), buf(gpu, mt * k), buf(gpu, mt * k));
    xb.write(gpu, xn).unwrap();
    tb.write_u32(gpu, tokens).unwrap();
    let r = Router::new(gpu, rc, gate, routing, &xb, &lb, &tb, &ib, &wb, MAXT).unwrap();
    gpu.run(Step { ntok: ntok as u32, pos: 0 }, |enc| r.encode(enc)).unwrap();
    (lb.read(gpu, ntok * ne).unwrap(), ib.read_u32(gpu, ntok * k).unwrap(), wb.read(gpu, ntok * k).unwrap())
}

#[test]
fn router_matches_cpu_biased_and_hash() {
    let m = model(Mix::Q2);
    let Some(gpu) = common::gpu(common::opts(false, Some(BINDING))) else { return };
    let (cfg, w) = (&m.cfg, &m.w);
    let (e, ne, k) = (cfg.n_embd, cfg.n_expert, cfg.n_expert_used);
    let rc = RouteConfig { n_expert: ne, k, normalize: cfg.expert_weights_norm, scale: cfg.expert_weights_scale };
    let tokens: Vec<u32> = vec![3, cfg.n_vocab as u32 - 1, 3, 100, 42];
    let (mut w_log, mut w_wt, mut w_biased) = (0f32, 0f32, f32::MAX);
    for il in [0, 3] {
        let lw = w.layer(il);
        assert_eq!(lw.tid2eid.is_some(), il < cfg.n_hash_layer);
        let routing = match &lw.tid2eid {
            Some(t) => Routing::Hash { tid2eid: t },
            None => Routing::TopK { bias: lw.exp_bias.as_deref() },
        };
        let gate = upload(&gpu, w, &lw.gate_inp, "gate_inp");
        for ntok in [1, tokens.len()] {
            let xn = common::normals(300 + il as u64 + ntok as u64, ntok * e);
            let (logits, ids, wts) = gpu_route(&gpu, &rc, &gate, routing, &xn, &tokens[..ntok]);
            let want_logits = mm(w, &lw.gate_inp, &xn, ntok);
            w_log = common::worse32(w_log, rel(&logits, &want_logits));
            for i in 0..ntok {
                let (want_ids, want_w) = cpu_route(cfg, lw, &want_logits[i * ne..(i + 1) * ne], tokens[i]);
                assert_eq!(&ids[i * k..(i + 1) * k], &want_ids[..], "layer {il} token {i}: experts");
                w_wt = common::worse32(w_wt, rel(&wts[i * k..(i + 1) * k], &want_w));
                if let Some(b) = &lw.exp_bias {
                    // Injected mistake: weights from the biased selection scores.
                    let p: Vec<f32> = want_ids.iter().map(|&x| cops::softplus(want_logits[i * ne + x as usize]).sqrt() + b[x as usize]).collect();
                    let sum: f32 = p.iter().sum();
                    let wrong: Vec<f32> = p.iter().map(|v| v / sum.max(6.103_515_6e-5) * cfg.expert_weights_scale).collect();
                    w_biased = w_biased.min(rel(&wts[i * k..(i + 1) * k], &wrong));
                }
            }
        }
    }
    eprintln!("router: logits {w_log:.2e}, weights {w_wt:.2e} of the largest; weights from biased scores: {w_biased:.2e}");
    // Logits: f32 sums of 256 products against f64 (as the mat-vec test: ~1e-7); weights: softplus by
    // the atanh series, sqrt and the normalisation.
    const BOUND: f32 = 1e-6;
    assert!(w_log <= BOUND && w_wt <= BOUND, "router off the CPU beyond {BOUND}");
    assert!(w_biased > 10.0 * BOUND, "weights from biased scores should fail the bound (got {w_biased:.2e})");
}

#[test]
fn router_flash_width_with_strong_bias() {
    // 384 experts (two per thread), 6 per token, a bias large enough to change the choice.
    let Some(gpu) = common::gpu(common::opts(false, None)) else { return };
    let (ne, k, e, ntok) = (384usize, 6usize, 256usize, 7usize);
    let bytes = ds4_quant::random_valid_blocks(GgmlType::F16, 9, ne * e);
    let gate = ResidentTensor::upload(&gpu, "gate", GgmlType::F16, &bytes, ne, e).unwrap();
    let bias: Vec<f32> = common::normals(10, ne).iter().map(|v| v * 0.5).collect();
    let xn = common::normals(11, ntok * e);
    let tokens = vec![0u32; ntok];
    for (normalize, scale) in [(true, 2.5f32), (false, 1.0)] {
        let rc = RouteConfig { n_expert: ne, k, normalize, scale };
        let (logits, ids, wts) = gpu_route(&gpu, &rc, &gate, Routing::TopK { bias: Some(&bias) }, &xn, &tokens);
        let mut changed = 0;
        for i in 0..ntok {
            let l = &logits[i * ne..(i + 1) * ne];
            // The selection is checked on the device's own logits (the product is tested above).
            let (mut want_ids, mut want_w) = (vec![0u32; k], vec![0f32; k]);
            moe::route(l, Some(&bias), None, k, normalize, scale, &mut want_ids, &mut want_w);
            let (mut plain, mut pw) = (vec![0u32; k], vec![0f32; k]);
            moe::route(l, None, None, k, normalize, scale, &mut plain, &mut pw);
            changed += (plain != want_ids) as usize;
            let mut order: Vec<usize> = (0..k).collect();
            order.sort_by_key(|&s| want_ids[s]);
            let sorted: Vec<u32> = order.iter().map(|&s| want_ids[s]).collect();
            assert_eq!(&ids[i * k..(i + 1) * k], &sorted[..], "token {i}");
            let sw: Vec<f32> = order.iter().map(|&s| want_w[s]).collect();
            assert!(rel(&wts[i * k..(i + 1) * k], &sw) <= 1e-6, "token {i} weights");
        }
        assert!(changed > 0, "the bias should change some token's experts");
    }
}

#[test]
fn router_ties_to_the_lowest_index() {
    // The most experts (1024) and picks (16), gate rows repeated in threes (experts 3g..3g+2 have
    // the same logit, bit for bit), with and without a bias repeated the same way: the 16th pick
    // splits a group of three, so ties decide which expert is chosen, as in the serial selection.
    let Some(gpu) = common::gpu(common::opts(false, None)) else { return };
    let (ne, k, e, ntok) = (1024usize, 16usize, 64usize, 3usize);
    let rows = common::normals(12, ne.div_ceil(3) * e);
    let bytes: Vec<u8> = (0..ne).flat_map(|x| rows[x / 3 * e..(x / 3 + 1) * e].iter().flat_map(|v| half::f16::from_f32(*v * 0.2).to_bits().to_le_bytes())).collect();
    let gate = ResidentTensor::upload(&gpu, "gate", GgmlType::F16, &bytes, ne, e).unwrap();
    let group_bias = common::normals(13, ne.div_ceil(3));
    let bias: Vec<f32> = (0..ne).map(|x| group_bias[x / 3] * 0.1).collect();
    let xn = common::normals(14, ntok * e);
    let tokens = vec![0u32; ntok];
    for (normalize, bias) in [(true, Some(&bias[..])), (false, None)] {
        let rc = RouteConfig { n_expert: ne, k, normalize, scale: 1.5 };
        let (logits, ids, wts) = gpu_route(&gpu, &rc, &gate, Routing::TopK { bias }, &xn, &tokens);
        for i in 0..ntok {
            let l = &logits[i * ne..(i + 1) * ne];
            assert!(l.chunks(3).all(|g| g.iter().all(|v| v.to_bits() == g[0].to_bits())), "token {i}: repeated rows should give equal logits");
            let (mut want_ids, mut want_w) = (vec![0u32; k], vec![0f32; k]);
            moe::route(l, bias, None, k, normalize, 1.5, &mut want_ids, &mut want_w);
            let last = want_ids[k - 1] as usize / 3 * 3;
            assert!((last..(last + 3).min(ne)).any(|x| !want_ids.contains(&(x as u32))), "token {i}: the last pick should leave a tied expert out");
            let mut order: Vec<usize> = (0..k).collect();
            order.sort_by_key(|&s| want_ids[s]);
            let sorted: Vec<u32> = order.iter().map(|&s| want_ids[s]).collect();
            assert_eq!(&ids[i * k..(i + 1) * k], &sorted[..], "token {i} (bias {})", bias.is_some());
            let sw: Vec<f32> = order.iter().map(|&s| want_w[s]).collect();
            assert!(rel(&wts[i * k..(i + 1) * k], &sw) <= 1e-6, "token {i} weights");
        }
    }
}

/// A stacked expert tensor of `ty`: n_expert x r rows of `cols`.
struct Stack {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    bytes: Vec<u8>,
}

impl Stack {
    fn new(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Self {
        Self { ty, rows, cols, bytes: ds4_quant::random_valid_blocks(ty, seed, rows * cols / ty.block_elems()) }
    }
    /// (dot, sum |w x|) of global row `g` with x in f64; with `round16` of the weights and inputs
    /// rounded to f16 (the cooperative-matrix tiles' inputs).
    fn dot(&self, g: usize, x: &[f32], round16: bool) -> (f64, f64) {
        let rb = self.ty.row_bytes(self.cols).unwrap();
        let mut row = vec![0f32; self.cols];
        ds4_quant::dequantize(self.ty, &self.bytes[g * rb..(g + 1) * rb], &mut row).unwrap();
        let h = |v: f32| if round16 { half::f16::from_f32(v).to_f32() as f64 } else { v as f64 };
        row.iter().zip(x).fold((0.0, 0.0), |(s, a), (&w, &v)| (s + h(w) * h(v), a + (h(w) * h(v)).abs()))
    }
}

#[test]
fn expert_products_every_type_straddling_parts() {
    let (n_expert, r, cols, k) = (6usize, 40usize, 256usize, 4usize);
    // 8 tokens x 4 slots: experts 0 and 5 at both ends, repeated experts (expert 5 and 0 in more
    // than one tile of 4, expert 2 in exactly one), experts whose rows straddle a part boundary.
    let ids: Vec<u32> = vec![0, 2, 3, 5, 1, 1, 4, 5, 2, 2, 2, 2, 5, 5, 5, 5, 5, 5, 5, 0, 3, 1, 4, 2, 0, 0, 0, 0, 0, 0, 3, 5];
    let mut worst = 0f64;
    // The f32 tiles with and without the optional features, then (where the adapter has them) the
    // cooperative-matrix tiles, checked against the product of their f16-rounded inputs.
    for mode in ["f32 tiles", "fallback", "coop"] {
        let fallback = mode == "fallback";
        let mut o = common::opts(fallback, Some(4 << 10));
        if mode == "f32 tiles" {
            o.disable |= ds4_wgpu::wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        let Some(gpu) = common::gpu(o) else { return };
        if mode == "coop" && gpu.caps().coop.is_none() {
            eprintln!("no cooperative matrices on {}: coop expert tiles not tested", gpu.caps().adapter);
            break;
        }
        let idb = buf(&gpu, MAXT as usize * k);
        idb.write_u32(&gpu, &ids).unwrap();
        let groups = ExpertGroups::new(&gpu, &idb, n_expert, k, MAXT).unwrap();
        let tgroups = ExpertGroups::with_tile(&gpu, &idb, n_expert, k, MAXT, ds4_wgpu::shaders::MATMUL_TILE).unwrap();
        for (i, ty) in [GgmlType::F16, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q4_K, GgmlType::IQ2_XXS].into_iter().enumerate() {
            let st = Stack::new(ty, n_expert * r, cols, 20 + i as u64);
            let t = ResidentTensor::upload(&gpu, "exps", ty, &st.bytes, st.rows, cols).unwrap();
            assert!(t.parts.iter().any(|p| p.row0 % r != 0), "{ty:?}: some part should start inside an expert");
            for per_slot in [false, true] {
                let x_rows = if per_slot { MAXT as usize * k } else { MAXT as usize };
                let x = common::normals(30 + i as u64, x_rows * cols);
                let xb = buf(&gpu, MAXT as usize * k * cols);
                xb.write(&gpu, &x).unwrap();
                let yb = buf(&gpu, MAXT as usize * k * r);
                let slot_op = ExpertMatVec::new(&gpu, &t, n_expert, &idb, &xb, per_slot, &yb, k, MAXT).unwrap();
                let tile_op = ExpertMatVec::grouped(&gpu, &t, &groups, &xb, per_slot, &yb, MAXT).unwrap();
                let tiled_op = ExpertMatVec::grouped(&gpu, &t, &tgroups, &xb, per_slot, &yb, MAXT).unwrap();
                // Rows of the per-slot walk (decode) and of the grouped one (prefill, a verify step):
                // bit for bit the same sums (an MTP verify's rows must be its decode steps' rows).
                let mut bits: Vec<Vec<u32>> = Vec::new();
                for (walk, nt) in [("per slot", 1), ("per slot", 3), ("grouped", 2), ("grouped", 8), ("tiled", 3), ("tiled", 8)] {
                    yb.write(&gpu, &vec![f32::NAN; MAXT as usize * k * r]).unwrap();
                    gpu.run(Step { ntok: nt as u32, pos: 0 }, |enc| {
                        if walk == "grouped" {
                            groups.encode(enc)?;
                            tile_op.encode(enc)
                        } else if walk == "tiled" {
                            tgroups.encode(enc)?;
                            tiled_op.encode(enc)
                        } else {
                            slot_op.encode(enc)
                        }
                    })
                    .unwrap();
                    let y = yb.read(&gpu, nt * k * r).unwrap();
                    bits.push(y.iter().map(|v| v.to_bits()).collect());
                    for slot in 0..nt * k {
                        let xr = if per_slot { slot } else { slot / k };
                        for row in 0..r {
                            let round16 = mode == "coop" && walk == "tiled";
                            let (want, mag) = st.dot(ids[slot] as usize * r + row, &x[xr * cols..(xr + 1) * cols], round16);
                            let err = (y[slot * r + row] as f64 - want).abs() / (1e-5 * mag + 1e-30);
                            worst = common::worse(worst, err);
                            assert!(err <= 1.0, "{ty:?} {walk} {mode} per_slot={per_slot} slot {slot} row {row}: {} vs {want}", y[slot * r + row]);
                        }
                    }
                }
                let n2 = 2 * k * r;
                assert!(bits[1][..n2] == bits[2][..n2], "{ty:?} fallback={fallback} per_slot={per_slot}: grouped rows differ from per-slot rows");
            }
        }
    }
    eprintln!("expert products: worst {worst:.4} of the 1e-5 x sum|w x| bound");
}

/// The CPU MoE sub-layer on the streams `x` (in place), as `Stage`'s FFN block: entry, router,
/// routed experts grouped by expert, shared expert, exit. Returns the sorted expert ids per token.
fn cpu_ffn(cfg: &Config, w: &Weights, il: usize, x: &mut [f32], tokens: &[u32], clamp: f32) -> Vec<u32> {
    let lw = w.layer(il);
    let n = tokens.len();
    let (hd, e, ne, k, ff) = (cfg.hc_dim(), cfg.n_embd, cfg.n_expert, cfg.n_expert_used, cfg.ff_exp);
    let (xn, mixes) = cpu_pre(cfg, w, &lw.hc_ffn, &lw.ffn_norm, x, n, cfg.sinkhorn_iters);
    let rlog = mm(w, &lw.gate_inp, &xn, n);
    let (mut eids, mut ew) = (vec![0u32; n * k], vec![0f32; n * k]);
    for i in 0..n {
        let hash = lw.tid2eid.as_ref().map(|t| &t[tokens[i] as usize * k..(tokens[i] as usize + 1) * k]);
        moe::route(&rlog[i * ne..(i + 1) * ne], lw.exp_bias.as_deref(), hash, k, cfg.expert_weights_norm, cfg.expert_weights_scale, &mut eids[i * k..(i + 1) * k], &mut ew[i * k..(i + 1) * k]);
    }
    let mut y = vec![0f32; n * e];
    for ex in 0..ne {
        let sel: Vec<(usize, f32)> = (0..n * k).filter(|&s| eids[s] as usize == ex).map(|s| (s / k, ew[s])).collect();
        if sel.is_empty() {
            continue;
        }
        let m = sel.len();
        let xin: Vec<f32> = sel.iter().flat_map(|&(i, _)| xn[i * e..(i + 1) * e].to_vec()).collect();
        let (mut a, mut b, mut o) = (vec![0f32; m * ff], vec![0f32; m * ff], vec![0f32; m * e]);
        matmul(&w.expert(&lw.gate_exps, ex), &xin, m, &mut a, Precision::Exact);
        matmul(&w.expert(&lw.up_exps, ex), &xin, m, &mut b, Precision::Exact);
        for (j, &(_, wt)) in sel.iter().enumerate() {
            for c in 0..ff {
                a[j * ff + c] = moe::swiglu_clamped(a[j * ff + c], b[j * ff + c], clamp) * wt;
            }
        }
        matmul(&w.expert(&lw.down_exps, ex), &a, m, &mut o, Precision::Exact);
        for (j, &(i, _)) in sel.iter().enumerate() {
            y[i * e..(i + 1) * e].iter_mut().zip(&o[j * e..(j + 1) * e]).for_each(|(d, &s)| *d += s);
        }
    }
    if let Some([g, u, dn]) = &lw.shared {
        let (mut a, b) = (mm(w, g, &xn, n), mm(w, u, &xn, n));
        a.iter_mut().zip(&b).for_each(|(a, &b)| *a = moe::swiglu_clamped(*a, b, clamp));
        let o = mm(w, dn, &a, n);
        y.iter_mut().zip(&o).for_each(|(d, &s)| *d += s);
    }
    let mut tmp = vec![0f32; hd];
    for i in 0..n {
        hc::post(&mixes[i], cfg.n_hc, &y[i * e..(i + 1) * e], &mut x[i * hd..(i + 1) * hd], &mut tmp);
    }
    eids.chunks_mut(k).for_each(|c| c.sort());
    eids
}

#[test]
fn moe_sublayer_matches_cpu() {
    let (mut worst, mut injected) = (0f32, f32::MAX);
    for mix in [Mix::Q2, Mix::Q4] {
        let m = model(mix);
        let Some(gpu) = common::gpu(common::opts(false, Some(BINDING))) else { return };
        let (cfg, w) = (&m.cfg, &m.w);
        let (hd, e, nm, ne, k, ff) = (cfg.hc_dim(), cfg.n_embd, cfg.hc_mix(), cfg.n_expert, cfg.n_expert_used, cfg.ff_exp);
        let d = dims(cfg, cfg.sinkhorn_iters);
        let mt = MAXT as usize;
        let (xb, tok, mixb, xn, coef) = (buf(&gpu, mt * hd), buf(&gpu, mt), buf(&gpu, mt * nm), buf(&gpu, mt * e), buf(&gpu, mt * d.coef_len()));
        let (logits, ids, wts) = (buf(&gpu, mt * ne), buf(&gpu, mt * k), buf(&gpu, mt * k));
        let scratch = MoeScratch::new(&gpu, e, ff, k, MAXT).unwrap();
        let tokens: Vec<u32> = vec![5, 77, 5, 400, cfg.n_vocab as u32 - 1];
        for il in [0usize, 3] {
            let lw = w.layer(il);
            let hc_fn = upload(&gpu, w, &lw.hc_ffn.fn_, "hc_ffn_fn");
            let gate_inp = upload(&gpu, w, &lw.gate_inp, "gate_inp");
            let (ge, ue, de) = (upload(&gpu, w, &lw.gate_exps, "gate_exps"), upload(&gpu, w, &lw.up_exps, "up_exps"), upload(&gpu, w, &lw.down_exps, "down_exps"));
            assert!(ge.parts.len() > 2 && de.parts.len() > 2, "the expert stacks should be split");
            let sh = lw.shared.as_ref().unwrap();
            let shr = [upload(&gpu, w, &sh[0], "gate_shexp"), upload(&gpu, w, &sh[1], "up_shexp"), upload(&gpu, w, &sh[2], "down_shexp")];
            let pre = HcPre::new(&gpu, &d, &hc_fn, &lw.hc_ffn.scale, &lw.hc_ffn.base, &lw.ffn_norm, &xb, &mixb, &xn, &coef, MAXT).unwrap();
            let rc = RouteConfig { n_expert: ne, k, normalize: cfg.expert_weights_norm, scale: cfg.expert_weights_scale };
            let routing = match &lw.tid2eid {
                Some(t) => Routing::Hash { tid2eid: t },
                None => Routing::TopK { bias: lw.exp_bias.as_deref() },
            };
            let router = Router::new(&gpu, &rc, &gate_inp, routing, &xn, &logits, &tok, &ids, &wts, MAXT).unwrap();
            let experts = Experts { gate: &ge, up: &ue, down: &de, n_expert: ne };
            let moe = Moe::new(&gpu, &d, experts, Some([&shr[0], &shr[1], &shr[2]]), Some(cfg.swiglu_clamp[il]), k, &xn, &ids, &wts, &scratch, &xb, &coef, MAXT).unwrap();
            for ntok in [1usize, tokens.len()] {
                let x = streams(cfg, ntok, 500 + il as u64 + ntok as u64);
                let before = gpu.counters();
                xb.write(&gpu, &x).unwrap();
                tok.write_u32(&gpu, &tokens[..ntok]).unwrap();
                gpu.run(Step { ntok: ntok as u32, pos: 0 }, |enc| {
                    pre.encode(enc)?;
                    router.encode(enc)?;
                    moe.encode(enc)
                })
                .unwrap();
                let after = gpu.counters();
                assert_eq!(
                    (after.bind_groups, after.pipelines, after.buffers, after.weight_uploads),
                    (before.bind_groups, before.pipelines, before.buffers, before.weight_uploads),
                    "a step must not bind, compile, allocate or upload"
                );
                let mut want = x.clone();
                let want_ids = cpu_ffn(cfg, w, il, &mut want, &tokens[..ntok], cfg.swiglu_clamp[il]);
                assert_eq!(ids.read_u32(&gpu, ntok * k).unwrap(), want_ids, "{mix:?} layer {il}: experts");
                let got = xb.read(&gpu, ntok * hd).unwrap();
                let err = rel(&got, &want);
                eprintln!("moe {mix:?} layer {il} ({}) ntok {ntok}: {err:.2e} of the largest stream value", if lw.tid2eid.is_some() { "hash" } else { "biased" });
                worst = common::worse32(worst, err);
            }
            if mix == Mix::Q2 && il == 3 {
                // A clamp the tiny model's activations reach (its own, 10, they do not), then the
                // injected mistakes: the clamp left out, the shared expert left out.
                let ntok = tokens.len();
                let x = streams(cfg, ntok, 900);
                let (mut want, mut plain) = (x.clone(), x.clone());
                cpu_ffn(cfg, w, il, &mut want, &tokens, 0.3);
                cpu_ffn(cfg, w, il, &mut plain, &tokens, cfg.swiglu_clamp[il]);
                let shared = Some([&shr[0], &shr[1], &shr[2]]);
                for (label, sh, clamp, want, ok) in [
                    ("clamp 0.3", shared, Some(0.3), &want, true),
                    ("clamp left out", shared, None, &want, false),
                    ("shared expert left out", None, Some(cfg.swiglu_clamp[il]), &plain, false),
                ] {
                    let op = Moe::new(&gpu, &d, experts, sh, clamp, k, &xn, &ids, &wts, &scratch, &xb, &coef, MAXT).unwrap();
                    xb.write(&gpu, &x).unwrap();
                    tok.write_u32(&gpu, &tokens).unwrap();
                    gpu.run(Step { ntok: ntok as u32, pos: 0 }, |enc| {
                        pre.encode(enc)?;
                        router.encode(enc)?;
                        op.encode(enc)
                    })
                    .unwrap();
                    let err = rel(&xb.read(&gpu, ntok * hd).unwrap(), want);
                    eprintln!("moe {label}: {err:.2e}");
                    if ok {
                        worst = common::worse32(worst, err);
                    } else {
                        injected = injected.min(err);
                    }
                }
            }
        }
    }
    // The exit's streams against the CPU chain (products of 256 terms, f32 vs f64; sigmoid, Sinkhorn).
    assert!(worst <= 1e-6, "MoE sub-layer off the CPU by {worst:.2e} of the largest value");
    assert!(injected > 1e-5, "an injected mistake should fail the bound (got {injected:.2e})");
}
