//! Per-hop telemetry: one record per hop per request (the coordinator's own layers are hop `local`),
//! printed with `--debug` in the C engine's field order and kept (bounded) for tests and benchmarks.
//! Prefill chunks carry their index (`chunk=k/n`). Every record also goes into process-wide totals
//! per phase and hop ([`prometheus`]: the server's `/metrics` on a coordinator).
use crate::exec::HopTiming;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct HopRecord {
    pub request: u64,
    /// None for the coordinator's local layers.
    pub hop: Option<usize>,
    pub layers: String,
    pub location: String,
    pub pos: usize,
    pub tokens: usize,
    /// Prefill: (index, count) of the chunk; None for a decode step.
    pub chunk: Option<(usize, usize)>,
    pub timing: HopTiming,
}

fn ms(d: Duration) -> f64 { d.as_secs_f64() * 1e3 }
fn mib(b: usize) -> f64 { b as f64 / (1u64 << 20) as f64 }

impl HopRecord {
    pub fn line(&self) -> String {
        let hop = self.hop.map_or_else(|| "local".to_string(), |h| h.to_string());
        let phase = match self.chunk {
            Some((k, n)) => format!("prefill chunk={}/{n}", k + 1),
            None => "decode".to_string(),
        };
        format!(
            "ds4: distributed telemetry: request={} hop={hop} layers={} {phase} pos={} tokens={} eval={:.3}ms downstream_wait={:.3}ms forward_send={:.3}ms input={:.2}MiB output={:.2}MiB",
            self.request,
            self.layers,
            self.pos,
            self.tokens,
            ms(self.timing.eval),
            ms(self.timing.downstream_wait),
            ms(self.timing.forward_send),
            mib(self.timing.input_bytes),
            mib(self.timing.output_bytes)
        )
    }
}

/// Bounded record log.
pub struct Telemetry {
    pub debug: bool,
    records: VecDeque<HopRecord>,
    cap: usize,
}

impl Telemetry {
    pub fn new(debug: bool) -> Self { Self { debug, records: VecDeque::new(), cap: 8192 } }

    pub fn push(&mut self, r: HopRecord) {
        if self.debug {
            eprintln!("{}", r.line());
        }
        add_total(&r);
        if self.records.len() == self.cap {
            self.records.pop_front();
        }
        self.records.push_back(r);
    }

    pub fn records(&self) -> impl Iterator<Item = &HopRecord> { self.records.iter() }
    pub fn clear(&mut self) { self.records.clear(); }

    /// Sum of eval time per hop label (local first), for reports.
    pub fn eval_by_hop(&self) -> Vec<(String, Duration, usize)> {
        let mut v: Vec<(String, Duration, usize)> = Vec::new();
        for r in &self.records {
            let k = format!("{} {}", r.hop.map_or_else(|| "local".into(), |h| format!("hop{h}")), r.layers);
            match v.iter_mut().find(|e| e.0 == k) {
                Some(e) => {
                    e.1 += r.timing.eval;
                    e.2 += r.tokens;
                }
                None => v.push((k, r.timing.eval, r.tokens)),
            }
        }
        v
    }
}

/// Sums per (phase, hop, layers): records, tokens, seconds of compute / send / wait, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals {
    pub records: u64,
    pub tokens: u64,
    pub eval_s: f64,
    pub send_s: f64,
    pub wait_s: f64,
    pub input_bytes: u64,
    pub output_bytes: u64,
}

type Key = (&'static str, String, String);
static TOTALS: Mutex<BTreeMap<Key, Totals>> = Mutex::new(BTreeMap::new());

fn add_total(r: &HopRecord) {
    let phase = if r.chunk.is_some() { "prefill" } else { "decode" };
    let hop = r.hop.map_or_else(|| "local".to_string(), |h| h.to_string());
    if let Ok(mut m) = TOTALS.lock() {
        let t = m.entry((phase, hop, r.layers.clone())).or_default();
        t.records += 1;
        t.tokens += r.tokens as u64;
        t.eval_s += r.timing.eval.as_secs_f64();
        t.send_s += r.timing.forward_send.as_secs_f64();
        t.wait_s += r.timing.downstream_wait.as_secs_f64();
        t.input_bytes += r.timing.input_bytes as u64;
        t.output_bytes += r.timing.output_bytes as u64;
    }
}

/// The process-wide totals, by (phase, hop, layers).
pub fn totals() -> Vec<((String, String, String), Totals)> {
    TOTALS.lock().map(|m| m.iter().map(|((p, h, l), t)| ((p.to_string(), h.clone(), l.clone()), *t)).collect()).unwrap_or_default()
}

/// The totals as Prometheus text (counters labelled `phase`, `hop`, `layers`); empty before the
/// first record.
pub fn prometheus() -> String {
    use std::fmt::Write;
    let all = totals();
    let mut s = String::new();
    if all.is_empty() {
        return s;
    }
    type Metric = (&'static str, &'static str, fn(&Totals) -> f64);
    let metrics: [Metric; 7] = [
        ("ds4_dist_hop_records_total", "Hop records (prefill chunks or decode steps) per stage.", |t| t.records as f64),
        ("ds4_dist_hop_tokens_total", "Tokens through each stage.", |t| t.tokens as f64),
        ("ds4_dist_hop_compute_seconds_total", "Compute time of each stage (eval).", |t| t.eval_s),
        ("ds4_dist_hop_send_seconds_total", "Time writing the request frame to each worker (forward_send).", |t| t.send_s),
        ("ds4_dist_hop_wait_seconds_total", "Time waiting for each worker's reply beyond its compute (downstream_wait).", |t| t.wait_s),
        ("ds4_dist_hop_input_bytes_total", "Activation bytes into each stage.", |t| t.input_bytes as f64),
        ("ds4_dist_hop_output_bytes_total", "Bytes out of each stage (activations, logits or a token).", |t| t.output_bytes as f64),
    ];
    for (name, help, f) in metrics {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter");
        for ((phase, hop, layers), t) in &all {
            let _ = writeln!(s, "{name}{{phase=\"{phase}\",hop=\"{hop}\",layers=\"{layers}\"}} {}", f(t));
        }
    }
    s
}
