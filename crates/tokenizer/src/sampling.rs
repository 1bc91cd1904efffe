//! Sampling: greedy / temperature + min_p + top_k + top_p with a seeded PRNG, and stop detection.
//!
//! Filter order (all on the temperature-scaled distribution): min_p (keep p ≥ min_p · p_max), then
//! top_k (0 = off), then top_p (smallest prefix of the sorted candidates whose mass ≥ top_p). Ties are
//! broken by lower id, so results are reproducible for a seed. NaN logits count as −∞.
//! Defaults follow ds4 (ds4-features.md §5.4): temperature 1, top_p 1, min_p 0.05, no top_k.

/// Sampler settings. `temperature <= 0` means greedy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerConfig {
    pub temperature: f32,
    /// 0 = no top-k cap.
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.05, seed: 0 }
    }
}

impl SamplerConfig {
    pub fn greedy() -> Self {
        Self { temperature: 0.0, ..Self::default() }
    }
}

/// xoshiro256** seeded through splitmix64 (small, fast, reproducible across platforms).
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Self { s: [next(), next(), next(), next()] }
    }

    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Reusable sampler. After the first call for a vocabulary size, `sample` allocates nothing.
#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
    force_greedy: bool,
    cand: Vec<(u32, f32)>,
}

fn key(l: f32) -> f32 {
    if l.is_nan() { f32::NEG_INFINITY } else { l }
}

/// Lanes of the vectorisable scans: a running value per lane, combined at the end (a scan carried
/// through one variable is a dependency chain of ~1 ns per logit: 0.15 ms over a 129k vocabulary).
const LANES: usize = 16;

fn larger(a: f32, b: f32) -> f32 { if b > a { b } else { a } }
fn smaller(a: f32, b: f32) -> f32 { if b < a { b } else { a } }

/// Index of the largest logit (lowest id on ties, NaN = −∞); 0 for an empty slice.
pub fn argmax(logits: &[f32]) -> u32 {
    top_two(logits).0
}

/// The top token (lowest id of the largest), the largest and the second largest logit (NaN = −∞; a
/// value present twice is both; −∞ for missing ones): a speculative draft and its margin in one pass
/// over the values.
pub fn top_two(logits: &[f32]) -> (u32, f32, f32) {
    let (first, second) = top_values(logits);
    (logits.iter().position(|&l| key(l) == first).unwrap_or(0) as u32, first, second)
}

fn top_values(logits: &[f32]) -> (f32, f32) {
    // Per lane: the second largest is the larger of the old second and the smaller of (old first, v).
    let (mut first, mut second) = ([f32::NEG_INFINITY; LANES], [f32::NEG_INFINITY; LANES]);
    let mut chunks = logits.chunks_exact(LANES);
    for c in &mut chunks {
        for j in 0..LANES {
            let v = key(c[j]);
            second[j] = larger(second[j], smaller(first[j], v));
            first[j] = larger(first[j], v);
        }
    }
    let merge = |(a, b): (f32, f32), (v, w): (f32, f32)| (larger(a, v), larger(larger(b, w), smaller(a, v)));
    let lanes = first.into_iter().zip(second).fold((f32::NEG_INFINITY, f32::NEG_INFINITY), merge);
    chunks.remainder().iter().fold(lanes, |t, &l| merge(t, (key(l), f32::NEG_INFINITY)))
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Self {
        Self { cfg, rng: Rng::new(cfg.seed), force_greedy: false, cand: Vec::new() }
    }

    /// Preallocate scratch for a vocabulary size.
    pub fn with_capacity(cfg: SamplerConfig, n_vocab: usize) -> Self {
        let mut s = Self::new(cfg);
        s.cand.reserve(n_vocab);
        s
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// When set, every `sample` call is greedy (ds4 samples DSML syntax tokens at temperature 0).
    /// Greedy steps do not advance the RNG.
    pub fn set_force_greedy(&mut self, on: bool) {
        self.force_greedy = on;
    }

    /// Whether every pick is the argmax now (temperature 0, top-k 1, or forced greedy).
    pub fn is_greedy(&self) -> bool {
        let c = self.cfg;
        self.force_greedy || c.temperature.is_nan() || c.temperature <= 0.0 || c.top_k == 1
    }

    /// Sample one token id.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.sample_greedy_if(logits, false)
    }

    /// Sample one token id, greedily when `greedy` is true (e.g. the DSML parser reports that the next
    /// token is syntax, see `dsml::DsmlParser::in_syntax`).
    pub fn sample_greedy_if(&mut self, logits: &[f32], greedy: bool) -> u32 {
        let Some(keep) = self.candidates(logits, greedy) else { return argmax(logits) };
        let mass: f64 = self.cand[..keep].iter().map(|x| x.1 as f64).sum();
        let r = self.rng.next_f64() * mass;
        let mut acc = 0.0;
        for x in &self.cand[..keep] {
            acc += x.1 as f64;
            if r < acc {
                return x.0;
            }
        }
        self.cand[keep - 1].0
    }

    /// The distribution `sample_greedy_if(logits, greedy)` draws from, as (id, probability) pairs that
    /// sum to 1 (one pair with probability 1 when it is greedy), in no particular order. Draws nothing.
    pub fn distribution(&mut self, logits: &[f32], greedy: bool, out: &mut Vec<(u32, f32)>) {
        out.clear();
        match self.candidates(logits, greedy) {
            None => out.push((argmax(logits), 1.0)),
            Some(keep) => {
                let mass: f64 = self.cand[..keep].iter().map(|x| x.1 as f64).sum();
                out.extend(self.cand[..keep].iter().map(|&(id, p)| (id, (p as f64 / mass) as f32)));
            }
        }
    }

    /// A uniform number in [0, 1) from the sampler's generator (speculative acceptance draws).
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }

    /// Fills `cand` with the filtered candidates (sorted by probability, then id) and returns how many
    /// of them top-p keeps; None when the pick is the argmax (greedy, top-k 1, no finite logit).
    fn candidates(&mut self, logits: &[f32], greedy: bool) -> Option<usize> {
        let c = self.cfg;
        if logits.is_empty() {
            return None;
        }
        if greedy || self.is_greedy() {
            return None;
        }
        let max = key(logits[argmax(logits) as usize]);
        if !max.is_finite() {
            return None;
        }
        let inv_t = 1.0 / c.temperature;
        let min_p = if c.min_p.is_finite() { c.min_p.clamp(0.0, 1.0) } else { 0.0 };
        self.cand.clear();
        for (i, &l) in logits.iter().enumerate() {
            let p = ((key(l) - max) * inv_t).exp(); // p_max = 1
            if p > 0.0 && p >= min_p {
                self.cand.push((i as u32, p));
            }
        }
        if self.cand.is_empty() {
            return None;
        }
        let cmp = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if c.top_k > 0 && c.top_k < self.cand.len() {
            self.cand.select_nth_unstable_by(c.top_k - 1, cmp);
            self.cand.truncate(c.top_k);
        }
        self.cand.sort_unstable_by(cmp);
        let total: f64 = self.cand.iter().map(|x| x.1 as f64).sum();
        let mut keep = self.cand.len();
        if c.top_p < 1.0 {
            let target = (c.top_p.max(0.0) as f64) * total;
            let mut acc = 0.0;
            for (i, x) in self.cand.iter().enumerate() {
                acc += x.1 as f64;
                if acc >= target {
                    keep = i + 1;
                    break;
                }
            }
        }
        Some(keep)
    }
}

/// Why generation stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    Eos(u32),
    /// Index into the stop-string list.
    StopString(usize),
}

/// Result of feeding one token to a [`StopMatcher`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopStep {
    /// Text safe to show now.
    pub emit: String,
    pub stop: Option<StopReason>,
}

/// Stop detection on EOS ids and on stop strings across token boundaries. Text that could be the
/// start of a stop string is held back until it is decided; the stop string itself is not emitted.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    eos: Vec<u32>,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new(stops: &[String], eos_ids: &[u32]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            eos: eos_ids.to_vec(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Text currently held back.
    pub fn held(&self) -> &str {
        &self.held
    }

    /// Feed one token id and its decoded text piece (from the stream decoder).
    pub fn push(&mut self, id: u32, text: &str) -> StopStep {
        if self.stopped {
            return StopStep::default();
        }
        if self.eos.contains(&id) {
            self.stopped = true;
            return StopStep { emit: std::mem::take(&mut self.held), stop: Some(StopReason::Eos(id)) };
        }
        self.push_text(text)
    }

    /// Feed text only (no EOS check).
    pub fn push_text(&mut self, text: &str) -> StopStep {
        if self.stopped {
            return StopStep::default();
        }
        self.held.push_str(text);
        // earliest complete stop string
        let mut best: Option<(usize, usize)> = None;
        for (k, s) in self.stops.iter().enumerate() {
            if let Some(p) = self.held.find(s.as_str()) {
                if best.is_none_or(|(bp, _)| p < bp) {
                    best = Some((p, k));
                }
            }
        }
        if let Some((p, k)) = best {
            self.stopped = true;
            let emit = self.held[..p].to_string();
            self.held.clear();
            return StopStep { emit, stop: Some(StopReason::StopString(k)) };
        }
        // hold back the longest suffix that is a proper prefix of some stop string
        let mut cut = self.held.len();
        for (i, _) in self.held.char_indices() {
            let suffix = &self.held[i..];
            if self.stops.iter().any(|s| s.len() > suffix.len() && s.starts_with(suffix)) {
                cut = i;
                break;
            }
        }
        let emit = self.held[..cut].to_string();
        self.held.drain(..cut);
        StopStep { emit, stop: None }
    }

    /// End of generation without a stop: release held text.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}
