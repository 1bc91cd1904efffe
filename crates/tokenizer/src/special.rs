//! Added/special tokens: which vocabulary entries are matched whole (never BPE-split).
//!
//! # How added tokens are recognised from a GGUF
//! 1. If `tokenizer.ggml.token_type` is present (llama.cpp convention): type 3 (CONTROL) and 4
//!    (USER_DEFINED) are added tokens, matched whole in the input. CONTROL ones are "special"
//!    (skipped by `decode_skip_special`), USER_DEFINED ones are not. This is how `real_vocab()`
//!    classifies the real tokenizer.json: `special=true` added tokens -> 3, `special=false` added
//!    tokens (`<｜User｜>`, `<｜Assistant｜>`, `<think>`, `</think>`, `｜DSML｜`, ...) -> 4, the rest -> 1.
//!    (llama.cpp's converter may mark some of the latter CONTROL; both are matched whole either way.)
//! 2. Without token types, [`looks_added`] decides: a token string that byte-level BPE cannot
//!    produce (it has a char outside the GPT-2 byte alphabet, e.g. U+FF5C `｜`), the ASCII
//!    `<|...|>` form, or one of `<think>`, `</think>`, `<dsml:`, `</dsml:`. Of those, [`looks_control`]
//!    (BOS/EOS/pad, `<|...|>` placeholders) are treated as special. On the real vocabulary this
//!    heuristic selects exactly the 1,283 added tokens (tested).

use crate::byte_level::is_byte_level_string;

/// llama.cpp token types.
pub const TOKEN_TYPE_NORMAL: i32 = 1;
pub const TOKEN_TYPE_UNKNOWN: i32 = 2;
pub const TOKEN_TYPE_CONTROL: i32 = 3;
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;
pub const TOKEN_TYPE_UNUSED: i32 = 5;
pub const TOKEN_TYPE_BYTE: i32 = 6;

pub const BOS: &str = "<｜begin▁of▁sentence｜>";
pub const EOS: &str = "<｜end▁of▁sentence｜>";
pub const PAD: &str = "<｜▁pad▁｜>";
pub const USER: &str = "<｜User｜>";
pub const ASSISTANT: &str = "<｜Assistant｜>";
pub const THINK_START: &str = "<think>";
pub const THINK_END: &str = "</think>";
pub const DSML: &str = "｜DSML｜";
pub const LATEST_REMINDER: &str = "<｜latest_reminder｜>";

/// Every token string the chat renderer / DSML parser relies on (tiny vocabularies must hold them).
pub const CHAT_TOKENS: [&str; 9] =
    [BOS, EOS, PAD, USER, ASSISTANT, THINK_START, THINK_END, DSML, LATEST_REMINDER];

/// Heuristic (no token types): is this vocabulary string an added token? See module docs.
pub fn looks_added(s: &str) -> bool {
    if s.is_empty() {
        return false;
    }
    if !is_byte_level_string(s) {
        return true;
    }
    if s.len() >= 4 && s.starts_with("<|") && s.ends_with("|>") {
        return true;
    }
    matches!(s, "<think>" | "</think>" | "<dsml:" | "</dsml:")
}

/// Heuristic (no token types): is this added token "special" (control)?
pub fn looks_control(s: &str) -> bool {
    matches!(s, BOS | EOS | PAD) || (s.len() >= 4 && s.starts_with("<|") && s.ends_with("|>"))
}

/// Ids of the chat-format tokens of one vocabulary, looked up by string (never hard-coded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatTokenIds {
    pub bos: u32,
    pub eos: u32,
    pub user: u32,
    pub assistant: u32,
    pub think_start: u32,
    pub think_end: u32,
    pub dsml: u32,
    /// Absent in some vocabularies.
    pub latest_reminder: Option<u32>,
}
