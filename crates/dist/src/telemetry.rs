//! Per-hop telemetry: one record per hop per request (the coordinator's own layers are hop `local`),
//! printed with `--debug` in the C engine's field order and kept (bounded) for tests and benchmarks.
use crate::exec::HopTiming;
use std::collections::VecDeque;
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
    pub timing: HopTiming,
}

fn ms(d: Duration) -> f64 { d.as_secs_f64() * 1e3 }
fn mib(b: usize) -> f64 { b as f64 / (1u64 << 20) as f64 }

impl HopRecord {
    pub fn line(&self) -> String {
        let hop = self.hop.map_or_else(|| "local".to_string(), |h| h.to_string());
        format!(
            "ds4: distributed telemetry: request={} hop={hop} layers={} pos={} tokens={} eval={:.3}ms downstream_wait={:.3}ms forward_send={:.3}ms input={:.2}MiB output={:.2}MiB",
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
