//! ds4's diagnostic modes: `--inspect` (model summary), `--dump-tokens` (the prompt's token ids),
//! `--perplexity-file` (teacher-forced perplexity of a text), `--dump-logits` (next-token logits).
use ds4_engine::Engine;
use ds4_model::Logits;
use ds4_tokenizer::Tokenizer;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::AtomicBool;

/// `--inspect`: what was loaded (printed by the caller), then exit.
pub fn inspect(path: &Path, eng: &Engine) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let c = eng.cfg();
    let ratios = |r: usize| c.compress_ratios.iter().filter(|&&x| x == r).count();
    let _ = writeln!(s, "model: {}", path.display());
    let _ = writeln!(s, "backend: {:?}, context {} tokens, prefill chunk {}", eng.backend(), eng.ctx, eng.prefill_chunk);
    let _ = writeln!(s, "layers {}: embedding {}, vocabulary {}, {} heads × {} (rope {}), sliding window {}", c.n_layer, c.n_embd, c.n_vocab, c.n_head, c.head_dim, c.rope_dim, c.swa);
    let _ = writeln!(s, "experts: {} routed (top {}), {} shared, width {}; {} hash-routed layers", c.n_expert, c.n_expert_used, c.n_shared, c.ff_exp, c.n_hash_layer);
    let _ = writeln!(s, "compression: {} raw-only layers, {} at ratio 4 (indexer {} heads × {}, top {}), {} at ratio 128", ratios(0), ratios(4), c.idx_heads, c.idx_dim, c.idx_topk, ratios(128));
    let _ = writeln!(s, "hyper-connections: {} streams, {} Sinkhorn iterations", c.n_hc, c.sinkhorn_iters);
    if let Ok(t) = eng.tokenizer() {
        let _ = writeln!(s, "tokenizer: {} tokens", t.n_vocab());
    }
    let _ = writeln!(s, "memory plan: {:.3} GiB", eng.plan.total() as f64 / (1u64 << 30) as f64);
    s
}

/// `--dump-tokens`: the prompt tokenized exactly as written (special tokens recognised), one
/// `ID<TAB>"text"` line per token.
pub fn dump_tokens(tok: &Tokenizer, text: &str) -> String {
    let mut s = String::new();
    for id in tok.encode(text) {
        s += &format!("{id}\t{:?}\n", tok.token_text(id));
    }
    s
}

/// The tokenizer of a model file, without loading its weights.
pub fn file_tokenizer(path: &Path) -> Result<Tokenizer, String> {
    let f = ds4_gguf::GgufFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Tokenizer::from_gguf(&f).map_err(|e| format!("{}: {e}", path.display()))
}

/// Perplexity of a text under the model.
pub struct Perplexity {
    pub tokens: usize,
    pub mean_nll: f64,
}

/// `--perplexity-file`: BOS, then the text's tokens; each token's negative log-likelihood given the
/// tokens before it (teacher forcing), over at most the context size.
pub fn perplexity(eng: &mut Engine, tok: &Tokenizer, text: &str, cancel: &AtomicBool) -> Result<Perplexity, String> {
    let bos = tok.chat_ids().map_err(|e| e.to_string())?.bos;
    let mut ids = vec![bos];
    ids.extend(tok.encode(text));
    if ids.len() < 2 {
        return Err("the perplexity file has no tokens".into());
    }
    if ids.len() > eng.ctx {
        eprintln!("ds4: the text has {} tokens; scoring the first {} (--ctx)", ids.len() - 1, eng.ctx - 1);
        ids.truncate(eng.ctx);
    }
    let vocab = eng.cfg().n_vocab;
    let mut kv = eng.new_kv();
    let mut nll = 0.0f64;
    let chunk = eng.prefill_chunk.max(1);
    // Logits at position i predict token i + 1; the last position predicts nothing.
    let inputs = &ids[..ids.len() - 1];
    for (c, part) in inputs.chunks(chunk).enumerate() {
        if cancel.load(std::sync::atomic::Ordering::SeqCst) {
            return Err("interrupted".into());
        }
        let logits = eng.forward(&mut kv, part, None, Logits::All).map_err(|e| e.to_string())?;
        for (j, row) in logits.chunks_exact(vocab).enumerate() {
            let next = ids[c * chunk + j + 1] as usize;
            nll -= log_softmax_at(row, next);
        }
    }
    let n = inputs.len();
    Ok(Perplexity { tokens: n, mean_nll: nll / n as f64 })
}

/// log p(`i`) under softmax(`row`).
fn log_softmax_at(row: &[f32], i: usize) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
    row[i] as f64 - max - s.ln()
}

/// `--dump-logits FILE`: the next-token logits after the prompt, as JSON.
pub fn write_logits(path: &Path, prompt_tokens: usize, logits: &[f32]) -> Result<(), String> {
    let v = serde_json::json!({ "source": "dwarfstar", "prompt_tokens": prompt_tokens, "n_vocab": logits.len(), "logits": logits });
    let mut f = std::fs::File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    writeln!(f, "{v}").map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn log_softmax_of_a_uniform_row() {
        let row = [0.5f32; 4];
        assert!((super::log_softmax_at(&row, 2) - (0.25f64).ln()).abs() < 1e-12);
    }
}

/// What `--decode-consistency N` measured: one-token decode steps against a fresh prefill of the
/// same tokens (the logits of each position computed both ways).
pub struct Consistency {
    pub steps: usize,
    /// Per step: max |Δlogit| and whether the argmax agrees.
    pub per_step: Vec<(f32, bool)>,
    /// Largest |logit| of the prefill's rows (the scale of the differences).
    pub max_logit: f32,
}

impl Consistency {
    pub fn worst(&self) -> f32 { self.per_step.iter().fold(0f32, |m, &(d, _)| if d.is_nan() || m.is_nan() { f32::NAN } else { m.max(d) }) }
    pub fn argmax_agree(&self) -> usize { self.per_step.iter().filter(|s| s.1).count() }
}

/// `--decode-consistency N`: prefills `prompt`, decodes `n` greedy tokens one step at a time keeping
/// each step's logits, then prefills prompt + those tokens into a fresh state (every row's logits) and
/// compares the rows position by position: the decode path against the batched prefill path.
pub fn decode_consistency(eng: &mut Engine, prompt: &[u32], n: usize, cancel: &AtomicBool) -> Result<Consistency, String> {
    let vocab = eng.cfg().n_vocab;
    if prompt.is_empty() || n == 0 {
        return Err("--decode-consistency needs a prompt and N >= 1".into());
    }
    if prompt.len() + n > eng.ctx {
        return Err(format!("--decode-consistency {n}: the prompt's {} tokens and {n} more do not fit --ctx {}", prompt.len(), eng.ctx));
    }
    let chunk = eng.prefill_chunk.max(1);
    let stop = || cancel.load(std::sync::atomic::Ordering::SeqCst);
    // Decode path: the prompt, then one token a step (each step's logits kept).
    let mut kv = eng.new_kv();
    let mut last = Vec::new();
    for part in prompt.chunks(chunk) {
        last = eng.forward(&mut kv, part, None, Logits::Last).map_err(|e| e.to_string())?.to_vec();
    }
    let (mut tokens, mut decoded) = (Vec::with_capacity(n), Vec::with_capacity(n * vocab));
    for _ in 0..n {
        if stop() {
            return Err("interrupted".into());
        }
        let t = ds4_tokenizer::sampling::argmax(&last);
        tokens.push(t);
        last = eng.forward(&mut kv, &[t], None, Logits::Last).map_err(|e| e.to_string())?.to_vec();
        decoded.extend_from_slice(&last);
    }
    // Prefill path: prompt + the tokens in a fresh state, every row's logits.
    let mut all: Vec<u32> = prompt.to_vec();
    all.extend(&tokens);
    let mut kv = eng.new_kv();
    let mut rows = Vec::with_capacity(all.len() * vocab);
    for part in all.chunks(chunk) {
        if stop() {
            return Err("interrupted".into());
        }
        rows.extend_from_slice(eng.forward(&mut kv, part, None, Logits::All).map_err(|e| e.to_string())?);
    }
    // Decode step i fed token i at position P + i: the prefill's row P + i.
    let p = prompt.len();
    let mut per_step = Vec::with_capacity(n);
    let mut max_logit = 0f32;
    for i in 0..n {
        let want = &rows[(p + i) * vocab..(p + i + 1) * vocab];
        let got = &decoded[i * vocab..(i + 1) * vocab];
        let d = got.iter().zip(want).fold(0f32, |m, (a, b)| if (a - b).is_nan() { f32::NAN } else { m.max((a - b).abs()) });
        max_logit = want.iter().fold(max_logit, |m, v| m.max(v.abs()));
        per_step.push((d, ds4_tokenizer::sampling::argmax(got) == ds4_tokenizer::sampling::argmax(want)));
    }
    Ok(Consistency { steps: n, per_step, max_logit })
}

/// What `--imatrix-out` collected.
pub struct ImatrixRun {
    pub prompts: usize,
    pub tokens: usize,
    pub routes: u64,
}

/// `--imatrix-dataset FILE --imatrix-out FILE`: prefills each prompt of the dataset (ds4's layout,
/// `ds4_model::imatrix::dataset_prompts`; each from a fresh state, tokenized as written, cut to
/// `--ctx` and to what is left of `max_tokens`) while the stage collects the routed experts' input
/// statistics, then writes them as ds4's legacy llama.cpp `.dat`. `max_prompts`/`max_tokens` 0: no limit.
pub fn collect_imatrix(eng: &mut Engine, tok: &Tokenizer, dataset: &Path, out: &Path, max_prompts: usize, max_tokens: usize, cancel: &AtomicBool) -> Result<ImatrixRun, String> {
    let text = std::fs::read_to_string(dataset).map_err(|e| format!("--imatrix-dataset {}: {e}", dataset.display()))?;
    let prompts = ds4_model::imatrix::dataset_prompts(&text);
    if prompts.is_empty() {
        return Err(format!("--imatrix-dataset {}: no prompt in it", dataset.display()));
    }
    let chunk = eng.prefill_chunk.max(1);
    let mut run = ImatrixRun { prompts: 0, tokens: 0, routes: 0 };
    eng.stage.collect_imatrix();
    for p in prompts {
        if cancel.load(std::sync::atomic::Ordering::SeqCst) {
            return Err("interrupted".into());
        }
        let mut ids = tok.encode(p);
        ids.truncate(eng.ctx);
        if max_tokens > 0 {
            ids.truncate(max_tokens - run.tokens);
        }
        if ids.is_empty() {
            continue;
        }
        let mut kv = eng.new_kv();
        for part in ids.chunks(chunk) {
            eng.forward(&mut kv, part, None, Logits::None).map_err(|e| format!("imatrix prefill of prompt {}: {e}", run.prompts + 1))?;
        }
        run.prompts += 1;
        run.tokens += ids.len();
        if run.prompts % 10 == 0 {
            eprint!("ds4: imatrix prompts={} tokens={}\r", run.prompts, run.tokens);
        }
        if (max_prompts > 0 && run.prompts >= max_prompts) || (max_tokens > 0 && run.tokens >= max_tokens) {
            break;
        }
    }
    let im = eng.stage.take_imatrix().ok_or("the imatrix collection was lost")?;
    run.routes = im.routes;
    let names = |il: usize| ["gate", "up", "down"].map(|m| format!("blk.{il}.ffn_{m}_exps.weight"));
    im.write(out, names, &dataset.to_string_lossy()).map_err(|e| format!("--imatrix-out {}: {e}", out.display()))?;
    Ok(run)
}
