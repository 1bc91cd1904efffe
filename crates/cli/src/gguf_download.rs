//! `ds4-gguf download TARGET`: fetch one of the published DeepSeek V4 Flash GGUFs (the repository, file names,
//! `gguf/` folder, `.part` resume and `./ds4flash.gguf` link of ds4's `download_model.sh`).
use crate::hub_fetch::{human, HubFile, Progress};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// The hub repository ds4 publishes its GGUFs in.
pub const REPO: &str = "antirez/deepseek-v4-gguf";
const REVISION: &str = "main";
const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// The model path every binary uses when `-m` is not given.
pub const DEFAULT_LINK: &str = "ds4flash.gguf";

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Target {
    /// 2-bit routed experts with an importance matrix, about 81 GB: the recommended model for 96-128 GB RAM.
    #[value(name = "q2-imatrix")]
    Q2Imatrix,
    /// Mostly 2-bit experts, layers 37-42 at 4 bits, about 98 GB.
    #[value(name = "q2-q4-imatrix")]
    Q2Q4Imatrix,
    /// 4-bit routed experts with an importance matrix, about 153 GB: for 256 GB RAM or more.
    #[value(name = "q4-imatrix")]
    Q4Imatrix,
    /// Legacy 2-bit quant without imatrix, about 81 GB (prefer q2-imatrix).
    Q2,
    /// Legacy 4-bit quant without imatrix, about 153 GB (prefer q4-imatrix).
    Q4,
    /// Optional MTP speculative-decoding weights for `--mtp FILE`, about 3.5 GB (does not move ./ds4flash.gguf).
    Mtp,
}

impl Target {
    pub fn file(self) -> &'static str {
        match self {
            Target::Q2Imatrix => "DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2-imatrix.gguf",
            Target::Q2Q4Imatrix => "DeepSeek-V4-Flash-Layers37-42Q4KExperts-OtherExpertLayersIQ2XXSGateUp-Q2KDown-AProjQ8-SExpQ8-OutQ8-chat-v2-imatrix-fixed.gguf",
            Target::Q4Imatrix => "DeepSeek-V4-Flash-Q4KExperts-F16HC-F16Compressor-F16Indexer-Q8Attn-Q8Shared-Q8Out-chat-v2-imatrix.gguf",
            Target::Q2 => "DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2.gguf",
            Target::Q4 => "DeepSeek-V4-Flash-Q4KExperts-F16HC-F16Compressor-F16Indexer-Q8Attn-Q8Shared-Q8Out-chat-v2.gguf",
            Target::Mtp => "DeepSeek-V4-Flash-MTP-Q4K-Q8_0-F32.gguf",
        }
    }

    /// Main models become the default `./ds4flash.gguf`; the MTP sidecar is passed with `--mtp`.
    fn links_default(self) -> bool {
        self != Target::Mtp
    }
}

#[derive(Args, Debug)]
pub struct DownloadArgs {
    /// Which file to fetch.
    pub target: Target,
    /// Folder for the GGUF files (ds4's `DS4_GGUF_DIR`).
    #[arg(long, env = "DS4_GGUF_DIR", default_value = "gguf")]
    pub dir: PathBuf,
    /// Hugging Face token; otherwise HF_TOKEN, then the token file of the hub's own tools.
    #[arg(long, env = "HF_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Further attempts after a broken connection within this run, each resuming where the last stopped.
    #[arg(long, default_value_t = 3)]
    pub retries: u32,
}

pub fn run(a: &DownloadArgs) -> Result<()> {
    let file = a.target.file();
    let endpoint = endpoint()?;
    std::fs::create_dir_all(&a.dir).with_context(|| format!("cannot create {}", a.dir.display()))?;
    let dir = std::fs::canonicalize(&a.dir).with_context(|| format!("cannot resolve {}", a.dir.display()))?;
    let dest = dir.join(file);
    if std::fs::metadata(&dest).is_ok_and(|m| m.len() > 0) {
        println!("Already downloaded: {}", dest.display());
    } else {
        let hub = HubFile { endpoint, repo: REPO.into(), revision: REVISION.into(), filename: file.into(), token: token(a) };
        println!("Downloading {file}\nfrom {}/{REPO}", hub.endpoint);
        println!("If the download stops, run the same command again to resume it.");
        let remote = hub.probe()?;
        if let Some(c) = &remote.commit {
            println!("revision {c}, {}", human(remote.size));
        }
        let part = dir.join(format!("{file}.part"));
        hub.fetch(&remote, &part, &dest, a.retries, &mut Bar::new())?;
        match &remote.sha256 {
            Some(sha) => println!("Saved {} ({}), sha256 {sha} verified", dest.display(), human(remote.size)),
            None => println!("Saved {} ({}); the hub gave no sha256, so only the size was checked", dest.display(), human(remote.size)),
        }
    }
    if a.target.links_default() {
        link_default(&dest)?;
        println!("Linked ./{DEFAULT_LINK} -> {}", dest.display());
    } else {
        // As in ds4, the drafter is enabled with `--mtp FILE`.
        println!("The MTP file is optional: speculative decoding with --mtp {} (CPU and wgpu backends for now).", dest.display());
    }
    Ok(())
}

/// `HF_ENDPOINT` (a mirror or a test server) or the public hub.
fn endpoint() -> Result<String> {
    let e = std::env::var("HF_ENDPOINT").ok().filter(|e| !e.trim().is_empty()).unwrap_or_else(|| DEFAULT_ENDPOINT.into());
    let e = e.trim().trim_end_matches('/').to_string();
    if !(e.starts_with("https://") || e.starts_with("http://")) {
        bail!("HF_ENDPOINT must be an http:// or https:// URL, not '{e}'");
    }
    Ok(e)
}

/// `--token`/`HF_TOKEN`, else the token file the hub's own tools save at login.
fn token(a: &DownloadArgs) -> Option<String> {
    if let Some(t) = a.token.as_deref().map(str::trim).filter(|t| !t.is_empty()) {
        return Some(t.to_string());
    }
    let env = |k| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let path = env("HF_TOKEN_PATH")
        .or_else(|| env("HF_HOME").map(|h| h.join("token")))
        .or_else(|| env("XDG_CACHE_HOME").map(|c| c.join("huggingface/token")))
        .or_else(|| env("HOME").map(|h| h.join(".cache/huggingface/token")))?;
    let t = std::fs::read_to_string(path).ok()?;
    Some(t.trim().to_string()).filter(|t| !t.is_empty())
}

/// Point `./ds4flash.gguf` at `target` (`ln -sfn`), replacing an older link atomically but never a real file.
fn link_default(target: &Path) -> Result<()> {
    let link = Path::new(DEFAULT_LINK);
    match std::fs::symlink_metadata(link) {
        Ok(m) if !m.file_type().is_symlink() => {
            bail!("./{DEFAULT_LINK} exists and is not a link, so it was left alone; the model is {}", target.display())
        }
        _ => {}
    }
    let tmp = PathBuf::from(format!(".{DEFAULT_LINK}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).with_context(|| format!("cannot create the link {}", tmp.display()))?;
    std::fs::rename(&tmp, link).with_context(|| format!("cannot replace ./{DEFAULT_LINK}"))
}

/// A byte progress bar on a terminal; a line every 10 % otherwise (logs, CI).
struct Bar {
    bar: Option<ProgressBar>,
    tty: bool,
    total: u64,
    last_tenth: u64,
    what: String,
}

impl Bar {
    fn new() -> Self {
        Bar { bar: None, tty: std::io::stderr().is_terminal(), total: 0, last_tenth: 0, what: String::new() }
    }
}

impl Progress for Bar {
    fn start(&mut self, what: &str, done: u64, total: u64) {
        self.total = total;
        self.what = what.to_string();
        self.last_tenth = (done * 10).checked_div(total).unwrap_or(10);
        if self.tty {
            let style = ProgressStyle::with_template("{wide_bar} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            let bar = ProgressBar::new(total).with_style(style);
            bar.set_position(done);
            self.bar = Some(bar);
        } else if done > 0 {
            eprintln!("{what}: continuing at {} of {}", human(done), human(total));
        }
    }

    fn advance(&mut self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
        } else if self.total > 0 && done * 10 / self.total > self.last_tenth {
            self.last_tenth = done * 10 / self.total;
            eprintln!("{}: {}% ({} of {})", self.what, self.last_tenth * 10, human(done), human(self.total));
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
