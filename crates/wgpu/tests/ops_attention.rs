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
/// error that scales with the pair's magnitude, not the element's: they use abs = rel.
fn worst(got: &[f32], want: &[f32], rel: f64, abs: f64) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).map(|(&a, &b)| ((a - b).abs() as f64) / (rel * (b.abs() as f64) + abs)).fold(0.0, f64::max)
}

/// Elements of a QAT'd row set outside the fine bound (a value that sits on a rounding boundary can
/// round the other way after an f32 difference upstream), each checked to be at most one grid step
/// (`step_rel` of the larger magnitude, plus the block's smallest step `floor`).
fn qat_flips(got: &[f32], want: &[f32], rel: f64, abs: f64, step_rel: f64, floor: f64) -> usize {
    let mut flips = 0;
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        let err = (a - b).abs() as f64;
        if err > rel * b.abs() as f64 + abs {
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
                    let w = worst(&got, want, 1e-5, 1e-5);
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
            let w = worst(&got, &want, 1e-5, 1e-5);
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
fn compressor_case(gpu: &Gpu, cfg: &Config, ratio: usize, d: usize, qat_kind: RowQat, chunks: &[usize]) -> (f64, usize) {
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
            if compressor::push(&mut st, p, &kv[p * w..(p + 1) * w], &gate[p * w..(p + 1) * w], &ape, &norm, cfg.rms_eps, &rope, &mut row) {
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
    assert!(ss.iter().zip(&st.score).all(|(a, b)| a.to_bits() == b.to_bits()), "compressor score state differs");
    match qat_kind {
        RowQat::None => (worst(&got, &want, 2e-5, 2e-6), 0),
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
    // Ratio 128: a decode step closes window 0, a chunk closes window 1 mid-chunk.
    let c128 = [1, 125, 1, 1, 100, 28, 44];
    for (ratio, dim, chunks) in [(4, d, &c4[..]), (4, cfg.idx_dim, &c4[..]), (128, d, &c128[..])] {
        let (w, _) = compressor_case(&gpu, &cfg, ratio, dim, RowQat::None, chunks);
        eprintln!("compressor ratio {ratio} d={dim}: {w:.3} of the bound");
        assert!(w <= 1.0, "ratio {ratio}: {w} x the bound");
    }
    let (_, f) = compressor_case(&gpu, &cfg, 4, d, RowQat::Fp8, &c4);
    eprintln!("compressor ratio 4 fp8: {f} flips");
    assert!(f <= 1);
    let (_, f) = compressor_case(&gpu, &cfg, 4, cfg.idx_dim, RowQat::HadamardFp4, &c4);
    eprintln!("compressor ratio 4 indexer fp4: {f} flips");
    assert!(f <= 1);
    let (_, f) = compressor_case(&gpu, &cfg, 128, d, RowQat::Fp8, &c128);
    eprintln!("compressor ratio 128 fp8: {f} flips");
    assert!(f <= 1);
}
