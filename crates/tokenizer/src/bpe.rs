//! The tokenizer: a `tokenizers::Tokenizer` (byte-level BPE) built from GGUF-style parts.

use std::collections::HashMap;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::byte_level::token_string_bytes;
use crate::special::{self, ChatTokenIds};
use crate::TokenizerError;

/// The three regex splits of the DeepSeek V3/V4 ("joyai-llm") pre-tokenizer, in order, exactly as in
/// the real tokenizer.json; a `ByteLevel(add_prefix_space=false, use_regex=false)` step follows.
pub const JOYAI_SPLITS: [&str; 3] = [
    r"\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
];

/// Byte-level BPE tokenizer for DeepSeek V4 vocabularies.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    tokens: Vec<String>,
    /// Decoded bytes of every token, flat, with `offsets[id]..offsets[id + 1]`.
    bytes: Vec<u8>,
    offsets: Vec<u32>,
    /// Per id: 0 = normal, 1 = added non-special, 2 = added special (control).
    kind: Vec<u8>,
    by_str: HashMap<String, u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("n_vocab", &self.tokens.len()).finish()
    }
}

const KIND_NORMAL: u8 = 0;
const KIND_ADDED: u8 = 1;
const KIND_CONTROL: u8 = 2;

impl Tokenizer {
    /// Build from token strings (index = id), merges ("a b", rank = index) and the `tokenizer.ggml.pre`
    /// name. Added tokens are recognised with [`special::looks_added`] (no token types given).
    pub fn from_parts(tokens: Vec<String>, merges: Vec<String>, pre: &str) -> Result<Self, TokenizerError> {
        Self::from_parts_typed(tokens, merges, None, pre)
    }

    /// Like [`Tokenizer::from_parts`] with llama.cpp token types (3 = control, 4 = user-defined).
    pub fn from_parts_typed(
        tokens: Vec<String>,
        merges: Vec<String>,
        token_types: Option<&[i32]>,
        pre: &str,
    ) -> Result<Self, TokenizerError> {
        match pre {
            "joyai-llm" | "deepseek-v3" => {}
            other => return Err(TokenizerError::UnsupportedPre(other.to_string())),
        }
        if tokens.is_empty() {
            return Err(TokenizerError::Vocab("empty token list".into()));
        }
        if tokens.len() > u32::MAX as usize / 2 {
            return Err(TokenizerError::Vocab("token list too large".into()));
        }
        if let Some(tt) = token_types {
            if tt.len() != tokens.len() {
                return Err(TokenizerError::Vocab(format!(
                    "token_type has {} entries, tokens has {}",
                    tt.len(),
                    tokens.len()
                )));
            }
        }

        // classify
        let mut kind = Vec::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            let k = match token_types {
                Some(tt) => match tt[i] {
                    special::TOKEN_TYPE_CONTROL => KIND_CONTROL,
                    special::TOKEN_TYPE_USER_DEFINED => KIND_ADDED,
                    _ => KIND_NORMAL,
                },
                None => {
                    if !special::looks_added(t) {
                        KIND_NORMAL
                    } else if special::looks_control(t) {
                        KIND_CONTROL
                    } else {
                        KIND_ADDED
                    }
                }
            };
            kind.push(k);
        }

        // vocab: first occurrence of a string wins (duplicates would make ids ambiguous)
        let mut by_str: HashMap<String, u32> = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            by_str.entry(t.clone()).or_insert(i as u32);
        }
        let vocab: Vocab = by_str.iter().map(|(k, v)| (k.clone(), *v)).collect();

        let mut pairs = Vec::with_capacity(merges.len());
        for (index, m) in merges.iter().enumerate() {
            let Some((a, b)) = m.split_once(' ') else {
                return Err(TokenizerError::Merge { index, merge: m.clone(), problem: "no space".into() });
            };
            if a.is_empty() || b.is_empty() || b.contains(' ') {
                return Err(TokenizerError::Merge { index, merge: m.clone(), problem: "not two tokens".into() });
            }
            for part in [a, b] {
                if !by_str.contains_key(part) {
                    return Err(TokenizerError::Merge {
                        index,
                        merge: m.clone(),
                        problem: format!("`{part}` not in vocabulary"),
                    });
                }
            }
            let merged = format!("{a}{b}");
            if !by_str.contains_key(&merged) {
                return Err(TokenizerError::Merge {
                    index,
                    merge: m.clone(),
                    problem: format!("result `{merged}` not in vocabulary"),
                });
            }
            pairs.push((a.to_string(), b.to_string()));
        }

        let bpe = BPE::builder()
            .vocab_and_merges(vocab, pairs)
            .build()
            .map_err(|e| TokenizerError::Backend(e.to_string()))?;

        let mut pretoks: Vec<PreTokenizerWrapper> = Vec::with_capacity(4);
        for re in JOYAI_SPLITS {
            let split = Split::new(SplitPattern::Regex(re.to_string()), SplitDelimiterBehavior::Isolated, false)
                .map_err(|e| TokenizerError::Backend(e.to_string()))?;
            pretoks.push(split.into());
        }
        pretoks.push(ByteLevel::new(false, true, false).into());

        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(Sequence::new(pretoks)));
        inner.with_decoder(Some(ByteLevelDecoder::new(true, true, true)));

        let mut added = Vec::new();
        for (i, t) in tokens.iter().enumerate() {
            if kind[i] != KIND_NORMAL && by_str.get(t) == Some(&(i as u32)) {
                // As in the real tokenizer.json: special ones not normalized, others normalized
                // (there is no normalizer, so it makes no difference to matching).
                added.push(AddedToken::from(t.clone(), kind[i] == KIND_CONTROL));
            }
        }
        inner.add_tokens(added).map_err(|e| TokenizerError::Backend(e.to_string()))?;

        // flat decoded bytes
        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(tokens.len() + 1);
        offsets.push(0u32);
        for t in &tokens {
            bytes.extend_from_slice(&token_string_bytes(t));
            if bytes.len() > u32::MAX as usize {
                return Err(TokenizerError::Vocab("token text too large".into()));
            }
            offsets.push(bytes.len() as u32);
        }

        Ok(Self { inner, tokens, bytes, offsets, kind, by_str })
    }

    /// Build from a GGUF's tokenizer metadata: `tokenizer.ggml.tokens`, `tokenizer.ggml.merges`,
    /// `tokenizer.ggml.pre` (default "joyai-llm" when missing), optional `tokenizer.ggml.token_type`
    /// and `tokenizer.ggml.model` (must be "gpt2" when present).
    pub fn from_gguf(file: &ds4_gguf::GgufFile) -> Result<Self, TokenizerError> {
        if let Some(ds4_gguf::MetaValue::Str(model)) = file.get("tokenizer.ggml.model") {
            if model != "gpt2" {
                return Err(TokenizerError::UnsupportedModel(model.clone()));
            }
        }
        let tokens: Vec<String> =
            file.get_str_array("tokenizer.ggml.tokens")?.into_iter().map(str::to_string).collect();
        let merges: Vec<String> =
            file.get_str_array("tokenizer.ggml.merges")?.into_iter().map(str::to_string).collect();
        let pre = match file.get("tokenizer.ggml.pre") {
            Some(ds4_gguf::MetaValue::Str(s)) => s.clone(),
            Some(_) => return Err(TokenizerError::Vocab("tokenizer.ggml.pre is not a string".into())),
            None => "joyai-llm".to_string(),
        };
        let types = match file.get("tokenizer.ggml.token_type") {
            None => None,
            Some(v) => Some(meta_int_array(v).ok_or_else(|| {
                TokenizerError::Vocab("tokenizer.ggml.token_type is not an integer array".into())
            })?),
        };
        Self::from_parts_typed(tokens, merges, types.as_deref(), &pre)
    }

    /// Number of ids.
    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    /// Encode text; added/special tokens written in the text are recognised and never split.
    /// No BOS is added. Errors from the backend give an empty result (never a panic).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match self.inner.encode_fast(text, false) {
            Ok(enc) => enc.get_ids().to_vec(),
            Err(_) => Vec::new(),
        }
    }

    /// Decode ids to text (added tokens as their strings); unknown ids are skipped; invalid UTF-8
    /// becomes U+FFFD exactly as HF `decode(ids, skip_special_tokens=False)`.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut buf = Vec::new();
        for &id in ids {
            buf.extend_from_slice(self.token_bytes(id));
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// Like [`Tokenizer::decode`] but skipping control (special) tokens.
    pub fn decode_skip_special(&self, ids: &[u32]) -> String {
        let mut buf = Vec::new();
        for &id in ids {
            if !self.is_control(id) {
                buf.extend_from_slice(self.token_bytes(id));
            }
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// The vocabulary string of a token (GPT-2 alphabet form for normal tokens).
    pub fn token_str(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Bytes of the longest token of the vocabulary (at least 1): a text of B bytes has at least
    /// B / this many tokens, a bound known before tokenizing it.
    pub fn max_token_bytes(&self) -> usize {
        (0..self.n_vocab() as u32).map(|id| self.token_bytes(id).len()).max().unwrap_or(1).max(1)
    }

    /// The bytes a token stands for (empty for unknown ids).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i + 1 >= self.offsets.len() {
            return &[];
        }
        &self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// Printable text of one token (lossy for tokens that are a partial UTF-8 sequence).
    pub fn token_text(&self, id: u32) -> String {
        String::from_utf8_lossy(self.token_bytes(id)).into_owned()
    }

    /// Id of a vocabulary string (exact match on the stored token string).
    pub fn token_id(&self, s: &str) -> Option<u32> {
        self.by_str.get(s).copied()
    }

    /// Whether `id` is an added token (matched whole when encoding).
    pub fn is_added(&self, id: u32) -> bool {
        self.kind.get(id as usize).is_some_and(|&k| k != KIND_NORMAL)
    }

    /// Whether `id` is a control (special) token.
    pub fn is_control(&self, id: u32) -> bool {
        self.kind.get(id as usize).is_some_and(|&k| k == KIND_CONTROL)
    }

    /// The chat token ids of this vocabulary, looked up by string.
    pub fn chat_ids(&self) -> Result<ChatTokenIds, TokenizerError> {
        let need = |s: &str| {
            self.token_id(s).ok_or_else(|| TokenizerError::Vocab(format!("chat token `{s}` missing")))
        };
        Ok(ChatTokenIds {
            bos: need(special::BOS)?,
            eos: need(special::EOS)?,
            user: need(special::USER)?,
            assistant: need(special::ASSISTANT)?,
            think_start: need(special::THINK_START)?,
            think_end: need(special::THINK_END)?,
            dsml: need(special::DSML)?,
            latest_reminder: self.token_id(special::LATEST_REMINDER),
        })
    }

    /// The underlying `tokenizers::Tokenizer`.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

fn meta_int_array(v: &ds4_gguf::MetaValue) -> Option<Vec<i32>> {
    use ds4_gguf::MetaValue as M;
    let M::Array(_, items) = v else { return None };
    items
        .iter()
        .map(|x| match *x {
            M::U8(n) => Some(n as i32),
            M::I8(n) => Some(n as i32),
            M::U16(n) => Some(n as i32),
            M::I16(n) => Some(n as i32),
            M::U32(n) => i32::try_from(n).ok(),
            M::I32(n) => Some(n),
            M::U64(n) => i32::try_from(n).ok(),
            M::I64(n) => i32::try_from(n).ok(),
            _ => None,
        })
        .collect()
}
