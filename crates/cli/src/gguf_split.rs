//! `ds4-gguf split --layers A:B IN OUT`: write a shard file holding one layer range.
use anyhow::{Context, Result};
use clap::Args;
use ds4_gguf::GgufFile;
use ds4_model::{Config, LayerRange};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct SplitArgs {
    /// Layer range `A:B` or `A:output` (inclusive; the embedding goes with A = 0).
    #[arg(long)]
    pub layers: String,
    pub input: PathBuf,
    pub out: PathBuf,
}

pub fn run(a: &SplitArgs) -> Result<()> {
    // The shard replaces OUT: never the model it is cut from.
    if let (Ok(i), Ok(o)) = (a.input.canonicalize(), a.out.canonicalize()) {
        anyhow::ensure!(i != o, "{} is the input file: give another output path", a.out.display());
    }
    let f = GgufFile::open(&a.input).with_context(|| format!("reading {}", a.input.display()))?;
    let cfg = Config::from_gguf(&f)?;
    let r = LayerRange::parse(&a.layers, cfg.n_layer)?;
    if let Some(sr) = ds4_model::weights::shard_range(&f)? {
        let inside = r.first >= sr.first && r.last <= sr.last && (!r.head || sr.head) && (!r.embed || sr.embed);
        anyhow::ensure!(inside, "{} is a shard of layers {}; {} is not inside it", a.input.display(), sr.label(), r.label());
    }
    let (n, bytes) = ds4_model::shard::write_shard(&f, r, &a.out).with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!("wrote {} with layers {}: {n} tensors, {:.2} GiB", a.out.display(), r.label(), bytes as f64 / (1u64 << 30) as f64);
    Ok(())
}
