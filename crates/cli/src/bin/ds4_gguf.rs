//! `ds4-gguf`: GGUF file tools. One subcommand per tool; add new ones to `Command` and `main`.
use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[path = "../gguf_inspect.rs"]
mod gguf_inspect;
#[path = "../gguf_convert.rs"]
mod gguf_convert;
#[path = "../gguf_synth.rs"]
mod gguf_synth;
#[path = "../gguf_split.rs"]
mod gguf_split;
#[path = "../gguf_download.rs"]
mod gguf_download;
#[path = "../hub_fetch.rs"]
mod hub_fetch;

#[derive(Parser, Debug)]
#[command(name = "ds4-gguf", version, about = "DwarfStar GGUF tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print header, metadata, tensor table and per-type totals of a GGUF file.
    Inspect(gguf_inspect::InspectArgs),
    /// Convert a transformers DeepSeek-V4 checkpoint to a ds4-layout GGUF.
    Convert(gguf_convert::ConvertArgs),
    /// Write a deterministic synthetic model (tiny, flash or pro shape) in the ds4 layout.
    Synth(gguf_synth::SynthArgs),
    /// Write a shard holding one layer range (and the embedding/head it implies).
    Split(gguf_split::SplitArgs),
    /// Download a published DeepSeek V4 Flash GGUF (resumable, checksum-verified) and link ./ds4flash.gguf to it.
    Download(gguf_download::DownloadArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse(); // bad flags: clap prints usage and exits with code 2
    let result = match &cli.command {
        Command::Inspect(args) => gguf_inspect::run(args),
        Command::Convert(args) => gguf_convert::run(args),
        Command::Synth(args) => gguf_synth::run(args),
        Command::Split(args) => gguf_split::run(args),
        Command::Download(args) => gguf_download::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A closed pipe (`ds4-gguf inspect f | head`) is not an error.
            if e.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) {
                return ExitCode::SUCCESS;
            }
            eprintln!("ds4-gguf: error: {}", error_chain(&e));
            ExitCode::from(1)
        }
    }
}

/// "outer: cause: cause", skipping a cause whose text the previous message already contains
/// (several of our errors embed their source).
fn error_chain(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    let mut prev = String::new();
    for cause in e.chain() {
        let c = cause.to_string();
        if !prev.is_empty() && prev.contains(&c) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&c);
        prev = c;
    }
    msg
}
