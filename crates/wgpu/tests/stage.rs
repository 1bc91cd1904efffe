//! The whole stage on the test adapter (lavapipe in CI) against the CPU stage: tiny synthetic q2 and
//! q4 models in the ds4 layout, prefill (one chunk, several chunks), 32 greedy decode steps, the
//! device pick, rewind to the prefill snapshot, the KV state through the host and back, nothing
//! allocated or bound per step, and bad steps refused. The CPU runs `Precision::Exact` (dequantized
//! weights, f64 dots); the GPU sums in f32.
mod common;

use std::sync::Arc;

use ds4_gguf::GgufFile;
use ds4_model::memplan::ChunkFit;
use ds4_model::synth::{self, Mix, SynthSpec};
use ds4_model::{Config, LayerRange, Logits, Options, Stage, Weights};
use ds4_quant::Precision;
use ds4_wgpu::{GpuOptions, WgpuStage};

/// Weights where the stage reads them: the file's own mapping (`copied` false: a unified-memory
/// adapter wraps them without a copy) or a copy in memory (uploaded).
fn load(mix: Mix, seed: u64, qat: bool) -> Stage {
    load_as(mix, seed, qat, false)
}

fn load_as(mix: Mix, seed: u64, qat: bool, copied: bool) -> Stage {
    let dir = std::env::temp_dir().join(format!("ds4-wgpu-stage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("tiny-{mix:?}-{seed}.gguf"));
    if !path.exists() {
        // Tests run in parallel: each writes its own file, the rename publishes it whole.
        let tmp = dir.join(format!("tiny-{mix:?}-{seed}.{:?}.part", std::thread::current().id()));
        synth::write(&SynthSpec { shape: "tiny", mix, seed, layers: None, vocab: None }, &tmp, |_, _| {}).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    let f = Arc::new(GgufFile::open(&path).unwrap());
    let cfg = Config::from_gguf(&f).unwrap();
    let w = if copied { Weights::bind_mapped(f, &path, &cfg, LayerRange::full(&cfg)).unwrap() } else { Weights::bind(f, &cfg, LayerRange::full(&cfg)).unwrap() };
    Stage::new(cfg, w, Options { precision: Precision::Exact, qat })
}

/// The device with the prefill products in f32 (no cooperative matrices: their f16 inputs are
/// checked by `prefill_on_cooperative_matrices_matches_cpu`, not against the 1e-5 bound).
fn opts() -> Option<GpuOptions> {
    let o = GpuOptions { disable: ds4_wgpu::wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX, ..GpuOptions::default() };
    // Probe first: with DS4_WGPU_SKIP=1 and no adapter the test is skipped.
    common::gpu(o.clone()).map(|_| o)
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let m = b.iter().fold(0f64, |m, &v| m.max(v.abs() as f64));
    a.iter().zip(b).fold(0f64, |w, (&x, &y)| common::worse(w, (x as f64 - y as f64).abs())) / m
}

fn argmax(l: &[f32]) -> u32 {
    l.iter().enumerate().fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32
}

fn prompt(cfg: &Config, n: usize) -> Vec<u32> {
    let v = cfg.n_vocab as u32;
    (0..n as u32).map(|i| ((i * 2654435761u32) >> 7) % v).collect()
}

/// Greedy decoding on both; returns (cpu tokens, gpu tokens, worst relative logits error).
fn compare(cpu: &mut Stage, gpu: &mut WgpuStage, prompt: &[u32], chunk: usize, steps: usize, ctx: usize) -> (Vec<u32>, Vec<u32>, f64) {
    let (mut kc, mut kg) = (cpu.new_kv(ctx), cpu.new_kv(ctx));
    let (mut lc, mut lg) = (Vec::new(), Vec::new());
    let mut worst = 0f64;
    for c in prompt.chunks(chunk) {
        lc = cpu.forward(&mut kc, c, None, Logits::Last).unwrap().to_vec();
        lg = gpu.forward(&mut kg, c, None, Logits::Last).unwrap().to_vec();
        worst = common::worse(worst, rel_err(&lg, &lc));
    }
    let (mut tc, mut tg) = (Vec::new(), Vec::new());
    let counters = gpu.ops.gpu().counters();
    for _ in 0..steps {
        let (a, b) = (argmax(&lc), argmax(&lg));
        tc.push(a);
        tg.push(b);
        lc = cpu.forward(&mut kc, &[a], None, Logits::Last).unwrap().to_vec();
        lg = gpu.forward(&mut kg, &[b], None, Logits::Last).unwrap().to_vec();
        if a == b {
            worst = common::worse(worst, rel_err(&lg, &lc));
        }
    }
    let after = gpu.ops.gpu().counters();
    assert_eq!(
        (after.weight_uploads, after.bind_groups, after.pipelines, after.buffers),
        (counters.weight_uploads, counters.bind_groups, counters.pipelines, counters.buffers),
        "a decode step uploaded, bound, compiled or allocated something"
    );
    assert_eq!(after.step_writes - counters.step_writes, steps as u64, "one step uniform per decode step");
    (tc, tg, worst)
}

/// Measured on lavapipe: 1.0e-6 (q2, with and without QAT) and 4.2e-6 (q4) of the largest logit;
/// f32 sums against the CPU's f64 dots over the layers and the head. Injected mistakes fail it:
/// the KV row without its FP8 simulation (QAT on): 21/32 tokens, 3.2e-1; the query heads without
/// their RMS norm: 3/32 tokens, 2.5e-1 (tiny q2).
const LOGITS_BOUND: f64 = 1e-5;

fn model_case(mix: Mix, prompt_len: usize, chunk: usize, steps: usize, qat: bool, copied: bool) {
    let Some(o) = opts() else { return };
    let mut cpu = load_as(mix, 11, qat, copied);
    let p = prompt(&cpu.cfg, prompt_len);
    let ctx = prompt_len + steps + 8;
    let mut gpu = WgpuStage::new(&cpu, ctx, chunk, cpu.w.range, &o).unwrap();
    let (caps, c) = (gpu.ops.gpu().caps().clone(), gpu.ops.gpu().counters());
    let unified = matches!(caps.device_type, ds4_wgpu::wgpu::DeviceType::Cpu | ds4_wgpu::wgpu::DeviceType::IntegratedGpu);
    eprintln!("weights: {} imported parts (zero-copy), {} uploads ({} bytes)", c.weight_imports, c.weight_uploads, c.weight_bytes);
    if unified && caps.host_import_alignment.is_some() && !copied {
        assert!(c.weight_imports > 0, "weights in the file's mapping on a unified-memory adapter should be wrapped, not copied");
    }
    if copied {
        assert_eq!(c.weight_imports, 0, "copied weights are uploaded");
    }
    let (tc, tg, worst) = compare(&mut cpu, &mut gpu, &p, chunk, steps, ctx);
    let same = tc.iter().zip(&tg).take_while(|(a, b)| a == b).count();
    eprintln!("tiny {mix:?} (qat {qat}) on {}: prompt {prompt_len} in chunks of {chunk}, {same}/{steps} greedy tokens identical, worst logits rel err {worst:.2e}", gpu.device_name());
    assert_eq!(tc, tg, "greedy tokens differ");
    assert!(worst <= LOGITS_BOUND, "logits rel err {worst:.2e} over {LOGITS_BOUND:.0e}");
}

#[test]
fn tiny_q2_greedy_32_matches_cpu() {
    model_case(Mix::Q2, 40, 40, 32, true, false);
}

#[test]
fn tiny_q4_copied_weights_chunked_prefill_greedy_32_matches_cpu() {
    model_case(Mix::Q4, 100, 24, 32, true, true);
}

#[test]
fn tiny_q2_without_qat_greedy_32_matches_cpu() {
    model_case(Mix::Q2, 70, 32, 32, false, false);
}

/// The device pick equals the argmax of the downloaded logits (and their log-softmax); a rewind to the
/// prefill snapshot decodes the same; the KV state downloaded into a host state and uploaded into a
/// second stage continues with the same logits as the CPU holding that state.
#[test]
fn device_pick_rewind_and_kv_round_trip() {
    let Some(o) = opts() else { return };
    let mut cpu = load(Mix::Q2, 11, true);
    let p = prompt(&cpu.cfg, 37);
    let ctx = 96;
    let mut gpu = WgpuStage::new(&cpu, ctx, 16, cpu.w.range, &o).unwrap();
    let mut kg = cpu.new_kv(ctx);
    for c in p.chunks(16) {
        gpu.forward(&mut kg, c, None, Logits::Last).unwrap();
    }
    let mut t = argmax(gpu.last_logits().unwrap());
    let mut picks = Vec::new();
    for _ in 0..6 {
        picks.push(t);
        let (top1, logprob) = gpu.forward_argmax(&mut kg, &[t], None).unwrap();
        let l = gpu.last_logits().unwrap();
        assert_eq!(top1, argmax(l), "device pick vs argmax of the logits");
        let m = l[top1 as usize] as f64;
        let want = -l.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
        assert!((logprob as f64 - want).abs() <= 1e-5 * want.abs().max(1.0), "log-probability {logprob} vs {want}");
        t = top1;
    }
    // Rewind: the same position as after the prompt (the snapshot), the same tokens.
    let mut kr = cpu.new_kv(ctx);
    kr.pos = p.len();
    let mut t2 = picks[0];
    for (i, &want) in picks.iter().enumerate().skip(1) {
        t2 = gpu.forward_argmax(&mut kr, &[t2], None).unwrap().0;
        assert_eq!(t2, want, "rewound decode step {i}");
    }
    // KV through the host: download at the current position, upload into a fresh stage, continue.
    let mut host = cpu.new_kv(ctx);
    host.pos = kr.pos;
    gpu.download_kv(&mut host).unwrap();
    let mut kc = cpu.new_kv(ctx);
    let mut all = p.clone();
    all.extend(&picks[..picks.len() - 1]);
    all.push(t2);
    cpu.forward(&mut kc, &all[..all.len() - 1], None, Logits::None).unwrap();
    assert_eq!(kc.pos, host.pos);
    // The downloaded state is the CPU's (f32 sums vs f64: close, not equal).
    let (hl, cl) = (&host.layers[1], &kc.layers[1]);
    assert!(rel_err(&hl.raw, &cl.raw) < 1e-4, "window ring vs CPU: {:.2e}", rel_err(&hl.raw, &cl.raw));
    if let (Some(h), Some(c)) = (&hl.comp, &cl.comp) {
        assert_eq!(h.n, c.n);
        assert!(rel_err(&h.data, &c.data) < 1e-4, "compressed rows vs CPU");
    }
    let mut gpu2 = WgpuStage::new(&cpu, ctx, 16, cpu.w.range, &o).unwrap();
    gpu2.upload_kv(&host).unwrap();
    let last = *all.last().unwrap();
    let mut k1 = host.clone();
    let a = gpu.forward(&mut kr, &[last], None, Logits::Last).unwrap().to_vec();
    let b = gpu2.forward(&mut k1, &[last], None, Logits::Last).unwrap().to_vec();
    assert_eq!(a, b, "a stage resumed from the downloaded KV state continues bit-identically");
    let c = cpu.forward(&mut kc, &[last], None, Logits::Last).unwrap().to_vec();
    assert!(rel_err(&b, &c) <= LOGITS_BOUND, "resumed stage vs CPU: {:.2e}", rel_err(&b, &c));
}

/// Steps the stage cannot take are errors naming the problem, and the stage keeps working after them.
#[test]
fn bad_steps_are_refused() {
    let Some(o) = opts() else { return };
    let cpu = load(Mix::Q2, 11, true);
    let ctx = 40;
    let mut gpu = WgpuStage::new(&cpu, ctx, 8, cpu.w.range, &o).unwrap();
    let mut kv = cpu.new_kv(ctx);
    let v = cpu.cfg.n_vocab as u32;
    let e = gpu.forward(&mut kv, &[1; 9], None, Logits::Last).unwrap_err().to_string();
    assert!(e.contains("exceeds the prefill chunk"), "{e}");
    let e = gpu.forward(&mut kv, &[v], None, Logits::Last).unwrap_err().to_string();
    assert!(e.contains("outside the vocabulary"), "{e}");
    let e = gpu.forward(&mut kv, &[1], Some(&[0.0; 3]), Logits::Last).unwrap_err().to_string();
    assert!(e.contains("hidden input"), "{e}");
    kv.pos = 39;
    let e = gpu.forward(&mut kv, &[1, 2], None, Logits::Last).unwrap_err().to_string();
    assert!(e.contains("context full"), "{e}");
    let mut kv = cpu.new_kv(ctx);
    let l = gpu.forward(&mut kv, &[1, 2, 3], None, Logits::All).unwrap();
    assert_eq!(l.len(), 3 * cpu.cfg.n_vocab);
    // A KV state of another shape is refused before anything is written.
    let mut other = cpu.new_kv(ctx);
    other.layers[0].raw.pop();
    assert!(gpu.upload_kv(&other).is_err());
    // A work buffer over one binding names the prefill chunk (lavapipe's 128 MiB binding: the indexer
    // scores of 1024-token steps at ctx 200000 need 205 MB).
    if gpu.ops.gpu().caps().max_binding <= 256 << 20 {
        let e = WgpuStage::new(&cpu, 200_000, 1024, cpu.w.range, &o).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("--prefill-chunk"), "{e}");
    }
    // The device can refuse a plan it cannot hold: a context far beyond its memory.
    let e = WgpuStage::new(&cpu, 1 << 40, 8, cpu.w.range, &o).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(!e.is_empty(), "a 2^40 context must be refused");
}

/// Prefill on the cooperative-matrix tiles (f16 inputs, f32 sums; where the adapter has them) against
/// the CPU's f64 products: a whole prompt of the tiny q2 model in one chunk, then decode steps (f32
/// mat-vecs) on that KV. Without QAT: its FP8 / FP4 rounding steps turn f16-sized differences into
/// whole quantization steps. Bound set from the H100's measured error (see COOP_LOGITS_BOUND).
#[test]
fn prefill_on_cooperative_matrices_matches_cpu() {
    let Some(gpu) = common::gpu(GpuOptions::default()) else { return };
    if gpu.caps().coop.is_none() {
        eprintln!("no cooperative matrices on {}: skipped", gpu.caps().adapter);
        return;
    }
    drop(gpu);
    let mut cpu = load(Mix::Q2, 11, false);
    let p = prompt(&cpu.cfg, 120);
    let ctx = 160;
    let mut g = WgpuStage::new(&cpu, ctx, 120, cpu.w.range, &GpuOptions::default()).unwrap();
    let (_, _, worst) = compare(&mut cpu, &mut g, &p, 120, 8, ctx);
    eprintln!("coop prefill of {} tokens, 8 decode steps: worst logits rel err {worst:.2e}", p.len());
    assert!(worst <= COOP_LOGITS_BOUND, "coop prefill logits rel err {worst:.2e} over {COOP_LOGITS_BOUND:.0e}");
}

/// f16 has an 11-bit significand: each product input moves by up to 2^-12 relative, ~1e-3 of a
/// logit after a few layers: 2.0e-3 measured on the H100 (this test, 120 tokens, 8 steps).
const COOP_LOGITS_BOUND: f64 = 5e-3;

/// A prefill step's rows are bit-identical to decode steps of the same tokens (each row's sums run in
/// the same order): what speculative verification and its rollback rely on.
#[test]
fn prefill_rows_equal_decode_steps_bitwise() {
    let Some(o) = opts() else { return };
    let cpu = load(Mix::Q2, 11, true);
    let p = prompt(&cpu.cfg, 30);
    let ctx = 64;
    let mut a = WgpuStage::new(&cpu, ctx, 32, cpu.w.range, &o).unwrap();
    let mut ka = cpu.new_kv(ctx);
    a.forward(&mut ka, &p[..25], None, Logits::None).unwrap();
    let mut single = Vec::new();
    for &t in &p[25..] {
        single.extend_from_slice(a.forward(&mut ka, &[t], None, Logits::Last).unwrap());
    }
    let mut b = WgpuStage::new(&cpu, ctx, 32, cpu.w.range, &o).unwrap();
    let mut kb = cpu.new_kv(ctx);
    b.forward(&mut kb, &p[..25], None, Logits::None).unwrap();
    let batch = b.forward(&mut kb, &p[25..], None, Logits::All).unwrap().to_vec();
    let same = single.iter().zip(&batch).filter(|(x, y)| x.to_bits() == y.to_bits()).count();
    assert_eq!(same, single.len(), "prefill rows vs decode steps: {same} of {} logits bit-identical", single.len());
}

/// Speculative verification on the device: every step checkpoints, verifies the token and up to
/// three drafts in one forward call (some drafts right, some wrong), keeps the greedy prefix and rolls
/// back past the first rejection. Tokens, the logits used and the final KV state are bit-identical
/// to plain greedy decoding.
#[test]
fn journal_rollback_equals_plain_decode() {
    let Some(o) = opts() else { return };
    let cpu = load(Mix::Q4, 11, true);
    let p = prompt(&cpu.cfg, 20);
    let (ctx, steps, v) = (80, 24, cpu.cfg.n_vocab);
    // Plain greedy decode.
    let mut a = WgpuStage::new(&cpu, ctx, 20, cpu.w.range, &o).unwrap();
    let mut ka = cpu.new_kv(ctx);
    let mut l = a.forward(&mut ka, &p, None, Logits::Last).unwrap().to_vec();
    let (mut plain, mut plain_logits) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let t = argmax(&l);
        plain.push(t);
        l = a.forward(&mut ka, &[t], None, Logits::Last).unwrap().to_vec();
        plain_logits.push(l.clone());
    }
    // Speculative: drafts from the plain run, every third draft wrong.
    let mut b = WgpuStage::new(&cpu, ctx, 20, cpu.w.range, &o).unwrap();
    let mut kb = cpu.new_kv(ctx);
    let mut l = b.forward(&mut kb, &p, None, Logits::Last).unwrap().to_vec();
    let (mut got, mut rolled) = (Vec::new(), 0);
    let mut i = 0usize;
    while got.len() < steps {
        let t = argmax(&l);
        got.push(t);
        let k = (i % 4).min(steps - got.len());
        let drafts: Vec<u32> = (0..k).map(|j| { let want = plain[got.len() + j]; if (i + j) % 3 == 2 { (want + 1) % v as u32 } else { want } }).collect();
        let mut batch = vec![t];
        batch.extend(&drafts);
        let p0 = kb.pos;
        b.begin_journal(&kb).unwrap();
        let rows = b.forward(&mut kb, &batch, None, Logits::All).unwrap().to_vec();
        let mut fed = 1;
        for (j, &d) in drafts.iter().enumerate() {
            if argmax(&rows[j * v..(j + 1) * v]) != d {
                break;
            }
            got.push(d);
            fed += 1;
        }
        if fed < batch.len() {
            rolled += 1;
        }
        b.rollback(&mut kb, p0 + fed).unwrap();
        b.end_journal();
        assert_eq!(kb.pos, p0 + fed);
        l = rows[(fed - 1) * v..fed * v].to_vec();
        let at = got.len() - 1;
        if at < steps {
            assert!(l == plain_logits[at], "step {at}: verify logits differ from plain decode");
        }
        i += 1;
    }
    got.truncate(steps);
    assert_eq!(got, plain, "speculative greedy tokens");
    assert!(rolled > 3, "the case should roll back several times ({rolled})");
    // The state left behind is the plain decode's, bit for bit.
    let next = argmax(&l);
    let x = a.forward(&mut ka, &[next], None, Logits::Last).unwrap().to_vec();
    let y = b.forward(&mut kb, &[next], None, Logits::Last).unwrap().to_vec();
    assert!(x == y, "after rollbacks the next step differs from plain decode");
    // A rollback outside the journal is refused.
    b.begin_journal(&kb).unwrap();
    let past = kb.pos + 1;
    assert!(b.rollback(&mut kb, past).is_err());
    b.end_journal();
}

/// The profile (`GpuOptions::profile`, `DS4_WGPU_PROFILE=1`): every op of a decode step is timed on the
/// device, the times add up to the step, and the results do not change.
#[test]
fn profile_times_every_op_and_changes_nothing() {
    let Some(o) = opts() else { return };
    let cpu = load(Mix::Q2, 11, true);
    let p = prompt(&cpu.cfg, 12);
    let ctx = 32;
    let run = |o: &GpuOptions| {
        let mut g = WgpuStage::new(&cpu, ctx, 16, cpu.w.range, o).unwrap();
        let mut kv = cpu.new_kv(ctx);
        g.forward(&mut kv, &p[..8], None, Logits::None).unwrap();
        let mut out = Vec::new();
        for &t in &p[8..] {
            out.extend_from_slice(g.forward(&mut kv, &[t], None, Logits::Last).unwrap());
        }
        (out, g.profile_report())
    };
    let (plain, none) = run(&o);
    assert!(none.is_none() || std::env::var_os("DS4_WGPU_PROFILE").is_some());
    let (profiled, report) = run(&GpuOptions { profile: true, ..o.clone() });
    assert!(plain.iter().zip(&profiled).all(|(a, b)| a.to_bits() == b.to_bits()), "profiling changed the logits");
    let Some(report) = report else {
        eprintln!("the adapter has no timestamps inside passes: profile not checked");
        return;
    };
    eprintln!("{report}");
    assert!(report.contains("one-token steps (4)"), "{report}");
    for op in ["hc_entry_attn", "q_lora", "q_heads", "kv_row", "attend", "attn_out", "hc_entry_ffn", "route", "moe_gate_up", "moe_down", "moe_shared", "ffn_exit", "logits"] {
        assert!(report.contains(op), "{op} missing from the profile:\n{report}");
    }
}

/// A stage that shares the device with another (the MTP drafter: `GpuOptions::reserve_bytes`) is
/// refused before anything is uploaded when the two do not fit together, naming the drafter's share;
/// the same stage alone builds.
#[test]
fn stage_and_reserved_bytes_over_the_device_memory_are_refused() {
    let Some(o) = opts() else { return };
    let Some(have) = common::gpu(o.clone()).and_then(|g| g.memory_bytes()) else {
        eprintln!("the adapter reports no memory size: nothing to refuse");
        return;
    };
    let cpu = load(Mix::Q2, 11, true);
    let r = cpu.w.range;
    let e = WgpuStage::new(&cpu, 64, 8, r, &GpuOptions { reserve_bytes: have, ..o.clone() }).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("MTP drafter") && e.contains("GPU memory"), "{e}");
    assert!(WgpuStage::new(&cpu, 64, 8, r, &o).is_ok());
}

/// Without `--prefill-chunk` a stage takes the largest chunk of its `ChunkFit` that fits: all of it
/// where the device holds it (a 1000-token step then runs in one call), the minimum where the reserve
/// leaves room for no larger one, and a chunk whose buffers exceed one binding is passed over
/// (lavapipe's 128 MiB: the indexer scores of 1024-token steps at ctx 200000 need 205 MB).
#[test]
fn stage_takes_the_largest_prefill_chunk_that_fits() {
    let Some(o) = opts() else { return };
    let cpu = load(Mix::Q2, 11, true);
    let auto = ChunkFit::gpu_auto(1024, 256);
    let mut g = WgpuStage::new_fitting(&cpu, 1024, auto, cpu.w.range, &o).unwrap();
    assert_eq!(g.rows(), 1024);
    let mut kv = cpu.new_kv(1024);
    g.forward(&mut kv, &prompt(&cpu.cfg, 1000), None, Logits::Last).unwrap();
    let fixed = WgpuStage::new(&cpu, 1024, 256, cpu.w.range, &o).unwrap();
    assert_eq!(fixed.rows(), 256);
    if let Some(mem) = common::gpu(o.clone()).and_then(|gpu| gpu.memory_bytes()) {
        let g = WgpuStage::new_fitting(&cpu, 1024, ChunkFit { reserve: mem, ..auto }, cpu.w.range, &o).unwrap();
        assert_eq!(g.rows(), 256, "a reserve of the whole device leaves the minimum");
    }
    if g.ops.gpu().caps().max_binding == 128 << 20 {
        let g = WgpuStage::new_fitting(&cpu, 200_000, ChunkFit::gpu_auto(200_000, 256), cpu.w.range, &o).unwrap();
        assert_eq!(g.rows(), 512);
    }
}

/// Two steering slots of unit directions per layer (fixed pseudo-random), both signs of scale.
fn steering(cfg: &Config) -> ds4_model::steering::Steering {
    let slot = |seed: u64| {
        let mut d = common::normals(seed, cfg.n_layer * cfg.n_embd);
        for row in d.chunks_exact_mut(cfg.n_embd) {
            let n = row.iter().map(|v| v * v).sum::<f32>().sqrt();
            row.iter_mut().for_each(|v| *v /= n);
        }
        d
    };
    ds4_model::steering::Steering::from_dirs(vec![(slot(1), -1.5, 0.5), (slot(2), 1.0, 0.0)], cfg.n_embd)
}

/// Directional steering on the device against the CPU stage's (same directions, scales and gate):
/// greedy tokens identical and logits within the stage bound through a chunked prefill and decode,
/// QAT off (see below). With QAT on an H200 through Vulkan gave 9.2e-5 and an H100 2.0e-4 (tokens
/// identical): FP8 boundary flips, not the steering (steering_error_breakdown). Fails with
/// the shared expert left out of the edited sum (0/24 tokens) or the row flags ignored;
/// the steered tokens differ from the plain model's; with the gate off the device is the plain model
/// again; a batched step steers only the rows its mask names.
#[test]
fn steering_matches_cpu() {
    let Some(o) = opts() else { return };
    // Without the FP8/FP4 simulation: a value a rounding step apart on the device and on the CPU can
    // fall on either side of an FP8 boundary, and which steered run meets one is luck (QAT on, lavapipe:
    // 1.2e-6 to 6.5e-4 over slots and sites, steering_error_breakdown; all 1.1e-6 to 1.6e-6 with QAT
    // off). The QAT path itself is held to the bound by the tiny-model tests.
    let mut plain = load(Mix::Q2, 11, false);
    let mut cpu = load(Mix::Q2, 11, false);
    let st = Arc::new(steering(&cpu.cfg));
    cpu.steering = Some(st.clone());
    let p = prompt(&cpu.cfg, 60);
    let ctx = 60 + 24 + 8;
    let mut gpu = WgpuStage::new(&cpu, ctx, 24, cpu.w.range, &o).unwrap();
    use ds4_gpu::DeviceOps;
    gpu.ops.set_steering(Some(&st), cpu.steer_gate.clone()).unwrap();
    let (tc, tg, worst) = compare(&mut cpu, &mut gpu, &p, 24, 24, ctx);
    eprintln!("steered: {}/24 greedy tokens identical, worst logits rel err {worst:.2e}", tc.iter().zip(&tg).take_while(|(a, b)| a == b).count());
    assert_eq!(tc, tg, "steered greedy tokens differ");
    assert!(worst <= LOGITS_BOUND, "steered logits rel err {worst:.2e} over {LOGITS_BOUND:.0e}");
    let mut gpu_plain = WgpuStage::new(&plain, ctx, 24, plain.w.range, &o).unwrap();
    let (tp, _, _) = compare(&mut plain, &mut gpu_plain, &p, 24, 24, ctx);
    assert_ne!(tp, tc, "steering changed nothing: the comparison would not see it");
    // Gate off: the plain model on the device.
    cpu.steer_gate.store(false, std::sync::atomic::Ordering::Relaxed);
    let (_, tg_off, worst) = compare(&mut plain, &mut gpu, &p, 24, 24, ctx);
    assert_eq!(tg_off, tp, "with the gate off the device steers nothing");
    assert!(worst <= LOGITS_BOUND, "{worst:.2e}");
    cpu.steer_gate.store(true, std::sync::atomic::Ordering::Relaxed);
    // Rows of a batched step: the CPU's rows and the device's get the same mask.
    let Some(o2) = opts().map(|o| GpuOptions { kv_slots: 2, ..o }) else { return };
    let mut gpu2 = WgpuStage::new(&cpu, ctx, 24, cpu.w.range, &o2).unwrap();
    gpu2.ops.set_steering(Some(&st), cpu.steer_gate.clone()).unwrap();
    let (mut a, mut b) = (cpu.new_kv(ctx), cpu.new_kv(ctx));
    (a.slot, b.slot) = (0, 1);
    let (mut ga, mut gb) = (a.clone(), b.clone());
    cpu.forward(&mut a, &p[..20], None, Logits::Last).unwrap();
    cpu.forward(&mut b, &p[20..44], None, Logits::Last).unwrap();
    gpu2.forward(&mut ga, &p[..20], None, Logits::Last).unwrap();
    gpu2.forward(&mut gb, &p[20..44], None, Logits::Last).unwrap();
    for mask in [[true, false], [false, true]] {
        cpu.steer_rows = mask.to_vec();
        gpu2.ops.steer_rows(&mask);
        let want = cpu.forward_batch(&mut [&mut a, &mut b], &[3, 5], None).unwrap().to_vec();
        let got = gpu2.forward_batch(&mut [&mut ga, &mut gb], &[3, 5]).unwrap().to_vec();
        let e = rel_err(&got, &want);
        assert!(e <= LOGITS_BOUND, "batched rows {mask:?}: {e:.2e}");
    }
}

/// A measuring aid for `steering_matches_cpu` on a GPU (ignored: run it by name): the worst logits
/// error of the same model and prompt with no steering, each slot alone, each site alone, and the
/// test's steering with a one-token prefill (every position a decode step) or one prefill chunk.
#[test]
#[ignore]
fn steering_error_breakdown() {
    let Some(o) = opts() else { return };
    let base = load(Mix::Q2, 11, true);
    let full = steering(&base.cfg);
    let dir = |s: usize| (0..base.cfg.n_layer).flat_map(|il| full.direction(s, il).to_vec()).collect::<Vec<f32>>();
    let e = base.cfg.n_embd;
    let cases: Vec<(&str, Option<ds4_model::steering::Steering>, usize)> = vec![
        ("none", None, 24),
        ("test steering", Some(steering(&base.cfg)), 24),
        ("test steering, chunk 1", Some(steering(&base.cfg)), 1),
        ("test steering, chunk 60", Some(steering(&base.cfg)), 60),
        ("slot 1 alone (ffn -1.5, attn 0.5)", Some(ds4_model::steering::Steering::from_dirs(vec![(dir(0), -1.5, 0.5)], e)), 24),
        ("slot 2 alone (ffn 1.0)", Some(ds4_model::steering::Steering::from_dirs(vec![(dir(1), 1.0, 0.0)], e)), 24),
        ("attn 0.5 only", Some(ds4_model::steering::Steering::from_dirs(vec![(dir(0), 0.0, 0.5)], e)), 24),
        ("ffn -0.5 only", Some(ds4_model::steering::Steering::from_dirs(vec![(dir(0), -0.5, 0.0)], e)), 24),
        ("ffn +0.5 only", Some(ds4_model::steering::Steering::from_dirs(vec![(dir(0), 0.5, 0.0)], e)), 24),
    ];
    for qat in [true, false] {
    for (name, st, chunk) in cases.iter().cloned() {
        let mut cpu = load(Mix::Q2, 11, qat);
        let p = prompt(&cpu.cfg, 60);
        let ctx = 60 + 24 + 8;
        let mut gpu = WgpuStage::new(&cpu, ctx, 60, cpu.w.range, &o).unwrap();
        if let Some(st) = st {
            let st = Arc::new(st);
            cpu.steering = Some(st.clone());
            use ds4_gpu::DeviceOps;
            gpu.ops.set_steering(Some(&st), cpu.steer_gate.clone()).unwrap();
        }
        let (tc, tg, worst) = compare(&mut cpu, &mut gpu, &p, chunk, 24, ctx);
        eprintln!("qat {qat}, {name}: {}/24 tokens identical, worst logits rel err {worst:.2e}", tc.iter().zip(&tg).take_while(|(a, b)| a == b).count());
    }
    }
}
