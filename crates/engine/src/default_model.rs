//! Which model file to use: `-m`, else `./ds4flash.gguf`, else the embedded tiny default, generated
//! deterministically on first use into a cache directory.
use crate::error::EngineError;
use ds4_model::synth::{self, Mix, SynthSpec, Vocab};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    Given(PathBuf),
    Symlink(PathBuf),
    EmbeddedDefault(PathBuf),
}

impl ModelSource {
    pub fn path(&self) -> &Path {
        match self {
            Self::Given(p) | Self::Symlink(p) | Self::EmbeddedDefault(p) => p,
        }
    }
}

/// Version tag of the embedded default: bump when synth output changes.
const DEFAULT_TAG: &str = "tiny-q4-v3";

/// Where the embedded default lives: `$DS4_CACHE_DIR`, else `$XDG_CACHE_HOME/dwarfstar`, else `~/.cache/dwarfstar`.
pub fn default_model_path() -> PathBuf {
    let dir = std::env::var_os("DS4_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("dwarfstar")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("dwarfstar")))
        .unwrap_or_else(|| std::env::temp_dir().join("dwarfstar"));
    dir.join(format!("ds4-{DEFAULT_TAG}.gguf"))
}

/// Resolves the model path as the C engine does, generating the embedded default when needed.
pub fn resolve_model(given: Option<&Path>) -> Result<ModelSource, EngineError> {
    if let Some(p) = given {
        if !p.exists() {
            return Err(EngineError::Invalid(format!("model file {} does not exist", p.display())));
        }
        return Ok(ModelSource::Given(p.to_path_buf()));
    }
    let link = PathBuf::from("ds4flash.gguf");
    if link.exists() {
        return Ok(ModelSource::Symlink(link));
    }
    let path = default_model_path();
    if !path.exists() {
        write_default(&path)?;
    }
    Ok(ModelSource::EmbeddedDefault(path))
}

fn write_default(path: &Path) -> Result<(), EngineError> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let (tokens, merges, token_types) = ds4_tokenizer::tiny_vocab()?;
    let vocab = vocab_from_parts(tokens, merges, token_types);
    // Write to a temporary name and rename, so a concurrent or interrupted run never sees half a file
    // (the name is unique per process and call: threads of one process may generate it at once).
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
    let spec = SynthSpec { shape: "tiny", mix: Mix::Q4, seed: 0xD5_4D5, layers: None, vocab: Some(&vocab) };
    synth::write(&spec, &tmp, |_, _| {})?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Wraps tokenizer parts for embedding in a synthetic file (bos/eos looked up by string).
pub fn vocab_from_parts(tokens: Vec<String>, merges: Vec<String>, token_types: Vec<i32>) -> Vocab {
    let find = |s: &str| ds4_tokenizer::find_token(&tokens, s);
    Vocab {
        bos: find("<｜begin▁of▁sentence｜>").unwrap_or(0),
        eos: find("<｜end▁of▁sentence｜>").unwrap_or(1),
        tokens,
        merges,
        token_types,
    }
}
