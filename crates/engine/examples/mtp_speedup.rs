//! Measures MTP speculative decoding against plain greedy decoding on the CPU: the same prompts, the
//! same number of tokens, each run `--rounds` times; checks that both give the same tokens and prints
//! the acceptance rate, the decode rates and the speed-up.
//!
//! cargo run --release -p ds4-engine --example mtp_speedup -- MODEL MTP [--draft N] [--margin F]
//!     [--tokens N] [--rounds N] --prompt 1,2,3 [--prompt ...]
use ds4_engine::{Engine, GenStats, LoadOptions, MtpOptions, Session};
use ds4_tokenizer::sampling::{argmax, Sampler, SamplerConfig};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

fn main() {
    let mut a = std::env::args().skip(1);
    let usage = || -> ! {
        eprintln!("usage: mtp_speedup MODEL MTP [--draft N] [--margin F] [--tokens N] [--rounds N] --prompt 1,2,3 [--prompt ...]");
        std::process::exit(2)
    };
    let (Some(model), Some(mtp)) = (a.next(), a.next()) else { usage() };
    let (mut draft, mut margin, mut tokens, mut rounds, mut prompts) = (2usize, 0f32, 32usize, 5usize, Vec::<Vec<u32>>::new());
    while let Some(f) = a.next() {
        let v = a.next().unwrap_or_else(|| usage());
        match f.as_str() {
            "--draft" => draft = v.parse().unwrap_or_else(|_| usage()),
            "--margin" => margin = v.parse().unwrap_or_else(|_| usage()),
            "--tokens" => tokens = v.parse().unwrap_or_else(|_| usage()),
            "--rounds" => rounds = v.parse().unwrap_or_else(|_| usage()),
            "--prompt" => prompts.push(v.split(',').map(|t| t.trim().parse().unwrap_or_else(|_| usage())).collect()),
            _ => usage(),
        }
    }
    if prompts.is_empty() {
        usage();
    }
    let opts = |m: Option<MtpOptions>| LoadOptions { ctx: 4096, prefill_chunk: 64, quiet: true, mtp: m, ..LoadOptions::default() };
    let mut plain = Engine::load(&PathBuf::from(&model), &opts(None)).unwrap_or_else(|e| panic!("{model}: {e}"));
    let mut spec = Engine::load(&PathBuf::from(&model), &opts(Some(MtpOptions { path: PathBuf::from(&mtp), draft, margin }))).unwrap_or_else(|e| panic!("{mtp}: {e}"));
    let never = AtomicBool::new(false);
    let (mut tp, mut ts) = (GenStats::default(), GenStats::default());
    for _ in 0..rounds {
        for p in &prompts {
            let mut s = Session::new(&plain);
            s.sync(&mut plain, p, &mut |_, _| {}, &never).unwrap();
            let mut want = Vec::new();
            s.generate(&mut plain, tokens, None, true, &mut |l| argmax(l), &mut |t| { want.push(t); true }, &never, &mut tp).unwrap();
            let mut s = Session::new(&spec);
            s.sync(&mut spec, p, &mut |_, _| {}, &never).unwrap();
            let mut got = Vec::new();
            let mut g = Sampler::new(SamplerConfig::greedy());
            s.generate_speculative(&mut spec, tokens, None, &mut g, &mut |t| { got.push(t); true }, &never, &mut ts).unwrap();
            assert_eq!(got, want, "speculative greedy differs from plain greedy for {p:?}");
        }
    }
    println!(
        "draft {draft} margin {margin}: {} prompts x {rounds} rounds x {tokens} tokens, identical tokens; drafted {} accepted {} (acceptance {:.3}); plain {:.1} t/s, mtp {:.1} t/s, speed-up {:.2}x; threads {}",
        prompts.len(),
        ts.drafted,
        ts.accepted,
        ts.acceptance(),
        tp.gen_tps(),
        ts.gen_tps(),
        ts.gen_tps() / tp.gen_tps(),
        rayon::current_num_threads()
    );
}
