//! The cost of one verify step of 1 + k tokens (k = 0..4) relative to a plain decode step, on the CPU
//! backend, at a given context: what MTP speculation pays per step. Each step is journaled and rolled
//! back, so every repetition runs at the same position. With an MTP file, also the cost of one draft
//! step (the MTP block, its input and its head: where the engine drafts, i.e. on the device for a GPU
//! backend, with the logits row brought back as a session's draft step does). Prints the decode rate these costs give at acceptance rates 0.6 / 0.8 / 0.9
//! (computed from the measured costs, assuming each draft is accepted independently with that rate).
//!
//! cargo run --release -p ds4-engine --example mtp_step_costs -- MODEL [--mtp FILE] [--ctx-at N] [--reps N] [--backend cpu|cuda|vulkan|metal]
//! (a GPU backend needs the stage's KV journal: `Engine::kv_begin_journal` / `kv_rollback`.)
use ds4_engine::{Backend, Engine, LoadOptions, MtpOptions, Session};
use ds4_model::Logits;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

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
    let (mut mtp, mut at, mut reps, mut backend) = (None::<PathBuf>, 512usize, 7usize, Backend::Cpu);
    while let Some(f) = a.next() {
        let v = a.next().unwrap_or_else(|| usage());
        match f.as_str() {
            "--mtp" => mtp = Some(PathBuf::from(v)),
            "--ctx-at" => at = v.parse().unwrap_or_else(|_| usage()),
            "--reps" => reps = v.parse().unwrap_or_else(|_| usage()),
            "--backend" => backend = Backend::parse(&v).unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    let opts = LoadOptions { ctx: at + 16, prefill_chunk: 256, backend, mtp: mtp.map(|p| MtpOptions { path: p, draft: 4, margin: 0.0 }), ..LoadOptions::default() };
    let mut eng = Engine::load(&PathBuf::from(&model), &opts).unwrap_or_else(|e| panic!("{model}: {e}"));
    let v = eng.cfg().n_vocab as u64;
    let prompt: Vec<u32> = (0..at as u64).map(|i| ((i * 2654435761) % v) as u32).collect();
    let mut s = Session::new(&eng);
    s.sync(&mut eng, &prompt, &mut |_, _| {}, &AtomicBool::new(false)).unwrap();
    let mut costs = Vec::new();
    for n in 1..=5usize {
        let toks: Vec<u32> = (0..n as u32).map(|i| (i * 7 + 3) % v as u32).collect();
        let mut t = Vec::new();
        for r in 0..reps + 1 {
            let p0 = s.kv.pos;
            eng.kv_begin_journal(&mut s.kv).unwrap_or_else(|e| panic!("{e}"));
            let t0 = Instant::now();
            eng.forward(&mut s.kv, &toks, None, Logits::All).unwrap();
            let dt = t0.elapsed().as_secs_f64();
            eng.kv_rollback(&mut s.kv, p0).unwrap();
            eng.kv_end_journal(&mut s.kv);
            if r > 0 {
                t.push(dt);
            }
        }
        costs.push(median(t));
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
    let c1 = costs[0];
    println!("context {at}, {} threads, median of {reps}, backend {}{}", rayon::current_num_threads(), backend.name(), if drafter.is_empty() { String::new() } else { format!(", MTP drafter on {drafter}") });
    println!("tokens per verify step | ms | relative to one decode step");
    for (i, c) in costs.iter().enumerate() {
        println!("{} | {:.2} | {:.3}", i + 1, c * 1e3, c / c1);
    }
    if draft_cost > 0.0 {
        println!("MTP draft step | {:.2} | {:.3}", draft_cost * 1e3, draft_cost / c1);
    }
    println!("draft k | acceptance | tokens per step | step cost (verify + k drafts) | decode rate vs plain");
    for k in 1..=4usize {
        for acc in [0.6f64, 0.8, 0.9] {
            let tokens = (1.0 - acc.powi(k as i32 + 1)) / (1.0 - acc);
            let cost = costs[k] + k as f64 * draft_cost;
            println!("{k} | {acc} | {tokens:.3} | {:.3} | {:.2}x", cost / c1, tokens * c1 / cost);
        }
    }
}
