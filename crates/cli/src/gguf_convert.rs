//! `ds4-gguf convert CHECKPOINT_DIR OUT.gguf --mix f32|f16|q8|q4|q2`: transformers DeepSeek-V4 checkpoint
//! (config.json + *.safetensors with in-memory parameter names) → ds4-layout GGUF (crate ds4-convert).
use anyhow::Context;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct ConvertArgs {
    /// Directory with config.json and *.safetensors (optional tokenizer.json).
    pub checkpoint_dir: PathBuf,
    /// GGUF file to write.
    pub out: PathBuf,
    /// Tensor types: f32 (all float F32), f16, q8 (experts Q8_0), q4 (experts Q4_K), q2 (gate/up IQ2_XXS, down Q2_K).
    #[arg(long, default_value = "q4", value_parser = ["f32", "f16", "q8", "q4", "q2"])]
    pub mix: String,
}

pub fn run(args: &ConvertArgs) -> anyhow::Result<()> {
    let mix: ds4_convert::QuantMix = args.mix.parse().map_err(|e: String| anyhow::anyhow!("--mix: {e}"))?;
    let s = ds4_convert::convert(&args.checkpoint_dir, &args.out, mix)
        .with_context(|| format!("converting {} to {}", args.checkpoint_dir.display(), args.out.display()))?;
    println!(
        "wrote {}: {} tensors, {} layers, {:.2} MiB tensor data, mix {}{}",
        args.out.display(),
        s.tensors.len(),
        s.config.n_layers,
        s.tensor_bytes as f64 / (1024.0 * 1024.0),
        s.mix,
        if s.tokenizer_embedded { "" } else { " (no tokenizer.json: placeholder tokens)" }
    );
    if !s.unused.is_empty() {
        println!("unused checkpoint tensors ({}): {}", s.unused.len(), s.unused.join(", "));
    }
    Ok(())
}
