//! The cost of one verify step of 1 + k tokens (k = 0..4) relative to a plain decode step, on the CPU
//! backend, at a given context: what MTP speculation pays per step. Each step is journaled and rolled
//! back, so every repetition runs at the same position. With an MTP file, also the cost of one draft
//! step (the MTP block, its input and its head: where the engine drafts, i.e. on the device for a GPU
//! backend, with the logits row brought back as a session's draft step does). Prints the decode rate these costs give at acceptance rates 0.6 / 0.8 / 0.9
//! (computed from the measured costs, assuming each draft is accepted independently with that rate).
//!
//! A verify step's cost here is the greedy loop's: the journal begun, the step (each row's pick made on
//! the device where the backend can, else the logits rows brought back), its hidden rows brought back
//! (the drafter's input); a rollback (drafts rejected) is timed apart.
//!
//! With an MTP file, also **end to end**: `--gen N` greedy tokens plain (the token picked on the
//! device where the backend can), then the same with speculation at each draft count, where a drafter
//! stand-in proposes the plain run's next token with probability 0.6 / 0.8 / 0.9 and a wrong one
//! otherwise (random weights accept nothing; the MTP block still runs for every draft): the measured
//! rate against plain decode, with every host cost of the loop in it, and the tokens checked equal.
//!
//! cargo run --release -p ds4-engine --example mtp_step_costs -- MODEL [--mtp FILE] [--ctx-at N] [--reps N] [--gen N] [--backend cpu|cuda|vulkan|metal]
//! (a GPU backend needs the stage's KV journal: `Engine::kv_begin_journal` / `kv_rollback`.)
use ds4_engine::{Backend, Engine, GenStats, LoadOptions, MtpOptions, ScriptedDrafts, Session};
use ds4_model::Logits;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// Drafts from the plain run's tokens (`truth`), each right with probability `p` (a seeded stream).
fn stand_in(truth: Vec<u32>, p: f64, seed: u64, vocab: u32) -> impl FnMut(usize) -> u32 {
    let mut rng = seed;
    move |n| {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let t = truth.get(n).copied().unwrap_or(0);
        if ((rng >> 11) as f64 / (1u64 << 53) as f64) < p { t } else { (t + 1) % vocab }
    }
}

fn argmax(l: &[f32]) -> u32 { l.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32 }

/// Returns the session to `p0` after one decode step at `p0`: the CPU's KV state by its journal, a GPU
/// stage through its prefill snapshot (restored when the next call syncs the state: done here).
fn rewind(eng: &mut Engine, s: &mut Session, p0: usize) {
    if eng.backend() == Backend::Cpu {
        s.kv.pos = p0;
        return;
    }
    s.kv.pos = p0;
    eng.kv_begin_journal(&mut s.kv).unwrap_or_else(|e| panic!("{e}"));
    eng.kv_end_journal(&mut s.kv);
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let mut a = std::env::args().skip(1);
    let usage = || -> ! {
        eprintln!("usage: mtp_step_costs MODEL [--mtp FILE] [--ctx-at N] [--reps N] [--backend cpu|cuda|vulkan|metal]");
        std::process::exit(2)
    };
    let Some(model) = a.next() else { usage() };
    let (mut mtp, mut at, mut reps, mut backend, mut gen) = (None::<PathBuf>, 512usize, 7usize, Backend::Cpu, 0usize);
    while let Some(f) = a.next() {
        let v = a.next().unwrap_or_else(|| usage());
        match f.as_str() {
            "--mtp" => mtp = Some(PathBuf::from(v)),
            "--ctx-at" => at = v.parse().unwrap_or_else(|_| usage()),
            "--reps" => reps = v.parse().unwrap_or_else(|_| usage()),
            "--gen" => gen = v.parse().unwrap_or_else(|_| usage()),
            "--backend" => backend = Backend::parse(&v).unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    let opts = LoadOptions { ctx: at + 16 + gen + 8, prefill_chunk: 256, backend, mtp: mtp.map(|p| MtpOptions { path: p, draft: 4, margin: 0.0 }), ..LoadOptions::default() };
    let mut eng = Engine::load(&PathBuf::from(&model), &opts).unwrap_or_else(|e| panic!("{model}: {e}"));
    let v = eng.cfg().n_vocab as u64;
    let prompt: Vec<u32> = (0..at as u64).map(|i| ((i * 2654435761) % v) as u32).collect();
    let mut s = Session::new(&eng);
    s.sync(&mut eng, &prompt, &mut |_, _| {}, &AtomicBool::new(false)).unwrap();
    // With DS4_CUDA_PROFILE=1 the steps launch kernel by kernel (no recorded replay): per-kernel
    // device times of each step size, to see where a verify step's extra rows go.
    let profiled = std::env::var_os("DS4_CUDA_PROFILE").is_some();
    if profiled {
        let _ = eng.backend_report();
    }
    // A plain decode step as generation runs it: the greedy token taken on the device where the
    // backend can (else the logits row and a host argmax), no journal.
    let mut t = Vec::new();
    for r in 0..reps + 1 {
        let p0 = s.kv.pos;
        let t0 = Instant::now();
        if eng.forward_top1(&mut s.kv, &[3], None).unwrap().is_none() {
            let _ = argmax(eng.forward(&mut s.kv, &[3], None, Logits::Last).unwrap());
        }
        let dt = t0.elapsed().as_secs_f64();
        // Back to p0 (a GPU stage restores its prefill snapshot here, untimed).
        rewind(&mut eng, &mut s, p0);
        if r > 0 {
            t.push(dt);
        }
    }
    let plain = median(t);
    let mut costs = Vec::new();
    let mut rollback_costs = Vec::new();
    for n in 1..=5usize {
        let toks: Vec<u32> = (0..n as u32).map(|i| (i * 7 + 3) % v as u32).collect();
        let (mut t, mut tr) = (Vec::new(), Vec::new());
        for r in 0..reps + 1 {
            let p0 = s.kv.pos;
            let t0 = Instant::now();
            eng.kv_begin_journal(&mut s.kv).unwrap_or_else(|e| panic!("{e}"));
            // As the greedy loop verifies: each row's pick on the device where the backend can.
            if eng.forward_picks(&mut s.kv, &toks).unwrap().is_none() {
                eng.forward(&mut s.kv, &toks, None, Logits::All).unwrap();
            }
            let _ = eng.hidden(n).unwrap().len();
            let t1 = Instant::now();
            // The worst rollback: every draft rejected (n = 1: the step itself undone); then to p0.
            let keep = 1.min(n - 1);
            eng.kv_rollback(&mut s.kv, p0 + keep).unwrap();
            let t2 = Instant::now();
            eng.kv_rollback(&mut s.kv, p0).unwrap();
            eng.kv_end_journal(&mut s.kv);
            if r > 0 {
                t.push((t1 - t0).as_secs_f64());
                tr.push((t2 - t1).as_secs_f64());
            }
        }
        costs.push(median(t));
        rollback_costs.push(median(tr));
        if profiled {
            if let Some(r) = eng.backend_report() {
                println!("profile of {} verify steps of {n} tokens: {r}", reps + 1);
            }
        }
    }
    let mut draft_cost = 0.0;
    let mut drafter = "";
    if let Some(m) = eng.mtp.as_mut() {
        drafter = if m.on_device() { backend.name() } else { "cpu" };
        let hd = eng.stage.cfg.hc_dim();
        let hidden = vec![0.1f32; hd];
        let mut kv = m.new_kv(at + 16);
        let mut t = Vec::new();
        for r in 0..reps + 1 {
            let t0 = Instant::now();
            m.forward(&eng.stage, &mut kv, &hidden, &[1], true).unwrap();
            if r > 0 {
                t.push(t0.elapsed().as_secs_f64());
            }
        }
        draft_cost = median(t);
    }
    let c1 = plain;
    println!("context {at}, {} threads, median of {reps}, backend {}{}", rayon::current_num_threads(), backend.name(), if drafter.is_empty() { String::new() } else { format!(", MTP drafter on {drafter}") });
    println!("plain decode step (greedy, as generation runs it): {:.3} ms", plain * 1e3);
    println!("tokens per verify step | ms | relative to one decode step | rollback to 1 token kept (ms) | relative");
    for (i, (c, r)) in costs.iter().zip(&rollback_costs).enumerate() {
        println!("{} | {:.2} | {:.3} | {:.3} | {:.3}", i + 1, c * 1e3, c / c1, r * 1e3, r / c1);
    }
    if draft_cost > 0.0 {
        println!("MTP draft step | {:.2} | {:.3}", draft_cost * 1e3, draft_cost / c1);
    }
    // Expected tokens and cost per step with k drafts each accepted with probability a (independently):
    // the rollback is paid unless all k are accepted.
    println!("draft k | acceptance | tokens per step | step cost (verify + k drafts + rollback) | decode rate vs plain (computed)");
    for k in 1..=4usize {
        for acc in [0.6f64, 0.8, 0.9] {
            let tokens = (1.0 - acc.powi(k as i32 + 1)) / (1.0 - acc);
            let cost = costs[k] + k as f64 * draft_cost + (1.0 - acc.powi(k as i32)) * rollback_costs[k];
            println!("{k} | {acc} | {tokens:.3} | {:.3} | {:.2}x", cost / c1, tokens * c1 / cost);
        }
    }
    if gen > 0 && eng.mtp.is_some() {
        end_to_end(&mut eng, &mut s, gen);
    }
}

/// Plain greedy against speculative greedy over `gen` tokens from the same state, with drafts right
/// at a set rate (see the top): measured rates, every cost of the loop included.
fn end_to_end(eng: &mut Engine, s: &mut Session, gen: usize) {
    let never = AtomicBool::new(false);
    let start = s.snapshot();
    let mut truth = Vec::new();
    let mut st = GenStats::default();
    let vocab = eng.cfg().n_vocab as u32;
    let runs = 3;
    // Plain: the best of `runs` (the first also records the decode step).
    let mut plain = f64::MAX;
    for _ in 0..runs {
        s.restore(start.clone());
        let mut ids = Vec::new();
        let t0 = Instant::now();
        s.generate(eng, gen, None, true, &mut |l| argmax(l), &mut |t| { ids.push(t); true }, &never, &mut st).unwrap();
        plain = plain.min(t0.elapsed().as_secs_f64());
        truth = ids;
    }
    println!("end to end: {gen} greedy tokens, plain {:.1} t/s (best of {runs})", gen as f64 / plain);
    println!("draft k | drafts right | accepted / drafted | t/s | vs plain (measured) | tokens equal");
    for k in 1..=3usize {
        eng.mtp.as_mut().expect("checked").opts = MtpOptions { draft: k, margin: 0.0, ..eng.mtp.as_ref().expect("checked").opts.clone() };
        for p in [0.6, 0.8, 0.9] {
            let mut best = f64::MAX;
            let (mut drafted, mut accepted, mut equal) = (0, 0, true);
            for run in 0..runs {
                s.restore(start.clone());
                let (mut sm, emitted) = ScriptedDrafts::new(stand_in(truth.clone(), p, 0x9e37 + run as u64 + 17 * k as u64, vocab));
                let mut ids = Vec::new();
                let mut st = GenStats::default();
                let t0 = Instant::now();
                s.generate_speculative(eng, gen, None, &mut sm, &mut |t| { ids.push(t); emitted.set(ids.len()); true }, &never, &mut st).unwrap();
                best = best.min(t0.elapsed().as_secs_f64());
                (drafted, accepted) = (st.drafted, st.accepted);
                equal &= ids == truth;
            }
            println!("{k} | {p} | {accepted} / {drafted} | {:.1} | {:.2}x | {equal}", gen as f64 / best, plain / best);
        }
    }
    s.restore(start);
}
