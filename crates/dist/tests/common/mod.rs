#![allow(dead_code)]
//! Shared test helpers: a tiny synthetic model, a single-process reference, coordinators and
//! workers on loopback.
use ds4_dist::coordinator::{CoordConfig, Coordinator};
use ds4_dist::exec::LocalStage;
use ds4_dist::route::{DistSession, RouteOptions};
use ds4_dist::worker::{load_stage, serve, WorkerOptions};
use ds4_engine::LoadOptions;
use ds4_gguf::GgufFile;
use ds4_model::synth::{self, Mix, SynthSpec};
use ds4_model::{Config, LayerRange, Logits, Options, Stage, Weights};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// How test workers load their layers (CPU, the tests' context).
#[allow(dead_code)]
pub fn load_opts() -> LoadOptions { LoadOptions { ctx: CTX, ..LoadOptions::default() } }

pub const CTX: usize = 512;

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("ds4-dist-tests-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn make(name: &str, mix: Mix, seed: u64) -> PathBuf {
    let p = dir().join(name);
    if !p.exists() {
        let tmp = p.with_extension("tmp");
        synth::write(&SynthSpec { shape: "tiny", mix, seed, layers: None, vocab: None }, &tmp, |_, _| {}).unwrap();
        std::fs::rename(&tmp, &p).unwrap();
    }
    p
}

/// The tiny model (6 layers, vocab 512), Q4 mix.
pub fn model() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| make("tiny-q4.gguf", Mix::Q4, 7))
}

/// Same shape, different quantization: a different model.
pub fn other_model() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| make("tiny-q2.gguf", Mix::Q2, 7))
}

/// Same metadata and tensor table as [`model`], other weights (another seed): a different model
/// that only the weights fingerprint tells apart.
pub fn reseeded_model() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| make("tiny-q4-seed8.gguf", Mix::Q4, 8))
}

pub fn load(path: &Path, layers: &str) -> (LocalStage, Config, Arc<GgufFile>) {
    let file = Arc::new(GgufFile::open(path).unwrap());
    let cfg = Config::from_gguf(&file).unwrap();
    let range = LayerRange::parse(layers, cfg.n_layer).unwrap();
    let w = Weights::bind(file.clone(), &cfg, range).unwrap();
    (LocalStage::new(Stage::new(cfg.clone(), w, Options::default()), CTX), cfg, file)
}

/// Single process: prefill in `chunk`s, then greedy decode; (tokens, logits after each step).
pub fn reference(prompt: &[u32], chunk: usize, n_gen: usize) -> (Vec<u32>, Vec<Vec<f32>>) { reference_on(model(), prompt, chunk, n_gen) }

/// [`reference`] on the model at `path`.
pub fn reference_on(path: &Path, prompt: &[u32], chunk: usize, n_gen: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let file = Arc::new(GgufFile::open(path).unwrap());
    let cfg = Config::from_gguf(&file).unwrap();
    let w = Weights::bind(file, &cfg, LayerRange::full(&cfg)).unwrap();
    let mut st = Stage::new(cfg, w, Options::default());
    let mut kv = st.new_kv(CTX);
    let mut logits = Vec::new();
    for c in prompt.chunks(chunk) {
        logits = st.forward(&mut kv, c, None, Logits::Last).unwrap().to_vec();
    }
    let mut toks = Vec::new();
    let mut all = vec![logits.clone()];
    for _ in 0..n_gen {
        let t = argmax(&logits);
        toks.push(t);
        logits = st.forward(&mut kv, &[t], None, Logits::Last).unwrap().to_vec();
        all.push(logits.clone());
    }
    (toks, all)
}

pub fn argmax(l: &[f32]) -> u32 {
    let mut b = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[b] {
            b = i;
        }
    }
    b as u32
}

pub fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed * 97) >> 7) % 500 + 3).collect()
}

pub struct Coord {
    pub coord: Arc<Coordinator>,
    pub addr: String,
}

pub fn coordinator(local: &str, bits: u8, token: Option<&str>, timeout: Duration, chunk: usize) -> (Coord, LocalStage) {
    coordinator_on(model(), local, bits, token, timeout, chunk)
}

/// [`coordinator`] on the model at `path`.
pub fn coordinator_on(path: &Path, local: &str, bits: u8, token: Option<&str>, timeout: Duration, chunk: usize) -> (Coord, LocalStage) {
    let (stage, cfg, file) = load(path, local);
    let range = LayerRange::parse(local, cfg.n_layer).unwrap();
    let coord = Arc::new(
        Coordinator::start(CoordConfig {
            listen: "127.0.0.1:0".into(),
            file,
            cfg,
            local: range,
            ctx: CTX,
            bits,
            token: token.map(String::from),
            timeout,
            max_chunk: chunk,
            debug: false,
        })
        .unwrap(),
    );
    let addr = coord.addr.to_string();
    (Coord { coord, addr }, stage)
}

pub fn session(c: &Coord, stage: LocalStage, bits: u8, chunk: usize) -> DistSession {
    let opts = RouteOptions { bits, prefill_bits: None, prefill_chunk: chunk, auto_chunk: false, prefill_window: None, replay_check: true, debug: std::env::var_os("DS4_TEST_DEBUG").is_some() };
    DistSession::new(stage, Some(c.coord.clone()), opts)
}

pub struct ThreadWorker {
    pub stop: Arc<AtomicBool>,
    pub join: Option<JoinHandle<ds4_dist::Result<()>>>,
}

impl ThreadWorker {
    pub fn finish(mut self) -> ds4_dist::Result<()> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.join.take().unwrap().join().unwrap()
    }
}

impl Drop for ThreadWorker {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

/// A worker in a thread of this process.
pub fn thread_worker(path: &Path, layers: &str, addr: &str, token: Option<&str>, timeout: Duration) -> ThreadWorker {
    let opts = WorkerOptions { load: load_opts(), token: token.map(String::from), timeout, ..WorkerOptions::default() };
    thread_worker_with(path, layers, addr, opts)
}

/// A worker in a thread of this process with the given options (`stop` is the worker's own).
pub fn thread_worker_with(path: &Path, layers: &str, addr: &str, opts: WorkerOptions) -> ThreadWorker {
    let (stage, reg) = load_stage(path, layers, &load_opts()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let opts = WorkerOptions { stop: stop.clone(), ..opts };
    let addr = addr.to_string();
    let join = std::thread::spawn(move || serve(stage, reg, &addr, &opts));
    ThreadWorker { stop, join: Some(join) }
}

/// A worker process (the `ds4-dist-worker` binary), killed on drop.
pub struct ProcWorker {
    pub child: std::process::Child,
}

impl ProcWorker {
    pub fn pid(&self) -> i32 { self.child.id() as i32 }
    pub fn signal(&self, sig: &str) {
        let _ = std::process::Command::new("kill").arg(format!("-{sig}")).arg(self.pid().to_string()).status();
    }
}

impl Drop for ProcWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn proc_worker(path: &Path, layers: &str, addr: &str, extra: &[&str]) -> ProcWorker {
    proc_worker_env(path, layers, addr, extra, &[])
}

pub fn proc_worker_env(path: &Path, layers: &str, addr: &str, extra: &[&str], env: &[(&str, &str)]) -> ProcWorker {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_ds4-dist-worker"))
        .envs(env.iter().copied())
        .args(["-m", path.to_str().unwrap(), "--ctx", &CTX.to_string(), "--threads", "1", "--role", "worker", "--layers", layers, "--coordinator", host, port, "--dist-timeout-s", "2"])
        .args(extra)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    ProcWorker { child }
}

/// The larger of two error measures, NaN counting as unbounded (`f32::max` would skip it).
pub fn nan_max(a: f32, b: f32) -> f32 { if a.is_nan() || b.is_nan() { f32::INFINITY } else { a.max(b) } }
