//! `--trace FILE`: a human-readable per-request log (kind, prompt/cache sizes and the reuse decision,
//! sampling, the rendered prompt, the output) for debugging prefix reuse and tool-call rendering.
use crate::kv_reuse::Prepared;
use crate::worker::Job;
use ds4_engine::GenStats;
use std::io::Write;
use std::sync::Mutex;

pub struct Trace {
    file: Option<Mutex<std::fs::File>>,
}

impl Trace {
    pub fn off() -> Self {
        Self { file: None }
    }

    pub fn open(path: &std::path::Path) -> std::io::Result<Self> {
        let f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self { file: Some(Mutex::new(f)) })
    }

    pub fn job(&self, seq: u64, job: &Job, prep: &Prepared, finish: &str, output: &str, stats: &GenStats) {
        let Some(f) = &self.file else { return };
        let Ok(mut f) = f.lock() else { return };
        let p = &job.params;
        let _ = writeln!(
            f,
            "=== request {seq} kind={} prompt_tokens={} cached={} prefilled={} decision={} live={} common={} thinking={} tools={} max_tokens={} temperature={} top_p={} top_k={} min_p={} seed={} scripted={}",
            job.kind,
            prep.prompt.len(),
            prep.cached,
            prep.prefilled,
            prep.decision.name(),
            prep.live_len,
            prep.live_common,
            p.thinking,
            p.parse_tools,
            p.max_tokens,
            p.sampling.temperature,
            p.sampling.top_p,
            p.sampling.top_k,
            p.sampling.min_p,
            p.sampling.seed,
            p.script.is_some()
        );
        if let Some(r) = &job.rendered {
            let _ = writeln!(f, "--- rendered prompt ({} bytes)\n{r}", r.len());
        }
        let _ = writeln!(f, "--- output ({} tokens, finish={finish})\n{output}\n=== end {seq}", stats.gen_tokens);
        let _ = f.flush();
    }
}
