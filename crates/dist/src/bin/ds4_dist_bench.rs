//! `ds4-dist-bench`: a 2-stage route on loopback against the single process on the same model.
//! Reports decode tokens/s (ratio to single process), pipelined vs sequential prefill, and the
//! per-hop eval time per layer next to the single-process time per layer.
use clap::Parser;
use ds4_dist::coordinator::{CoordConfig, Coordinator};
use ds4_dist::exec::LocalStage;
use ds4_dist::route::{DistSession, RouteOptions};
use ds4_dist::worker::{load_stage, serve, WorkerOptions};
use ds4_engine::LoadOptions;
use ds4_gguf::GgufFile;
use ds4_model::synth::{self, Mix, SynthSpec};
use ds4_model::{Config, LayerRange, Options, Stage, Weights};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(name = "ds4-dist-bench", about = "2-stage loopback route vs single process")]
struct Args {
    /// Model (default: the tiny synthetic model, generated into a temp dir).
    #[arg(short = 'm', long = "model")]
    model: Option<PathBuf>,
    /// Coordinator's local layers 0:K (the worker takes K+1:output). Default: half.
    #[arg(long = "split")]
    split: Option<usize>,
    #[arg(long = "prompt-tokens", default_value_t = 1024)]
    prompt_tokens: usize,
    #[arg(long = "gen-tokens", default_value_t = 128)]
    gen_tokens: usize,
    #[arg(long = "chunk", default_value_t = 64)]
    chunk: usize,
    #[arg(long = "window")]
    window: Option<usize>,
    #[arg(long = "bits", default_value_t = 32)]
    bits: u8,
    #[arg(long = "reps", default_value_t = 3)]
    reps: usize,
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
}

fn local(path: &std::path::Path, range: LayerRange, ctx: usize) -> (LocalStage, Config, Arc<GgufFile>) {
    let file = Arc::new(GgufFile::open(path).expect("model"));
    let cfg = Config::from_gguf(&file).expect("config");
    let w = Weights::bind(file.clone(), &cfg, range).expect("weights");
    (LocalStage::new(Stage::new(cfg.clone(), w, Options::default()), ctx), cfg, file)
}

fn argmax(l: &[f32]) -> u32 {
    let mut b = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[b] {
            b = i;
        }
    }
    b as u32
}

/// (prefill seconds, decode tokens/s with full logits, decode tokens/s with last-stage greedy).
fn measure(s: &mut DistSession, prompt: &[u32], gen: usize) -> (f64, f64, f64) {
    s.reset();
    let t0 = Instant::now();
    let mut next = argmax(s.sync(prompt).expect("prefill"));
    let pt = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    for _ in 0..gen {
        next = argmax(s.step(next).expect("decode"));
    }
    let logits_tps = gen as f64 / t1.elapsed().as_secs_f64();
    s.reset();
    let mut next = argmax(s.sync(prompt).expect("prefill"));
    let t2 = Instant::now();
    for _ in 0..gen {
        next = s.step_greedy(next, 0).expect("decode").id;
    }
    let greedy_tps = gen as f64 / t2.elapsed().as_secs_f64();
    (pt, logits_tps, greedy_tps)
}

fn best(v: &[(f64, f64, f64)]) -> (f64, f64, f64) {
    let p = v.iter().map(|x| x.0).fold(f64::MAX, f64::min);
    let l = v.iter().map(|x| x.1).fold(0.0, f64::max);
    let g = v.iter().map(|x| x.2).fold(0.0, f64::max);
    (p, l, g)
}

fn main() {
    let a = Args::parse();
    if let Some(t) = a.threads {
        rayon::ThreadPoolBuilder::new().num_threads(t).build_global().unwrap();
    }
    let path = a.model.clone().unwrap_or_else(|| {
        let p = std::env::temp_dir().join("ds4-dist-bench-tiny-q4.gguf");
        if !p.exists() {
            synth::write(&SynthSpec { shape: "tiny", mix: Mix::Q4, seed: 7, layers: None, vocab: None }, &p, |_, _| {}).expect("synth");
        }
        p
    });
    let ctx = a.prompt_tokens + a.gen_tokens + 8;
    let (full, cfg, file) = local(&path, LayerRange { first: 0, last: 0, embed: true, head: true }, ctx);
    drop(full);
    let n = cfg.n_layer;
    let k = a.split.unwrap_or(n / 2 - 1).min(n - 2);
    let prompt: Vec<u32> = (0..a.prompt_tokens as u32).map(|i| (i.wrapping_mul(2654435761) >> 7) % (cfg.n_vocab as u32 - 3) + 3).collect();
    println!(
        "model {} ({} layers, embd {}, vocab {}), threads {}, prompt {} tokens, gen {} tokens, chunk {}, bits {}",
        path.display(),
        n,
        cfg.n_embd,
        cfg.n_vocab,
        rayon::current_num_threads(),
        a.prompt_tokens,
        a.gen_tokens,
        a.chunk,
        a.bits
    );

    // Single process: the same route code with one local stage.
    let (st, _, _) = local(&path, LayerRange::full(&cfg), ctx);
    let mut single = DistSession::new(st, None, RouteOptions { prefill_chunk: a.chunk, ..Default::default() });
    let _ = measure(&mut single, &prompt[..a.chunk.min(prompt.len())], 4);
    let sr: Vec<_> = (0..a.reps).map(|_| measure(&mut single, &prompt, a.gen_tokens)).collect();
    let (sp, sl, sg) = best(&sr);
    let single_eval: Duration = single.telemetry.records().filter(|r| r.tokens == 1).map(|r| r.timing.eval).sum();
    let single_steps = single.telemetry.records().filter(|r| r.tokens == 1).count();
    drop(single);

    // 2-stage route on loopback: coordinator 0:k, worker k+1:output in a thread of this process.
    let range = LayerRange { first: 0, last: k, embed: true, head: false };
    let (st, _, _) = local(&path, range, ctx);
    let coord = Arc::new(
        Coordinator::start(CoordConfig {
            listen: "127.0.0.1:0".into(),
            file,
            cfg: cfg.clone(),
            local: range,
            ctx,
            bits: a.bits,
            token: None,
            timeout: Duration::from_secs(10),
            max_chunk: a.chunk,
            debug: false,
        })
        .expect("coordinator"),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let load = LoadOptions { ctx, ..LoadOptions::default() };
    let (wst, reg) = load_stage(&path, &format!("{}:output", k + 1), &load).expect("worker stage");
    let addr = coord.addr.to_string();
    let wopts = WorkerOptions { load, stop: stop.clone(), ..WorkerOptions::default() };
    let wj = std::thread::spawn(move || serve(wst, reg, &addr, &wopts));
    coord.wait_complete(Duration::from_secs(30)).expect("route");
    let mut route = DistSession::new(st, Some(coord.clone()), RouteOptions { bits: a.bits, prefill_chunk: a.chunk, prefill_window: a.window, ..Default::default() });
    let _ = measure(&mut route, &prompt[..a.chunk.min(prompt.len())], 4);
    route.telemetry.clear();
    let rr: Vec<_> = (0..a.reps).map(|_| measure(&mut route, &prompt, a.gen_tokens)).collect();
    let (rp, rl, rg) = best(&rr);
    let per_hop = route.telemetry.eval_by_hop();
    let decode_recs: Vec<_> = route.telemetry.records().filter(|r| r.tokens == 1).cloned().collect();
    // Sequential prefill on the same route (window 1: no overlap) for the pipelining speedup.
    route.opts.prefill_window = Some(1);
    let seq: f64 = (0..a.reps)
        .map(|_| {
            route.reset();
            let t0 = Instant::now();
            route.sync(&prompt).expect("prefill");
            t0.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min);
    stop.store(true, Ordering::SeqCst);
    drop(route);
    let _ = wj.join();

    let pt = a.prompt_tokens as f64;
    println!("single process: prefill {:.1} t/s, decode {:.1} t/s (logits) / {:.1} t/s (greedy)", pt / sp, sl, sg);
    println!(
        "2-stage route (local 0:{k} -> worker {}:output): prefill {:.1} t/s pipelined, {:.1} t/s sequential (window 1) -> pipelining speedup {:.2}x; vs single process {:.2}x",
        k + 1,
        pt / rp,
        pt / seq,
        seq / rp,
        sp / rp
    );
    println!(
        "decode: route {:.1} t/s (full logits back) / {:.1} t/s (last stage samples, token id back); ratio to single process {:.3} / {:.3}",
        rl,
        rg,
        rl / sl,
        rg / sg
    );
    let single_ms_layer = single_eval.as_secs_f64() * 1e3 / single_steps.max(1) as f64 / n as f64;
    println!("per-layer decode eval: single process {single_ms_layer:.4} ms/layer/token");
    for (hop, layers) in [(None, range), (Some(1), LayerRange { first: k + 1, last: n - 1, embed: false, head: true })] {
        let r: Vec<_> = decode_recs.iter().filter(|x| x.hop == hop).collect();
        let ms = |f: &dyn Fn(&ds4_dist::telemetry::HopRecord) -> Duration| r.iter().map(|x| f(x).as_secs_f64()).sum::<f64>() * 1e3 / r.len().max(1) as f64;
        let eval = ms(&|x| x.timing.eval);
        println!(
            "  hop {:>5} layers {:>9}: eval {:.4} ms/token = {:.4} ms/layer/token ({:.2}x single), downstream_wait {:.4} ms, forward_send {:.4} ms",
            hop.map_or("local".to_string(), |h| h.to_string()),
            layers.label(),
            eval,
            eval / (layers.last - layers.first + 1) as f64,
            eval / (layers.last - layers.first + 1) as f64 / single_ms_layer,
            ms(&|x| x.timing.downstream_wait),
            ms(&|x| x.timing.forward_send)
        );
    }
    let _ = per_hop;
}
