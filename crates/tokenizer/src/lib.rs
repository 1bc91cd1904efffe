//! Tokenizer, chat rendering, DSML parsing, sampling for DeepSeek V4.
//!
//! * [`Tokenizer`] (`bpe.rs`): byte-level BPE through the `tokenizers` crate, built from GGUF-style
//!   parts or a GGUF file; added tokens are matched whole (see `special.rs` for how they are found).
//! * [`StreamDecoder`] (`stream_decode.rs`): token-by-token detokenizer that never emits broken UTF-8.
//! * [`real_vocab`], [`tiny_vocab`] (`vocab.rs`): embedded real V4 vocabulary and a small consistent one.
//! * `chat.rs`: prompt rendering; `dsml.rs`: streaming DSML tool-call parser;
//!   `sampling.rs`: sampler and stop-string matcher.
mod bpe;
pub mod byte_level;
pub mod chat;
pub mod dsml;
mod error;
mod json_scan;
pub mod sampling;
pub mod special;
mod stream_decode;
mod vocab;

pub use bpe::{Tokenizer, JOYAI_SPLITS};
pub use error::TokenizerError;
pub use special::ChatTokenIds;
pub use stream_decode::StreamDecoder;
pub use vocab::{
    find_token, parse_tokenizer_json, real_tokenizer, real_tokenizer_json, real_vocab, tiny_tokenizer, tiny_vocab,
    VocabParts, REAL_TOKENIZER_JSON_GZ, TINY_VOCAB_SIZE,
};
