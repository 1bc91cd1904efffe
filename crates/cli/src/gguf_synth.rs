//! `ds4-gguf synth`: deterministic synthetic models in the ds4 layout (random weights, real shapes).
use anyhow::{bail, Context, Result};
use clap::Args;
use ds4_model::synth::{self, Mix, SynthSpec};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct SynthArgs {
    /// Shape: tiny (tests), flash (real Flash dimensions) or pro.
    pub shape: String,
    /// Output GGUF path.
    pub out: PathBuf,
    /// Quant mix: q2 (IQ2_XXS gate/up, Q2_K down), q4 (Q4_K experts) or f16.
    #[arg(long, default_value = "q2")]
    pub mix: String,
    /// Only these layers, `A:B` or `A:output` (inclusive); the embedding is included when A is 0.
    #[arg(long)]
    pub layers: Option<String>,
    /// Weight seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Scale of the residual branches' output projections (attention output, expert down projections).
    /// Below 1 the random network stops being chaotic (e.g. 0.1): two implementations' logits stay
    /// comparable through all layers, for full-depth CPU-vs-GPU checks. 1 = the plain random model.
    #[arg(long, default_value_t = 1.0)]
    pub gain: f32,
    /// Embed the tokenizer: `real` (DeepSeek V4 vocabulary, flash/pro), `tiny`, or `none`.
    /// Default: tiny for the tiny shape, real otherwise.
    #[arg(long)]
    pub vocab: Option<String>,
    /// Also write the matching MTP file (speculative-decoding drafter, `mtp.0.*` tensors in the C
    /// engine's MTP GGUF layout) for `ds4 --mtp FILE`.
    #[arg(long, value_name = "FILE")]
    pub mtp_out: Option<PathBuf>,
}

/// Parses `A:B` / `A:output` against `n_layer`; returns (first, last, owns_output).
pub fn parse_layers(s: &str, n_layer: usize) -> Result<(usize, usize, bool)> {
    let r = ds4_model::LayerRange::parse(s, n_layer)?;
    Ok((r.first, r.last, r.head))
}

pub fn run(a: &SynthArgs) -> Result<()> {
    let mix = Mix::parse(&a.mix)?;
    let cfg = synth::shape(&a.shape)?;
    let layers = a.layers.as_deref().map(|s| parse_layers(s, cfg.n_layer)).transpose()?;
    let which = a.vocab.clone().unwrap_or_else(|| if a.shape == "tiny" { "tiny".into() } else { "real".into() });
    let parts = match which.as_str() {
        "real" => Some(ds4_tokenizer::real_vocab()?),
        "tiny" => Some(ds4_tokenizer::tiny_vocab()?),
        "none" => None,
        o => bail!("--vocab `{o}`: expected real, tiny or none"),
    };
    let vocab = parts.map(|(t, m, ty)| ds4_engine::vocab_from_parts(t, m, ty));
    let spec = SynthSpec { shape: &a.shape, mix, seed: a.seed, layers, vocab: vocab.as_ref() };
    let bar = ProgressBar::new(0);
    bar.set_style(ProgressStyle::with_template("synth {bar:40} {pos}/{len} tensors {msg}").unwrap());
    let cfg = synth::write_with_gain(&spec, a.gain, &a.out, |i, n| {
        bar.set_length(n as u64);
        bar.set_position(i as u64);
    })
    .with_context(|| format!("writing {}", a.out.display()))?;
    bar.finish_and_clear();
    if let Some(m) = &a.mtp_out {
        synth::write_mtp(&spec, m, |_, _| {}).with_context(|| format!("writing {}", m.display()))?;
        let size = std::fs::metadata(m).map(|m| m.len()).unwrap_or(0);
        eprintln!("wrote {} ({:.2} GiB): MTP block for shape {}, mix {}", m.display(), size as f64 / (1u64 << 30) as f64, a.shape, a.mix);
    }
    let size = std::fs::metadata(&a.out).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "wrote {} ({:.2} GiB): shape {} ({} layers, embd {}, vocab {}), mix {}",
        a.out.display(),
        size as f64 / (1u64 << 30) as f64,
        a.shape,
        cfg.n_layer,
        cfg.n_embd,
        cfg.n_vocab,
        a.mix
    );
    Ok(())
}
