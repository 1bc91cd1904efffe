//! The interactive chat: a `ds4> ` prompt with line editing and a history file (rustyline), and
//! ds4's slash commands.
use crate::chat::{print_stats, Chat};
use crate::conversation::Conversation;
use ds4_tokenizer::chat::ThinkMode;
use rustyline::error::ReadlineError;
use rustyline::history::FileHistory;
use rustyline::{Config, Editor};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

const HELP: &str = "commands: /help  /think  /think-max  /nothink  /ctx N  /power N  /steer [F]  /read FILE  /quit";
/// History entries kept (as ds4).
const HISTORY_MAX: usize = 512;

/// `$DS4_HISTORY`, else `~/.ds4_history`; None without a home directory.
fn history_path() -> Option<PathBuf> {
    std::env::var_os("DS4_HISTORY").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".ds4_history")))
}

pub fn interactive(conv: &mut dyn Conversation, chat: &mut Chat, cancel: &AtomicBool, generating: &AtomicBool) -> Result<(), String> {
    let cfg = Config::builder().max_history_size(HISTORY_MAX).map_err(|e| e.to_string())?.auto_add_history(false).build();
    let mut ed: Editor<(), FileHistory> = Editor::with_config(cfg).map_err(|e| format!("cannot start the line editor: {e}"))?;
    let hist = history_path();
    if let Some(h) = &hist {
        let _ = ed.load_history(h); // a missing file is the first run
    }
    eprintln!("ds4 interactive chat ({HELP}); Ctrl+C stops a generation, Ctrl+D or Ctrl+C at the prompt quits");
    loop {
        let line = match ed.readline("ds4> ") {
            Ok(l) => l,
            Err(ReadlineError::Interrupted | ReadlineError::Eof) => return Ok(()),
            Err(e) => return Err(format!("reading input: {e}")),
        };
        let input = line.trim_end_matches(['\n', '\r']);
        if !input.trim().is_empty() {
            let _ = ed.add_history_entry(input);
            if let Some(h) = &hist {
                if let Err(e) = ed.append_history(h) {
                    eprintln!("ds4: cannot write the history file {}: {e}", h.display());
                }
            }
        }
        let text = match command(input, conv, chat) {
            Next::Quit => return Ok(()),
            Next::Nothing => continue,
            Next::Send(t) => t,
        };
        match chat.turn(conv, &text, cancel, generating) {
            Ok(s) => print_stats(&s),
            Err(e) => eprintln!("ds4: {e}"),
        }
    }
}

enum Next {
    Quit,
    Nothing,
    /// The next user message.
    Send(String),
}

/// Runs a slash command, or passes the line on as the next user message.
fn command(input: &str, conv: &mut dyn Conversation, chat: &mut Chat) -> Next {
    let mut words = input.split_whitespace();
    let Some(first) = words.next() else { return Next::Nothing };
    match first {
        "/quit" | "/exit" => return Next::Quit,
        "/help" => eprintln!("{HELP}"),
        "/think" => set_mode(chat, conv, ThinkMode::High),
        "/think-max" => set_mode(chat, conv, ThinkMode::Max),
        "/nothink" => set_mode(chat, conv, ThinkMode::None),
        "/ctx" => match words.next().and_then(|w| w.parse::<usize>().ok()) {
            Some(n) if n > 0 => match conv.set_ctx(n) {
                Ok(memory) => eprintln!("context set to {n} tokens; conversation cleared\n{memory}"),
                Err(e) => eprintln!("/ctx {n}: {e}; the context stays {} tokens", conv.ctx()),
            },
            _ => eprintln!("usage: /ctx N (a positive number of tokens)"),
        },
        "/power" => match words.next().and_then(|w| w.parse::<u32>().ok()).map(|n| (n, chat.set_power(n))) {
            Some((n, Ok(()))) => eprintln!("power target {n} %"),
            Some((_, Err(e))) => eprintln!("{e}"),
            None => eprintln!("usage: /power N (1 to 100 percent)"),
        },
        "/steer" => {
            let scale = match words.next().map(str::parse::<f32>) {
                Some(Err(_)) => return usage_steer(),
                v => v.map(|r| r.unwrap_or_default()),
            };
            match conv.steer(scale) {
                Ok(sc) => {
                    let list: Vec<String> = sc.iter().enumerate().map(|(i, (f, a))| format!("{}: ffn {f} attn {a}", i + 1)).collect();
                    eprintln!("steering {}", list.join(", "));
                }
                Err(e) => eprintln!("{e}"),
            }
        }
        "/read" => {
            let path = input.trim_start()["/read".len()..].trim();
            if path.is_empty() {
                eprintln!("usage: /read FILE (the next message is the file's text)");
                return Next::Nothing;
            }
            match std::fs::read_to_string(path) {
                Ok(t) => return Next::Send(t),
                Err(e) => eprintln!("cannot read {path}: {e}"),
            }
        }
        w if w.starts_with('/') => eprintln!("unknown command {w}; {HELP}"),
        _ => return Next::Send(input.to_string()),
    }
    Next::Nothing
}

fn usage_steer() -> Next {
    eprintln!("usage: /steer [F] (the first steering file's FFN scale, -100 to 100)");
    Next::Nothing
}

fn set_mode(chat: &mut Chat, conv: &mut dyn Conversation, m: ThinkMode) {
    chat.set_mode(m);
    conv.reset();
    eprintln!("mode: {m:?} (conversation cleared)");
    if m == ThinkMode::Max && m.effective(conv.ctx() as u64) != m {
        eprintln!("ds4: think-max needs --ctx >= 393216 (/ctx 393216); until then it is normal thinking");
        chat.mark_max_warned();
    }
}
