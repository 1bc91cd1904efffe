//! The attention-family ops on the test adapter against the CPU model's own functions on the same
//! inputs: row finishing (`ops::rms_norm`, `rope::Rope::apply`, `qat::*`), the compressor
//! (`compressor::push` + the stage's QAT), the indexer (`attention::indexer_scores`,
//! `top_k_indices`) and attention (`attention::attend_head` over the stage's candidate rows, then
//! the inverse rotation), in decode steps and prefill chunks, for ratio 0, 4 and 128 layers.
mod common;

use ds4_model::attention::{attend_head, indexer_scores, top_k_indices};
use ds4_model::compressor;
use ds4_model::config::Config;
use ds4_model::kv::{compressed_capacity, CompressorState};
use ds4_model::ops::rms_norm;
use ds4_model::qat;
use ds4_model::rope::Rope as CpuRope;
use ds4_quant::GgmlType;
use ds4_wgpu::ops::{MatVec, Product};
use ds4_wgpu::ResidentTensor;
use ds4_wgpu::ops::{Attention, AttentionBuffers, AttentionShape, Compressor, CompressorShape, Indexer, IndexerBuffers, IndexerShape, KvRow, KvRowSpec, RowNorm, RowPos, RowQat};
use ds4_wgpu::{Gpu, GpuBuffer, Step};

fn tiny() -> Config {
    ds4_model::synth::shape("tiny").expect("tiny shape")
}

fn flash() -> Config {
    ds4_model::synth::shape("flash").expect("flash shape")
}

fn scaled(seed: u64, n: usize, s: f32) -> Vec<f32> {
    common::normals(seed, n).iter().map(|v| v * s).collect()
}

/// Largest |got - want| / (rel * |want| + abs). Rotated rows have values of rms ~1 and a rotation
/// error that scales with the pair's magnitude, not the element's (~3.5e-6 x (|x0| + |x1|), see
/// ops_misc): they use an absolute part of 4e-6.
fn worst(got: &[f32], want: &[f32], rel: f64, abs: f64) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).map(|(&a, &b)| ((a - b).abs() as f64) / (rel * (b.abs() as f64) + abs)).fold(0.0, common::worse)
}

/// Elements of a QAT'd row set outside the fine bound (a value that sits on a rounding boundary can
/// round the other way after an f32 difference upstream), each checked to be at most one grid step
/// (`step_rel` of the larger magnitude, plus the block's smallest step `floor`).
fn qat_flips(got: &[f32], want: &[f32], rel: f64, abs: f64, step_rel: f64, floor: f64) -> usize {
    let mut flips = 0;
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        let err = (a - b).abs() as f64;
        // `!(<=)`: a NaN element counts (and then fails the grid-step check).
        if !(err <= rel * b.abs() as f64 + abs) {
            let mag = a.abs().max(b.abs()) as f64;
            assert!(err <= step_rel * mag + floor, "element {i}: {a} vs {b}: more than one grid step");
            flips += 1;
        }
    }
    flips
}

fn run(gpu: &Gpu, ntok: usize, pos: usize, f: impl FnOnce(&mut ds4_wgpu::Encoder) -> Result<(), ds4_wgpu::WgpuError>) {
    gpu.run(Step { ntok: ntok as u32, pos: pos as u32 }, f).expect("step runs");
}

#[test]
fn kv_rows_queries_and_indexer_queries_match_cpu() {
    let Some(gpu) = common::gpu(common::opts(false, None)) else { return };
    for (cfg, ratio) in [(tiny(), 4), (flash(), 0)] {
        let rope = CpuRope::for_layer(&cfg, ratio);
        let (d, nh, ih, id) = (cfg.head_dim, 4, cfg.idx_heads.min(16), cfg.idx_dim);
        let ntok = 3;
        for pos in [0usize, 4093, 999_997] {
            // KV row: weighted norm, rope, FP8 on the non-rotated part.
            let x = scaled(pos as u64 + 1, ntok * d, 3.0);
            let g: Vec<f32> = scaled(7, d, 0.2).iter().map(|v| 1.0 + v).collect();
            let xb = GpuBuffer::from_slice(&gpu, "kv", &x).unwrap();
            let gb = GpuBuffer::from_slice(&gpu, "kv norm", &g).unwrap();
            let mut want = x.clone();
            for (i, r) in want.chunks_mut(d).enumerate() {
                rms_norm(r, Some(&g), cfg.rms_eps);
                rope.apply(r, pos + i, false);
            }
            let plain = want.clone();
            for r in want.chunks_mut(d) {
                qat::fp8_simulate(&mut r[..cfg.nope_dim()], 64);
            }
            for (qat_on, want) in [(false, &plain), (true, &want)] {
                xb.write(&gpu, &x).unwrap();
                let spec = KvRowSpec {
                    dim: d,
                    norm: RowNorm::Weighted(&gb),
                    eps: cfg.rms_eps,
                    freqs: rope.freqs(),
                    qat: if qat_on { RowQat::Fp8 } else { RowQat::None },
                    rows: RowPos::Tokens { per_tok: 1, max_tokens: ntok as u32 },
                };
                let op = KvRow::new(&gpu, &xb, &spec).unwrap();
                run(&gpu, ntok, pos, |e| op.encode(e));
                let got = xb.read(&gpu, x.len()).unwrap();
                if qat_on {
                    let flips = qat_flips(&got, want, 1e-5, 1e-6, 0.13, 1e-6);
                    eprintln!("kv row d={d} pos={pos} fp8: {flips} of {} elements rounded the other way", got.len());
                    assert!(flips <= 1, "{flips} FP8 flips");
                } else {
                    let w = worst(&got, want, 1e-5, 4e-6);
                    eprintln!("kv row d={d} pos={pos}: {w:.3} of the bound");
                    assert!(w <= 1.0);
                }
            }
            // Query heads: plain norm, rope (n_head rows per token).
            let x = scaled(pos as u64 + 2, ntok * nh * d, 2.0);
            let xb = GpuBuffer::from_slice(&gpu, "q", &x).unwrap();
            let spec = KvRowSpec { dim: d, norm: RowNorm::Plain, eps: cfg.rms_eps, freqs: rope.freqs(), qat: RowQat::None, rows: RowPos::Tokens { per_tok: nh, max_tokens: ntok as u32 } };
            let op = KvRow::new(&gpu, &xb, &spec).unwrap();
            run(&gpu, ntok, pos, |e| op.encode(e));
            let got = xb.read(&gpu, x.len()).unwrap();
            let mut want = x.clone();
            for (k, h) in want.chunks_mut(d).enumerate() {
                rms_norm(h, None, cfg.rms_eps);
                rope.apply(h, pos + k / nh, false);
            }
            let w = worst(&got, &want, 1e-5, 4e-6);
            eprintln!("query heads d={d} pos={pos}: {w:.3} of the bound");
            assert!(w <= 1.0);
            // Indexer query: no norm, rope, Hadamard + FP4.
            let x = scaled(pos as u64 + 3, ntok * ih * id, 1.0);
            let xb = GpuBuffer::from_slice(&gpu, "iq", &x).unwrap();
            let spec = KvRowSpec { dim: id, norm: RowNorm::None, eps: cfg.rms_eps, freqs: rope.freqs(), qat: RowQat::HadamardFp4, rows: RowPos::Tokens { per_tok: ih, max_tokens: ntok as u32 } };
            let op = KvRow::new(&gpu, &xb, &spec).unwrap();
            run(&gpu, ntok, pos, |e| op.encode(e));
            let got = xb.read(&gpu, x.len()).unwrap();
            let mut want = x.clone();
            for (k, h) in want.chunks_mut(id).enumerate() {
                rope.apply(h, pos + k / ih, false);
                qat::hadamard(h);
                qat::fp4_simulate(h, 32);
            }
            let flips = qat_flips(&got, &want, 1e-5, 1e-6, 0.51, 1e-6);
            eprintln!("indexer query pos={pos} fp4: {flips} of {} elements rounded the other way", got.len());
            assert!(flips <= 2, "{flips} FP4 flips");
        }
    }
}

/// Runs a compressor (and the row finishing of its closed windows) over `chunks` of consecutive
/// tokens on the device and through `compressor::push` on the CPU; returns the largest error of the
/// finished rows relative to the bound, and the FP flips.
fn compressor_case(gpu: &Gpu, cfg: &Config, ratio: usize, d: usize, qat_kind: RowQat, chunks: &[usize], wrong_ape: bool) -> (f64, usize) {
    let total: usize = chunks.iter().sum();
    let max_chunk = *chunks.iter().max().unwrap();
    let coff = if ratio == 4 { 2 } else { 1 };
    let w = coff * d;
    let rope = CpuRope::for_layer(cfg, ratio);
    let seed = (ratio * 1000 + d) as u64;
    let kv = scaled(seed, total * w, 1.0);
    let gate = scaled(seed + 1, total * w, 2.0);
    let ape = scaled(seed + 2, ratio * w, 0.5);
    let norm: Vec<f32> = scaled(seed + 3, d, 0.2).iter().map(|v| 1.0 + v).collect();
    let cap = compressed_capacity(total, ratio);

    let kb = GpuBuffer::new(gpu, "ck", max_chunk * w).unwrap();
    let gb = GpuBuffer::new(gpu, "cg", max_chunk * w).unwrap();
    let ab = GpuBuffer::from_slice(gpu, "ape", &ape).unwrap();
    let nb = GpuBuffer::from_slice(gpu, "norm", &norm).unwrap();
    let out = GpuBuffer::new(gpu, "comp", cap * d).unwrap();
    let comp = Compressor::new(gpu, &kb, &gb, &ab, &out, CompressorShape { ratio, d, max_tokens: max_chunk as u32, capacity: cap }).unwrap();
    let spec = KvRowSpec { dim: d, norm: RowNorm::Weighted(&nb), eps: cfg.rms_eps, freqs: rope.freqs(), qat: qat_kind, rows: RowPos::Windows { ratio, capacity: cap } };
    let fin = KvRow::new(gpu, &out, &spec).unwrap();

    // The injected mistake: the CPU adds the APE row of the next slot.
    let mut cpu_ape = ape.clone();
    if wrong_ape {
        cpu_ape.rotate_left(w);
    }
    let mut st = CompressorState::new(ratio, coff, d);
    let mut want = Vec::new();
    let mut row = vec![0f32; d];
    let mut pos = 0;
    for &n in chunks {
        kb.write(gpu, &kv[pos * w..(pos + n) * w]).unwrap();
        gb.write(gpu, &gate[pos * w..(pos + n) * w]).unwrap();
        run(gpu, n, pos, |e| {
            comp.encode(e)?;
            fin.encode(e)
        });
        for p in pos..pos + n {
            if compressor::push(&mut st, p, &kv[p * w..(p + 1) * w], &gate[p * w..(p + 1) * w], &cpu_ape, &norm, cfg.rms_eps, &rope, &mut row) {
                match qat_kind {
                    RowQat::Fp8 => qat::fp8_simulate(&mut row[..cfg.nope_dim()], 64),
                    RowQat::HadamardFp4 => {
                        qat::hadamard(&mut row);
                        qat::fp4_simulate(&mut row, 32);
                    }
                    RowQat::None => {}
                }
                want.extend_from_slice(&row);
            }
        }
        pos += n;
    }
    assert_eq!(want.len(), total / ratio * d);
    let got = out.read(gpu, want.len()).unwrap();
    // The frontier state is copied and summed, not computed: it matches bit for bit (-inf included).
    let sk = comp.st_kv.read(gpu, st.kv.len()).unwrap();
    let ss = comp.st_sc.read(gpu, st.score.len()).unwrap();
    assert!(sk.iter().zip(&st.kv).all(|(a, b)| a.to_bits() == b.to_bits()), "compressor kv state differs");
    assert!(wrong_ape || ss.iter().zip(&st.score).all(|(a, b)| a.to_bits() == b.to_bits()), "compressor score state differs");
    match qat_kind {
        RowQat::None => (worst(&got, &want, 1e-5, 1e-6), 0),
        RowQat::Fp8 => (0.0, qat_flips(&got, &want, 2e-5, 2e-6, 0.13, 1e-6)),
        RowQat::HadamardFp4 => (0.0, qat_flips(&got, &want, 2e-5, 2e-6, 0.51, 1e-6)),
    }
}

#[test]
fn compressor_matches_cpu_in_decode_steps_and_prefill_chunks() {
    let Some(gpu) = common::gpu(common::opts(false, None)) else { return };
    let cfg = tiny();
    let d = cfg.head_dim;
    // Ratio 4: decode steps closing windows, chunks ending mid-window and closing several.
    let c4 = [1, 1, 1, 1, 2, 3, 1, 1, 1, 7, 9, 1, 1, 1, 1, 5];
    // Ratio 128: a decode step closes window 0; a chunk closes window 1 mid-chunk; a chunk closes
    // window 2 (begun in the frontier) and window 3 (wholly its own) and ends mid-window.
    let c128 = [1, 125, 1, 1, 100, 40, 290];
    // One prefill chunk from position 0 (the first window has no previous one).
    for (ratio, dim, chunks) in [(4, d, &c4[..]), (4, cfg.idx_dim, &c4[..]), (128, d, &c128[..]), (4, d, &[37][..]), (128, d, &[300][..])] {
        let (w, _) = compressor_case(&gpu, &cfg, ratio, dim, RowQat::None, chunks, false);
        eprintln!("compressor ratio {ratio} d={dim} chunks {chunks:?}: {w:.3} of the bound");
        assert!(w <= 1.0, "ratio {ratio}: {w} x the bound");
    }
    let (_, f) = compressor_case(&gpu, &cfg, 4, d, RowQat::Fp8, &c4, false);
    eprintln!("compressor ratio 4 fp8: {f} flips");
    assert!(f <= 1);
    let (_, f) = compressor_case(&gpu, &cfg, 4, cfg.idx_dim, RowQat::HadamardFp4, &c4, false);
    eprintln!("compressor ratio 4 indexer fp4: {f} flips");
    assert!(f <= 1);
    let (_, f) = compressor_case(&gpu, &cfg, 128, d, RowQat::Fp8, &c128, false);
    eprintln!("compressor ratio 128 fp8: {f} flips");
    assert!(f <= 1);
    // The comparison catches an APE row off by one slot.
    for (ratio, chunks) in [(4, &c4[..]), (128, &c128[..])] {
        let (w, _) = compressor_case(&gpu, &cfg, ratio, d, RowQat::None, chunks, true);
        eprintln!("compressor ratio {ratio} with an injected mistake: {w:.1} x the bound");
        assert!(w > 10.0, "an injected mistake went unnoticed ({w})");
    }
}

/// A sorted random subset of size k of 0..n (what the indexer hands attention).
fn random_pick(seed: u64, n: usize, k: usize) -> Vec<u32> {
    let mut r = ds4_quant::random::SplitMix64(seed);
    let mut all: Vec<u32> = (0..n as u32).collect();
    for i in 0..k {
        let j = i + (r.next_u64() % (n - i) as u64) as usize;
        all.swap(i, j);
    }
    let mut s = all[..k].to_vec();
    s.sort_unstable();
    s
}

#[derive(Clone, Copy)]
struct AttnCase {
    d: usize,
    n_head: usize,
    swa: usize,
    ratio: usize,
    top_k: usize,
}

/// What the CPU reference may get wrong on purpose (to show the comparison catches it).
#[derive(Clone, Copy, PartialEq)]
enum Mistake {
    None,
    SinkOff,
    WindowShort,
}

/// Attention of every token of `steps` (consecutive chunks from position 0) on the device, with the
/// ring filled only by the op's own stores, against `attend_head` over the stage's candidate rows
/// (window from the history, then all compressed rows or the picks) and the inverse rotation.
/// Returns the largest error over all steps relative to rel 1e-5 / abs 1.5e-6: outputs are weighted
/// averages of rows of unit scale, each weight off by the device's exp (Vulkan allows 3 + 2|x| ulp),
/// and the inverse rotation adds ~3.5e-6 x the pair's magnitude.
fn attention_case(gpu: &Gpu, cfg: &Config, c: AttnCase, steps: &[usize], mistake: Mistake, expect_splits: Option<u32>) -> f64 {
    let AttnCase { d, n_head: nh, swa, ratio, top_k } = c;
    let total: usize = steps.iter().sum();
    let m = *steps.iter().max().unwrap();
    let rope = CpuRope::for_layer(cfg, ratio);
    let seed = (d * 7 + ratio * 131 + top_k) as u64;
    let hist = scaled(seed, total * d, 1.0);
    let qs = scaled(seed + 1, total * nh * d, 1.0);
    let sinks = scaled(seed + 2, nh, 1.0);
    let cap = compressed_capacity(total, ratio);
    let comp_rows = scaled(seed + 3, cap.max(1) * d, 1.0);

    let qb = GpuBuffer::new(gpu, "q", m * nh * d).unwrap();
    let kb = GpuBuffer::new(gpu, "kv", m * d).unwrap();
    let ring = GpuBuffer::new(gpu, "ring", swa * d).unwrap();
    let cb = GpuBuffer::from_slice(gpu, "comp", &comp_rows).unwrap();
    let sb = GpuBuffer::new(gpu, "sel", m * top_k.max(1)).unwrap();
    let sk = GpuBuffer::from_slice(gpu, "sinks", &sinks).unwrap();
    let ob = GpuBuffer::new(gpu, "o", m * nh * d).unwrap();
    let bufs = AttentionBuffers {
        q: &qb,
        kv: &kb,
        ring: &ring,
        comp: (ratio != 0).then_some(&cb),
        sel: (top_k != 0).then_some(&sb),
        sinks: &sk,
        o: &ob,
    };
    let shape = AttentionShape { n_head: nh, head_dim: d, swa, ratio, top_k, capacity: cap, max_tokens: m as u32 };
    let op = Attention::new(gpu, &bufs, shape, rope.freqs()).unwrap();
    let want_reduce = if gpu.caps().subgroup { ds4_wgpu::shaders::Reduce::Subgroup } else { ds4_wgpu::shaders::Reduce::Tree };
    assert_eq!(op.reduce, want_reduce);
    if let Some(want) = expect_splits {
        assert_eq!(op.splits(1), want, "decode splits");
    }

    let mut worst_all = 0f64;
    let mut scores = Vec::new();
    let mut pos = 0;
    for (si, &n) in steps.iter().enumerate() {
        let mut picks: Vec<Vec<u32>> = Vec::new();
        let mut sel_words = vec![0f32; n * top_k.max(1)];
        for i in 0..n {
            let nc = (pos + i + 1).checked_div(ratio).unwrap_or(0);
            let pk = if top_k != 0 && nc > top_k { random_pick(seed + 100 + (pos + i) as u64, nc, top_k) } else { Vec::new() };
            for (j, &r) in pk.iter().enumerate() {
                sel_words[i * top_k + j] = f32::from_bits(r);
            }
            picks.push(pk);
        }
        qb.write(gpu, &qs[pos * nh * d..(pos + n) * nh * d]).unwrap();
        kb.write(gpu, &hist[pos * d..(pos + n) * d]).unwrap();
        sb.write(gpu, &sel_words).unwrap();
        run(gpu, n, pos, |e| op.encode(e));
        let got = ob.read(gpu, n * nh * d).unwrap();

        let mut want = vec![0f32; n * nh * d];
        for i in 0..n {
            let p = pos + i;
            let nc = (p + 1).checked_div(ratio).unwrap_or(0);
            let mut lo = (p + 1).saturating_sub(swa);
            if mistake == Mistake::WindowShort && p + 1 >= swa {
                lo += 1;
            }
            for h in 0..nh {
                let raw = (lo..=p).map(|q| &hist[q * d..(q + 1) * d]);
                let comp: Vec<&[f32]> = if picks[i].is_empty() {
                    (0..nc).map(|r| &comp_rows[r * d..(r + 1) * d]).collect()
                } else {
                    picks[i].iter().map(|&r| &comp_rows[r as usize * d..(r as usize + 1) * d]).collect()
                };
                let rows = raw.chain(comp.iter().copied());
                let sink = sinks[h] + if mistake == Mistake::SinkOff { 0.25 } else { 0.0 };
                let out = &mut want[(i * nh + h) * d..(i * nh + h + 1) * d];
                let qh = &qs[((p * nh) + h) * d..((p * nh) + h + 1) * d];
                attend_head(qh, rows, sink, &mut scores, out);
                rope.apply(out, p, true);
            }
        }
        let w = worst(&got, &want, 1e-5, 1.5e-6);
        if mistake == Mistake::None && w > 1.0 {
            eprintln!("step {si} (pos {pos}, {n} tokens): {w:.3} of the bound");
        }
        worst_all = common::worse(worst_all, w);
        pos += n;
    }
    worst_all
}

#[test]
fn attention_matches_cpu_over_window_compressed_rows_and_picks() {
    attention_suite(false);
}

/// The same without SUBGROUP: tile scores by one thread per candidate.
#[test]
fn attention_fallback_matches_cpu() {
    attention_suite(true);
}

fn attention_suite(fallback: bool) {
    let Some(gpu) = common::gpu(common::opts(fallback, None)) else { return };
    if !fallback && !gpu.caps().subgroup {
        panic!("adapter {} has no SUBGROUP: the subgroup path cannot be tested here", gpu.caps().adapter);
    }
    let cfg = tiny();
    let (d, nh, swa) = (cfg.head_dim, cfg.n_head, cfg.swa);
    // Decode steps, a chunk crossing swa and the first indexer pick, a chunk longer than swa.
    let steps = [1, 1, 1, 5, 1, 30, 1, 1, 40, 1, 3];
    let long = [1, 100, 1, 30, 1, 2];
    let cases = [
        (AttnCase { d, n_head: nh, swa, ratio: 0, top_k: 0 }, &steps[..]),
        (AttnCase { d, n_head: nh, swa, ratio: 4, top_k: cfg.idx_topk }, &steps[..]),
        (AttnCase { d, n_head: nh, swa, ratio: 128, top_k: 0 }, &long[..]),
    ];
    for (c, st) in cases {
        let w = attention_case(&gpu, &cfg, c, st, Mistake::None, None);
        eprintln!("attention (fallback {fallback}) d={} ratio {} top-k {}: {w:.3} of the bound", c.d, c.ratio, c.top_k);
        assert!(w <= 1.0, "attention ratio {}: {w} x the bound", c.ratio);
    }
    // Flash's head width and window, ratio 4 with picks (top-k reduced so that picks start early).
    let fl = flash();
    let c = AttnCase { d: fl.head_dim, n_head: 2, swa: fl.swa, ratio: 4, top_k: 16 };
    // Decode steps split the 144 candidates over 9 workgroups (tiles of 16); so does the 6-token step.
    let w = attention_case(&gpu, &fl, c, &[1, 127, 1, 1, 64, 6], Mistake::None, Some(9));
    eprintln!("attention (fallback {fallback}) d=512 swa=128 ratio 4 top-k 16: {w:.3} of the bound");
    assert!(w <= 1.0);
    // 6 heads: a full and a partial group of 4; decode steps split the (at most 32 + 66) candidates in
    // 7, the 60-token chunk does not split.
    let c = AttnCase { d, n_head: 6, swa, ratio: 4, top_k: 0 };
    let w = attention_case(&gpu, &cfg, c, &[1, 200, 1, 1, 60], Mistake::None, Some(7));
    eprintln!("attention (fallback {fallback}) 6 heads, ratio 4 without an indexer, split: {w:.3} of the bound");
    assert!(w <= 1.0);
    // The comparison catches a wrong sink and a window one row short.
    let c = AttnCase { d, n_head: nh, swa, ratio: 4, top_k: cfg.idx_topk };
    for mistake in [Mistake::SinkOff, Mistake::WindowShort] {
        let w = attention_case(&gpu, &cfg, c, &steps, mistake, None);
        eprintln!("attention with an injected mistake: {w:.1} x the bound");
        assert!(w > 10.0, "an injected mistake went unnoticed ({w})");
    }
}

/// Indexer scores and picks of every token of `steps` (chunks starting at `pos0`) against
/// `indexer_scores` + `top_k_indices` on the same finished queries, weights and rows. Keys have
/// exact duplicates and zero rows, and odd tokens have negative head weights (their best score is
/// the 0 of many rows), so ties decide picks. Returns the worst score error relative to the bound.
fn indexer_case(gpu: &Gpu, ih: usize, id: usize, top_k: usize, pos0: usize, steps: &[usize]) -> f64 {
    let ratio = 4;
    let total: usize = pos0 + steps.iter().sum::<usize>();
    let m = *steps.iter().max().unwrap();
    let cap = compressed_capacity(total, ratio);
    let seed = (ih * 1000 + top_k) as u64;
    let mut keys = scaled(seed, cap * id, 1.0);
    for r in 0..cap {
        if r % 2 == 0 {
            keys[r * id..(r + 1) * id].fill(0.0);
        } else if r % 10 == 5 {
            keys.copy_within((r - 4) * id..(r - 3) * id, r * id);
        }
    }
    let qs = scaled(seed + 1, total * ih * id, 1.0);
    let mut ws = scaled(seed + 2, total * ih, 1.0);
    for (t, w) in ws.chunks_mut(ih).enumerate() {
        w.iter_mut().for_each(|v| *v = if t % 2 == 1 { -v.abs() } else { v.abs() });
    }
    let qb = GpuBuffer::new(gpu, "iq", m * ih * id).unwrap();
    let wb = GpuBuffer::new(gpu, "iw", m * ih).unwrap();
    let kb = GpuBuffer::from_slice(gpu, "keys", &keys).unwrap();
    let scb = GpuBuffer::new(gpu, "scores", m * cap).unwrap();
    let sb = GpuBuffer::new(gpu, "sel", m * top_k).unwrap();
    let bufs = IndexerBuffers { q: &qb, w: &wb, keys: &kb, scores: &scb, sel: &sb };
    let op = Indexer::new(gpu, &bufs, IndexerShape { heads: ih, dim: id, ratio, top_k, capacity: cap, max_tokens: m as u32 }).unwrap();
    let wscale = 1.0 / ((id * ih) as f32).sqrt();
    let sentinel = f32::from_bits(u32::MAX);
    let (mut want_s, mut scratch, mut want_sel, mut from_gpu) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut worst_all = 0f64;
    let mut pos = pos0;
    for &n in steps {
        qb.write(gpu, &qs[pos * ih * id..(pos + n) * ih * id]).unwrap();
        wb.write(gpu, &ws[pos * ih..(pos + n) * ih]).unwrap();
        sb.write(gpu, &vec![sentinel; n * top_k]).unwrap();
        run(gpu, n, pos, |e| op.encode(e));
        let got_s = scb.read(gpu, n * cap).unwrap();
        let got_sel: Vec<u32> = sb.read(gpu, n * top_k).unwrap().iter().map(|v| v.to_bits()).collect();
        for i in 0..n {
            let p = pos + i;
            let nc = (p + 1) / ratio;
            let sel = &got_sel[i * top_k..(i + 1) * top_k];
            if nc <= top_k {
                assert!(sel.iter().all(|&v| v == u32::MAX), "token at {p} with {nc} rows was given picks");
                continue;
            }
            let wh: Vec<f32> = ws[p * ih..(p + 1) * ih].iter().map(|v| v * wscale).collect();
            indexer_scores(&qs[p * ih * id..(p + 1) * ih * id], &wh, &keys, id, nc, &mut want_s);
            let gs = &got_s[i * cap..i * cap + nc];
            // Sums of ih relu'd dots of id products: bound 1e-5 x sum |w_h| |q_h| |k| (~ the terms' scale).
            let scale: f32 = wh.iter().map(|w| w.abs()).sum::<f32>() * (id as f32).sqrt();
            worst_all = common::worse(worst_all, worst(gs, &want_s, 0.0, 1e-5 * scale as f64));
            // The picks are exactly top_k_indices of the device's scores, and of the CPU's.
            top_k_indices(gs, top_k, &mut scratch, &mut from_gpu);
            assert_eq!(sel, &from_gpu[..], "token at {p}: picks differ from top_k_indices of the device scores");
            top_k_indices(&want_s, top_k, &mut scratch, &mut want_sel);
            assert_eq!(sel, &want_sel[..], "token at {p}: picks differ from the CPU's");
        }
        pos += n;
    }
    worst_all
}

/// Picks among heavy ties across several 256-candidate chunks: one head of 8 whose query is the
/// first unit vector, so a row's score is w x its first value, drawn from {0, 1, 2, 3} (and the
/// weight's sign flips the order). Picks must equal `top_k_indices` of the CPU scores exactly.
#[test]
fn top_k_breaks_heavy_ties_by_the_lowest_index() {
    let Some(gpu) = common::gpu(common::opts(false, None)) else { return };
    let (ih, id, ratio, top_k, pos) = (1, 8, 4, 37, 2399);
    let cap = compressed_capacity(pos + 2, ratio);
    let mut r = ds4_quant::random::SplitMix64(3);
    let keys: Vec<f32> = (0..cap * id).map(|i| if i % id == 0 { (r.next_u64() % 4) as f32 } else { 1.0 }).collect();
    let mut q = vec![0f32; 2 * id];
    q[0] = 1.0;
    q[id] = 1.0;
    let w = [1.0f32, -1.0];
    let (qb, wb, kb) = (GpuBuffer::from_slice(&gpu, "iq", &q).unwrap(), GpuBuffer::from_slice(&gpu, "iw", &w).unwrap(), GpuBuffer::from_slice(&gpu, "keys", &keys).unwrap());
    let (scb, sb) = (GpuBuffer::new(&gpu, "scores", 2 * cap).unwrap(), GpuBuffer::new(&gpu, "sel", 2 * top_k).unwrap());
    let op = Indexer::new(&gpu, &IndexerBuffers { q: &qb, w: &wb, keys: &kb, scores: &scb, sel: &sb }, IndexerShape { heads: ih, dim: id, ratio, top_k, capacity: cap, max_tokens: 2 }).unwrap();
    run(&gpu, 2, pos, |e| op.encode(e));
    let got: Vec<u32> = sb.read(&gpu, 2 * top_k).unwrap().iter().map(|v| v.to_bits()).collect();
    let wscale = 1.0 / ((id * ih) as f32).sqrt();
    let (mut sc, mut scratch, mut want) = (Vec::new(), Vec::new(), Vec::new());
    for t in 0..2 {
        let nc = (pos + t + 1) / ratio;
        indexer_scores(&q[t * id..(t + 1) * id], &[w[t] * wscale], &keys, id, nc, &mut sc);
        top_k_indices(&sc, top_k, &mut scratch, &mut want);
        assert_eq!(&got[t * top_k..(t + 1) * top_k], &want[..], "token {t}");
    }
}

#[test]
fn indexer_scores_and_picks_match_cpu() {
    let Some(gpu) = common::gpu(common::opts(false, None)) else { return };
    let cfg = tiny();
    // Tiny: picks start at position 35 (9 rows > top-k 8); decode steps, then a chunk in which the
    // first tokens have no picks and the later ones do.
    let w = indexer_case(&gpu, cfg.idx_heads, cfg.idx_dim, cfg.idx_topk, 0, &[1, 1, 30, 1, 1, 20, 1]);
    eprintln!("indexer tiny: scores at {w:.3} of the bound");
    assert!(w <= 1.0);
    // Flash's indexer (64 heads of 128, top-k 512) past 512 rows: a decode step and a chunk.
    let fl = flash();
    let w = indexer_case(&gpu, fl.idx_heads, fl.idx_dim, fl.idx_topk, 2398, &[1, 1, 5]);
    eprintln!("indexer flash: scores at {w:.3} of the bound");
    assert!(w <= 1.0);
}

/// The grouped low-rank output projection (`attn_output_a`, Q8_0 as in the released files): group g's
/// rows take heads [g * hpg, (g + 1) * hpg) of o, as the stage's per-group matmul does. Against the
/// dequantized weights dotted in f64, bound 1e-5 x sum |w_i x_i| (as ops_matvec), with the tensor
/// split into bindings of 48 rows so that a binding ends inside a group.
#[test]
fn grouped_output_projection_matches_per_group_products() {
    let cfg = tiny();
    let (g, hpg, d, ol) = (cfg.o_groups, cfg.heads_per_group(), cfg.head_dim, cfg.o_lora);
    let (gin, rows) = (hpg * d, cfg.o_groups * cfg.o_lora);
    let ty = GgmlType::Q8_0;
    let row_bytes = ty.row_bytes(gin).unwrap();
    let Some(gpu) = common::gpu(common::opts(false, Some(row_bytes as u64 * 48 + 4))) else { return };
    let w = ds4_quant::random_valid_blocks(ty, 5, rows * gin / ty.block_elems());
    let t = ResidentTensor::upload(&gpu, "attn_output_a", ty, &w, rows, gin).unwrap();
    assert!(t.parts.len() >= 3);
    let mut deq = vec![0f32; rows * gin];
    ds4_quant::dequantize(ty, &w, &mut deq).unwrap();
    let qd = cfg.q_dim();
    for (kind, ntok) in [(Product::Vec, 1), (Product::Batched { max_tokens: 6 }, 5)] {
        let x = scaled(40 + ntok as u64, ntok * qd, 1.0);
        let xb = GpuBuffer::new(&gpu, "o", 6 * qd).unwrap();
        xb.write(&gpu, &x).unwrap();
        let yb = GpuBuffer::new(&gpu, "low", 6 * rows).unwrap();
        let op = MatVec::grouped(&gpu, &t, &xb, &yb, kind, ol, qd).unwrap();
        run(&gpu, ntok, 0, |e| op.encode(e));
        let y = yb.read(&gpu, ntok * rows).unwrap();
        let mut worst_r = 0f64;
        for i in 0..ntok {
            for r in 0..rows {
                let xin = &x[i * qd + (r / ol) * gin..i * qd + (r / ol + 1) * gin];
                let wr = &deq[r * gin..(r + 1) * gin];
                let want: f64 = wr.iter().zip(xin).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = wr.iter().zip(xin).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                worst_r = common::worse(worst_r, (y[i * rows + r] as f64 - want).abs() / (1e-5 * mag));
            }
        }
        eprintln!("grouped projection ({g} groups, {ntok} tokens): {worst_r:.4} of the bound");
        assert!(worst_r <= 1.0);
    }
    // Groups that do not tile the rows, or inputs narrower than the groups, are refused.
    let xb = GpuBuffer::new(&gpu, "o", qd).unwrap();
    let yb = GpuBuffer::new(&gpu, "low", rows).unwrap();
    assert!(MatVec::grouped(&gpu, &t, &xb, &yb, Product::Vec, ol + 1, qd).is_err());
    assert!(MatVec::grouped(&gpu, &t, &xb, &yb, Product::Vec, ol, qd - 4).is_err());
}

/// One ratio-4 layer's attention block from the projections to `o`, composed from the ops over
/// shared buffers as a backend would (query / KV rows, both compressors and their row finishing,
/// the indexer query, the indexer, attention), with QAT on, in decode steps and prefill chunks
/// past swa and past top-k; against the CPU stage's sequence of the same functions. Nothing is
/// uploaded, bound, compiled or allocated per step.
#[test]
fn composed_ratio4_attention_block_matches_cpu_stage_sequence() {
    let Some(gpu) = common::gpu(common::opts(false, None)) else { return };
    let cfg = tiny();
    let (d, nh, swa, id, ih, topk, eps) = (cfg.head_dim, cfg.n_head, cfg.swa, cfg.idx_dim, cfg.idx_heads, cfg.idx_topk, cfg.rms_eps);
    let ratio = 4;
    let steps = [1, 1, 1, 5, 1, 30, 1, 1, 40, 1, 3];
    let total: usize = steps.iter().sum();
    let m = *steps.iter().max().unwrap();
    let cap = compressed_capacity(total, ratio);
    let rope = CpuRope::for_layer(&cfg, ratio);
    let unit = |seed, n| -> Vec<f32> { scaled(seed, n, 0.2).iter().map(|v| 1.0 + v).collect() };
    // Per-token projections and the layer's weights.
    let (q_in, kv_in) = (scaled(1, total * nh * d, 2.0), scaled(2, total * d, 2.0));
    let (ck, cg) = (scaled(3, total * 2 * d, 1.0), scaled(4, total * 2 * d, 2.0));
    let (ik, ig) = (scaled(5, total * 2 * id, 1.0), scaled(6, total * 2 * id, 2.0));
    let (iq_in, iw_in) = (scaled(7, total * ih * id, 1.0), scaled(8, total * ih, 1.0));
    let (kv_norm, c_norm, i_norm) = (unit(9, d), unit(10, d), unit(11, id));
    let (c_ape, i_ape) = (scaled(12, ratio * 2 * d, 0.5), scaled(13, ratio * 2 * id, 0.5));
    let sinks = scaled(14, nh, 1.0);

    let buf = |name: &str, n: usize| GpuBuffer::new(&gpu, name, n).unwrap();
    let fixed = |name: &str, v: &[f32]| GpuBuffer::from_slice(&gpu, name, v).unwrap();
    let (qb, kb, ckb, cgb, ikb, igb, iqb, iwb) = (buf("q", m * nh * d), buf("kv", m * d), buf("ck", m * 2 * d), buf("cg", m * 2 * d), buf("ik", m * 2 * id), buf("ig", m * 2 * id), buf("iq", m * ih * id), buf("iw", m * ih));
    let (ring, compb, idxb, scb, selb, ob) = (buf("ring", swa * d), buf("comp", cap * d), buf("idx", cap * id), buf("scores", m * cap), buf("sel", m * topk), buf("o", m * nh * d));
    let (kvn, cn, inn, cape, iape, sk) = (fixed("kv norm", &kv_norm), fixed("c norm", &c_norm), fixed("i norm", &i_norm), fixed("c ape", &c_ape), fixed("i ape", &i_ape), fixed("sinks", &sinks));
    let tokens = |per_tok| RowPos::Tokens { per_tok, max_tokens: m as u32 };
    let windows = RowPos::Windows { ratio, capacity: cap };
    let fr = rope.freqs();
    let spec = |dim, norm, qat, rows| KvRowSpec { dim, norm, eps, freqs: fr, qat, rows };
    let q_row = KvRow::new(&gpu, &qb, &spec(d, RowNorm::Plain, RowQat::None, tokens(nh))).unwrap();
    let kv_row = KvRow::new(&gpu, &kb, &spec(d, RowNorm::Weighted(&kvn), RowQat::Fp8, tokens(1))).unwrap();
    let comp = Compressor::new(&gpu, &ckb, &cgb, &cape, &compb, CompressorShape { ratio, d, max_tokens: m as u32, capacity: cap }).unwrap();
    let comp_fin = KvRow::new(&gpu, &compb, &spec(d, RowNorm::Weighted(&cn), RowQat::Fp8, windows)).unwrap();
    let icomp = Compressor::new(&gpu, &ikb, &igb, &iape, &idxb, CompressorShape { ratio, d: id, max_tokens: m as u32, capacity: cap }).unwrap();
    let icomp_fin = KvRow::new(&gpu, &idxb, &spec(id, RowNorm::Weighted(&inn), RowQat::HadamardFp4, windows)).unwrap();
    let iq_row = KvRow::new(&gpu, &iqb, &spec(id, RowNorm::None, RowQat::HadamardFp4, tokens(ih))).unwrap();
    let indexer = Indexer::new(&gpu, &IndexerBuffers { q: &iqb, w: &iwb, keys: &idxb, scores: &scb, sel: &selb }, IndexerShape { heads: ih, dim: id, ratio, top_k: topk, capacity: cap, max_tokens: m as u32 }).unwrap();
    let bufs = AttentionBuffers { q: &qb, kv: &kb, ring: &ring, comp: Some(&compb), sel: Some(&selb), sinks: &sk, o: &ob };
    let attn = Attention::new(&gpu, &bufs, AttentionShape { n_head: nh, head_dim: d, swa, ratio, top_k: topk, capacity: cap, max_tokens: m as u32 }, fr).unwrap();
    let loaded = gpu.counters();

    // CPU state: raw rows by position, compressor states, compressed and indexer rows.
    let (mut hist, mut crows, mut irows) = (Vec::new(), Vec::new(), Vec::new());
    let mut cst = CompressorState::new(ratio, 2, d);
    let mut ist = CompressorState::new(ratio, 2, id);
    let (mut row, mut irow) = (vec![0f32; d], vec![0f32; id]);
    let (mut scores, mut scratch, mut sel) = (Vec::new(), Vec::new(), Vec::new());
    let wscale = 1.0 / ((id * ih) as f32).sqrt();
    let mut worst_all = 0f64;
    let mut pos = 0;
    for &n in &steps {
        let sl = |v: &[f32], w: usize| v[pos * w..(pos + n) * w].to_vec();
        for (b, v, w) in [(&qb, &q_in, nh * d), (&kb, &kv_in, d), (&ckb, &ck, 2 * d), (&cgb, &cg, 2 * d), (&ikb, &ik, 2 * id), (&igb, &ig, 2 * id), (&iqb, &iq_in, ih * id), (&iwb, &iw_in, ih)] {
            b.write(&gpu, &sl(v, w)).unwrap();
        }
        run(&gpu, n, pos, |e| {
            q_row.encode(e)?;
            kv_row.encode(e)?;
            comp.encode(e)?;
            comp_fin.encode(e)?;
            icomp.encode(e)?;
            icomp_fin.encode(e)?;
            iq_row.encode(e)?;
            indexer.encode(e)?;
            attn.encode(e)
        });
        let got = ob.read(&gpu, n * nh * d).unwrap();

        let mut want = vec![0f32; n * nh * d];
        for i in 0..n {
            let p = pos + i;
            let mut r = kv_in[p * d..(p + 1) * d].to_vec();
            rms_norm(&mut r, Some(&kv_norm), eps);
            rope.apply(&mut r, p, false);
            qat::fp8_simulate(&mut r[..cfg.nope_dim()], 64);
            hist.extend_from_slice(&r);
            if compressor::push(&mut cst, p, &ck[p * 2 * d..(p + 1) * 2 * d], &cg[p * 2 * d..(p + 1) * 2 * d], &c_ape, &c_norm, eps, &rope, &mut row) {
                qat::fp8_simulate(&mut row[..cfg.nope_dim()], 64);
                crows.extend_from_slice(&row);
            }
            if compressor::push(&mut ist, p, &ik[p * 2 * id..(p + 1) * 2 * id], &ig[p * 2 * id..(p + 1) * 2 * id], &i_ape, &i_norm, eps, &rope, &mut irow) {
                qat::hadamard(&mut irow);
                qat::fp4_simulate(&mut irow, 32);
                irows.extend_from_slice(&irow);
            }
            let nc = crows.len() / d;
            assert_eq!(nc, (p + 1) / ratio);
            let picked = nc > topk;
            if picked {
                let mut iq = iq_in[p * ih * id..(p + 1) * ih * id].to_vec();
                for h in iq.chunks_mut(id) {
                    rope.apply(h, p, false);
                    qat::hadamard(h);
                    qat::fp4_simulate(h, 32);
                }
                let wh: Vec<f32> = iw_in[p * ih..(p + 1) * ih].iter().map(|v| v * wscale).collect();
                indexer_scores(&iq, &wh, &irows, id, nc, &mut scores);
                top_k_indices(&scores, topk, &mut scratch, &mut sel);
            }
            for h in 0..nh {
                let mut qh = q_in[(p * nh + h) * d..(p * nh + h + 1) * d].to_vec();
                rms_norm(&mut qh, None, eps);
                rope.apply(&mut qh, p, false);
                let raw = ((p + 1).saturating_sub(swa)..=p).map(|q| &hist[q * d..(q + 1) * d]);
                let ids: Vec<usize> = if picked { sel.iter().map(|&r| r as usize).collect() } else { (0..nc).collect() };
                let rows = raw.chain(ids.iter().map(|&r| &crows[r * d..(r + 1) * d]));
                let out = &mut want[(i * nh + h) * d..(i * nh + h + 1) * d];
                attend_head(&qh, rows, sinks[h], &mut scores, out);
                rope.apply(out, p, true);
            }
        }
        worst_all = common::worse(worst_all, worst(&got, &want, 1e-5, 1.5e-6));
        pos += n;
    }
    eprintln!("composed ratio-4 attention block: {worst_all:.3} of the bound");
    assert!(worst_all <= 1.0, "{worst_all} x the bound");
    let after = gpu.counters();
    assert_eq!(
        (after.weight_uploads, after.bind_groups, after.pipelines, after.buffers),
        (loaded.weight_uploads, loaded.bind_groups, loaded.pipelines, loaded.buffers),
        "something was uploaded, bound, compiled or allocated per step"
    );
    assert_eq!(after.step_writes - loaded.step_writes, steps.len() as u64);
}

/// Shapes the kernels cannot take and steps past what an op was built for are errors, not panics
/// or out-of-bounds writes.
#[test]
fn attention_ops_refuse_bad_shapes_and_steps() {
    let Some(gpu) = common::gpu(common::opts(false, None)) else { return };
    let cfg = tiny();
    let rope = CpuRope::for_layer(&cfg, 4);
    let b = |n| GpuBuffer::new(&gpu, "b", n).unwrap();
    let (q, kv, ring, comp, sel, sinks, o) = (b(2 * 4 * 1024), b(2 * 1024), b(32 * 1024), b(10 * 1024), b(2 * 8), b(4), b(2 * 4 * 1024));
    let bufs = AttentionBuffers { q: &q, kv: &kv, ring: &ring, comp: Some(&comp), sel: Some(&sel), sinks: &sinks, o: &o };
    let shape = AttentionShape { n_head: 4, head_dim: 128, swa: 32, ratio: 4, top_k: 8, capacity: 10, max_tokens: 2 };
    // Head wider than the kernel's workgroup copy; a selection without compressed rows.
    assert!(Attention::new(&gpu, &bufs, AttentionShape { head_dim: 1024, ..shape }, rope.freqs()).is_err());
    assert!(Attention::new(&gpu, &AttentionBuffers { comp: None, ..bufs }, shape, rope.freqs()).is_err());
    let op = Attention::new(&gpu, &AttentionBuffers { q: &q, kv: &kv, ring: &ring, comp: Some(&comp), sel: Some(&sel), sinks: &sinks, o: &o }, shape, rope.freqs()).unwrap();
    // More tokens than built for; more compressed rows than the capacity (43 / 4 = 10 is the last fit).
    assert!(gpu.run(Step { ntok: 3, pos: 0 }, |e| op.encode(e)).is_err());
    assert!(gpu.run(Step { ntok: 1, pos: 42 }, |e| op.encode(e)).is_ok());
    assert!(gpu.run(Step { ntok: 1, pos: 43 }, |e| op.encode(e)).is_err());
    // The compressor and the finishing of its rows check the capacity too.
    let (ck, ape, out) = (b(2 * 256), b(4 * 256), b(10 * 128));
    let c = Compressor::new(&gpu, &ck, &ck, &ape, &out, CompressorShape { ratio: 4, d: 128, max_tokens: 2, capacity: 10 }).unwrap();
    assert!(gpu.run(Step { ntok: 2, pos: 42 }, |e| c.encode(e)).is_err());
    assert!(Compressor::new(&gpu, &ck, &ck, &ape, &out, CompressorShape { ratio: 4, d: 128, max_tokens: 2, capacity: 11 }).is_err());
    let spec = KvRowSpec { dim: 128, norm: RowNorm::Plain, eps: 1e-6, freqs: rope.freqs(), qat: RowQat::Fp8, rows: RowPos::Windows { ratio: 4, capacity: 10 } };
    let fin = KvRow::new(&gpu, &out, &spec).unwrap();
    assert!(gpu.run(Step { ntok: 1, pos: 43 }, |e| fin.encode(e)).is_err());
    // A Hadamard row must be a power of two; rows wider than the kernel's copy are refused.
    assert!(KvRow::new(&gpu, &out, &KvRowSpec { dim: 96, qat: RowQat::HadamardFp4, ..spec }).is_err());
    assert!(KvRow::new(&gpu, &b(2048), &KvRowSpec { dim: 2048, rows: RowPos::Windows { ratio: 4, capacity: 1 }, ..spec }).is_err());
    // The indexer needs a score row per token as wide as the capacity.
    let (iq, iw, keys, scores) = (b(2 * 16 * 128), b(2 * 16), b(10 * 128), b(2 * 9));
    let ib = IndexerBuffers { q: &iq, w: &iw, keys: &keys, scores: &scores, sel: &sel };
    assert!(Indexer::new(&gpu, &ib, IndexerShape { heads: 16, dim: 128, ratio: 4, top_k: 8, capacity: 10, max_tokens: 2 }).is_err());
}

/// A short multi-token step (an MTP verify of 1 + k tokens, a rollback's re-run) gives each token the
/// attention output of a one-token decode step at its position, bit for bit, at Flash's shape (64
/// heads of 512, ratio 4 with 512 picks out of 525 compressed rows: 640 candidates, split over
/// workgroups), and leaves the same ring. Greedy output with MTP is the plain output only if so.
#[test]
fn short_steps_attend_as_decode_steps_bit_for_bit() {
    let Some(gpu) = common::gpu(common::opts(false, None)) else { return };
    let fl = flash();
    let (nh, d, swa, ratio, top_k) = (fl.n_head, fl.head_dim, fl.swa, 4, fl.idx_topk);
    let (pos, n) = (2100usize, 3usize);
    let cap = compressed_capacity(pos + n, ratio);
    let rope = CpuRope::for_layer(&fl, ratio);
    let ring0 = scaled(901, swa * d, 1.0);
    let comp = scaled(902, cap * d, 1.0);
    let qs = scaled(903, n * nh * d, 1.0);
    let kvs = scaled(904, n * d, 1.0);
    let sinks = scaled(905, nh, 1.0);
    let mut sel_words = vec![0f32; n * top_k];
    for i in 0..n {
        for (j, r) in random_pick(906 + i as u64, (pos + i + 1) / ratio, top_k).into_iter().enumerate() {
            sel_words[i * top_k + j] = f32::from_bits(r);
        }
    }
    let mut outs = Vec::new();
    let mut rings = Vec::new();
    for steps in [vec![n], vec![1; n]] {
        let qb = GpuBuffer::new(&gpu, "q", n * nh * d).unwrap();
        let kb = GpuBuffer::new(&gpu, "kv", n * d).unwrap();
        let ring = GpuBuffer::from_slice(&gpu, "ring", &ring0).unwrap();
        let cb = GpuBuffer::from_slice(&gpu, "comp", &comp).unwrap();
        let sb = GpuBuffer::new(&gpu, "sel", n * top_k).unwrap();
        let sk = GpuBuffer::from_slice(&gpu, "sinks", &sinks).unwrap();
        let ob = GpuBuffer::new(&gpu, "o", n * nh * d).unwrap();
        let bufs = AttentionBuffers { q: &qb, kv: &kb, ring: &ring, comp: Some(&cb), sel: Some(&sb), sinks: &sk, o: &ob };
        let shape = AttentionShape { n_head: nh, head_dim: d, swa, ratio, top_k, capacity: cap, max_tokens: n as u32 };
        let op = Attention::new(&gpu, &bufs, shape, rope.freqs()).unwrap();
        assert!(op.splits(1) > 1, "decode steps split the candidates");
        let mut out = Vec::new();
        let mut t0 = 0;
        for m in steps {
            qb.write(&gpu, &qs[t0 * nh * d..(t0 + m) * nh * d]).unwrap();
            kb.write(&gpu, &kvs[t0 * d..(t0 + m) * d]).unwrap();
            sb.write(&gpu, &sel_words[t0 * top_k..(t0 + m) * top_k]).unwrap();
            run(&gpu, m, pos + t0, |e| op.encode(e));
            out.extend(ob.read(&gpu, m * nh * d).unwrap().iter().map(|v| v.to_bits()));
            t0 += m;
        }
        outs.push(out);
        rings.push(ring.read(&gpu, swa * d).unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }
    assert!(outs[0] == outs[1], "a {n}-token step's attention differs from {n} decode steps");
    assert!(rings[0] == rings[1], "the ring after a {n}-token step differs from {n} decode steps");
}
