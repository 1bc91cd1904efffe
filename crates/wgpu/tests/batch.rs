//! Batched decode of several sessions on the wgpu stage (lavapipe in CI): each session lives in its
//! own KV slot; a batched step feeds one token to each and must give every row the logits that
//! session gets decoded alone, bit for bit (reference: a one-slot stage decoding the sessions one
//! after another), and the greedy tokens of the CPU stage in `Precision::Exact`. Sessions of
//! different prompt lengths (window wrap, indexer selection, a ratio-128 window closing inside a
//! batch), one joining mid-stream (prefilled in its slot while the others are mid-decode), one
//! dropped mid-stream; nothing allocated or bound per step; injected mistakes (every row reading
//! slot 0, a wrong per-row position) fail the comparison; bad batches are typed errors.
mod common;

use std::sync::Arc;

use ds4_gguf::GgufFile;
use ds4_model::synth::{self, Mix, SynthSpec};
use ds4_model::{Config, KvState, LayerRange, Logits, Options, Stage, Weights};
use ds4_quant::Precision;
use ds4_wgpu::{BatchFault, GpuOptions, WgpuStage};

fn load() -> Stage {
    let dir = std::env::temp_dir().join(format!("ds4-wgpu-batch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny-q2.gguf");
    if !path.exists() {
        let tmp = dir.join(format!("tiny-q2.{:?}.part", std::thread::current().id()));
        synth::write(&SynthSpec { shape: "tiny", mix: Mix::Q2, seed: 11, layers: None, vocab: None }, &tmp, |_, _| {}).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    let f = Arc::new(GgufFile::open(&path).unwrap());
    let cfg = Config::from_gguf(&f).unwrap();
    let w = Weights::bind(f, &cfg, LayerRange::full(&cfg)).unwrap();
    Stage::new(cfg, w, Options { precision: Precision::Exact, qat: true })
}

fn opts(slots: usize) -> Option<GpuOptions> {
    common::gpu(GpuOptions::default()).map(|_| GpuOptions { kv_slots: slots, ..GpuOptions::default() })
}

fn argmax(l: &[f32]) -> u32 {
    l.iter().enumerate().fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32
}

fn prompt(cfg: &Config, n: usize, seed: u32) -> Vec<u32> {
    let v = cfg.n_vocab as u32;
    (0..n as u32).map(|i| ((i.wrapping_add(seed * 977)).wrapping_mul(2654435761u32) >> 7) % v).collect()
}

const CTX: usize = 200;
const CHUNK: usize = 64;
const STEPS: usize = 6;
/// Prompt lengths: a short one, the indexer starting to select inside the batch (pos 35), a wrapped
/// window, a ratio-128 window closing inside the batch (pos 127); the joiner.
const LENS: [usize; 5] = [5, 33, 61, 124, 40];
/// The joiner (session 4) is prefilled before batched step 2; session 1 leaves after step 3.
const JOIN_AT: usize = 2;
const DROP: (usize, usize) = (1, 3);
/// Batched steps each session takes part in.
const TAKES: [usize; 5] = [STEPS, DROP.1 + 1, STEPS, STEPS, STEPS - JOIN_AT];

/// Which sessions a batched step feeds.
fn active(step: usize) -> Vec<usize> {
    (0..LENS.len()).filter(|&s| (s != 4 || step >= JOIN_AT) && (s != DROP.0 || step <= DROP.1)).collect()
}

fn prefill(gpu: &mut WgpuStage, kv: &mut KvState, p: &[u32]) -> Vec<f32> {
    let mut l = Vec::new();
    for c in p.chunks(CHUNK) {
        l = gpu.forward(kv, c, None, Logits::Last).unwrap().to_vec();
    }
    l
}

/// Logits of every decode step of session `s` alone (one slot, one session at a time), for `n` steps.
fn alone(gpu: &mut WgpuStage, cpu: &Stage, p: &[u32], n: usize) -> Vec<Vec<f32>> {
    let mut kv = cpu.new_kv(CTX);
    let mut l = prefill(gpu, &mut kv, p);
    let mut out = vec![l.clone()];
    for _ in 0..n {
        l = gpu.forward(&mut kv, &[argmax(&l)], None, Logits::Last).unwrap().to_vec();
        out.push(l.clone());
    }
    out
}

/// Greedy tokens of `p` on the CPU reference.
fn cpu_tokens(cpu: &mut Stage, p: &[u32], n: usize) -> Vec<u32> {
    let mut kv = cpu.new_kv(CTX);
    let mut l = cpu.forward(&mut kv, p, None, Logits::Last).unwrap().to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = argmax(&l);
        out.push(t);
        l = cpu.forward(&mut kv, &[t], None, Logits::Last).unwrap().to_vec();
    }
    out
}

/// Runs `steps` batched steps of the schedule on a stage with five slots: per session, the logits
/// after its prompt and after every batched step it took part in.
fn batched(gpu: &mut WgpuStage, cpu: &Stage, prompts: &[Vec<u32>], steps: usize) -> Vec<Vec<Vec<f32>>> {
    let mut kvs: Vec<KvState> = (0..prompts.len())
        .map(|s| {
            let mut kv = cpu.new_kv(CTX);
            kv.slot = s;
            kv
        })
        .collect();
    let mut logits: Vec<Vec<Vec<f32>>> = vec![Vec::new(); prompts.len()];
    // Prefilled one by one, each in its own slot.
    for s in 0..4 {
        logits[s].push(prefill(gpu, &mut kvs[s], &prompts[s]));
    }
    let v = cpu.cfg.n_vocab;
    let counters = gpu.ops.gpu().counters();
    let mut step_writes = 0;
    for step in 0..steps {
        if step == JOIN_AT {
            // Mid-stream: the others are mid-decode in their slots.
            logits[4].push(prefill(gpu, &mut kvs[4], &prompts[4]));
            step_writes += prompts[4].len().div_ceil(CHUNK) as u64;
        }
        let rows = active(step);
        let tokens: Vec<u32> = rows.iter().map(|&s| argmax(logits[s].last().unwrap())).collect();
        let mut refs: Vec<&mut KvState> = kvs.iter_mut().enumerate().filter(|(s, _)| rows.contains(s)).map(|(_, k)| k).collect();
        let out = gpu.forward_batch(&mut refs, &tokens).unwrap().to_vec();
        assert_eq!(out.len(), rows.len() * v);
        for (r, &s) in rows.iter().enumerate() {
            logits[s].push(out[r * v..(r + 1) * v].to_vec());
        }
        step_writes += 1;
    }
    let after = gpu.ops.gpu().counters();
    assert_eq!(
        (after.weight_uploads, after.bind_groups, after.pipelines, after.buffers),
        (counters.weight_uploads, counters.bind_groups, counters.pipelines, counters.buffers),
        "a batched step (or a prefill in another slot) uploaded, bound, compiled or allocated something"
    );
    assert_eq!(after.step_writes - counters.step_writes, step_writes, "one step uniform per step");
    logits
}

/// Rows of `got` that differ from `want` in any bit, per session.
fn mismatches(got: &[Vec<Vec<f32>>], want: &[Vec<Vec<f32>>]) -> Vec<usize> {
    got.iter().zip(want).map(|(g, w)| g.iter().zip(w).filter(|(a, b)| a.iter().zip(b.iter()).any(|(x, y)| x.to_bits() != y.to_bits())).count()).collect()
}

/// Also: injected mistakes (every row reading slot 0's KV state, every row one position late) fail
/// the same comparison (the first batched step of the schedule).
#[test]
fn five_sessions_batched_equal_alone_bitwise_and_cpu_tokens() {
    let (Some(one), Some(five)) = (opts(1), opts(5)) else { return };
    let mut cpu = load();
    let prompts: Vec<Vec<u32>> = LENS.iter().enumerate().map(|(s, &n)| prompt(&cpu.cfg, n, s as u32 + 1)).collect();
    let t0 = std::time::Instant::now();
    let mut g = WgpuStage::new(&cpu, CTX, CHUNK, cpu.w.range, &five).unwrap();
    assert_eq!(g.slots(), 5);
    let got = batched(&mut g, &cpu, &prompts, STEPS);
    let t_batch = t0.elapsed();
    let steps: Vec<usize> = got.iter().map(|l| l.len() - 1).collect();
    assert_eq!(steps, TAKES);
    let mut r = WgpuStage::new(&cpu, CTX, CHUNK, cpu.w.range, &one).unwrap();
    let want: Vec<Vec<Vec<f32>>> = prompts.iter().zip(&steps).map(|(p, &n)| alone(&mut r, &cpu, p, n)).collect();
    let t_alone = t0.elapsed() - t_batch;
    let bad = mismatches(&got, &want);
    eprintln!("batched ({:.1} s incl. build) vs alone ({:.1} s): rows differing per session {bad:?} (steps {steps:?})", t_batch.as_secs_f64(), t_alone.as_secs_f64());
    assert!(bad.iter().all(|&b| b == 0), "batched rows differ from the sessions decoded alone: {bad:?}");
    // The greedy tokens are the CPU reference's.
    for (s, p) in prompts.iter().enumerate() {
        let gpu_tokens: Vec<u32> = got[s][..steps[s]].iter().map(|l| argmax(l)).collect();
        assert_eq!(gpu_tokens, cpu_tokens(&mut cpu, p, steps[s]), "session {s}: greedy tokens vs CPU Exact");
    }
    // The comparison catches a batched step that reads the wrong KV state (every slot starts over
    // at position 0 on its next prefill).
    for fault in [BatchFault::AllSlotZero, BatchFault::PositionPlusOne] {
        g.ops.batch_fault = fault;
        let got = batched(&mut g, &cpu, &prompts, 1);
        let bad = mismatches(&got, &want);
        eprintln!("injected {fault:?}: rows differing per session {bad:?}");
        // The row of every session outside slot 0 differs (slot 0's own row may match).
        assert!(bad[1..4].iter().all(|&b| b == 1), "{fault:?} went unnoticed: {bad:?}");
    }
    eprintln!("total {:.1} s", t0.elapsed().as_secs_f64());
}

#[test]
fn bad_batches_are_typed_errors() {
    let Some(three) = opts(3) else { return };
    let cpu = load();
    let mut g = WgpuStage::new(&cpu, CTX, CHUNK, cpu.w.range, &three).unwrap();
    let mut kvs: Vec<KvState> = (0..4).map(|s| {
        let mut kv = cpu.new_kv(CTX);
        kv.slot = s.min(2);
        kv
    }).collect();
    for kv in kvs.iter_mut().take(3) {
        g.forward(kv, &[1, 2, 3], None, Logits::Last).unwrap();
    }
    let msg = |r: Result<&[f32], ds4_model::ModelError>| r.err().map(|e| e.to_string()).unwrap_or_default();
    // More sessions than slots.
    let mut refs: Vec<&mut KvState> = kvs.iter_mut().collect();
    let e = msg(g.forward_batch(&mut refs, &[1, 2, 3, 4]));
    assert!(e.contains("exceeds the 3 KV slots"), "{e}");
    drop(refs);
    // A slot index out of range, in a batch and alone.
    kvs[3].slot = 7;
    let mut refs: Vec<&mut KvState> = kvs.iter_mut().skip(2).collect();
    let e = msg(g.forward_batch(&mut refs, &[1, 2]));
    assert!(e.contains("KV slot 7 does not exist"), "{e}");
    drop(refs);
    let e = msg(g.forward(&mut kvs[3], &[1], None, Logits::Last));
    assert!(e.contains("KV slot 7 does not exist"), "{e}");
    // The same slot twice; tokens and sessions that do not pair up; a token outside the vocabulary.
    kvs[3].slot = 2;
    kvs[3].pos = kvs[2].pos;
    let mut refs: Vec<&mut KvState> = kvs.iter_mut().skip(2).collect();
    let e = msg(g.forward_batch(&mut refs, &[1, 2]));
    assert!(e.contains("appears twice"), "{e}");
    drop(refs);
    let mut refs: Vec<&mut KvState> = kvs.iter_mut().take(2).collect();
    let e = msg(g.forward_batch(&mut refs, &[1]));
    assert!(e.contains("with 1 tokens"), "{e}");
    let e = msg(g.forward_batch(&mut refs, &[1, cpu.cfg.n_vocab as u32]));
    assert!(e.contains("outside the vocabulary"), "{e}");
    // Nothing was run: the sessions still batch.
    let l = g.forward_batch(&mut refs, &[1, 2]).unwrap();
    assert_eq!(l.len(), 2 * cpu.cfg.n_vocab);
    drop(refs);
    // More slots than a batched step holds is refused at build.
    let e = WgpuStage::new(&cpu, CTX, 128, cpu.w.range, &GpuOptions { kv_slots: ds4_wgpu::MAX_BATCH_ROWS + 1, ..three.clone() }).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("KV slots") && e.contains("at most 64"), "{e}");
    // And more than the activation rows (the prefill chunk) hold.
    let e = WgpuStage::new(&cpu, CTX, 2, cpu.w.range, &three).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("--prefill-chunk"), "{e}");
}
