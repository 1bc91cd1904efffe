//! Streaming detokenizer: feed ids one at a time, get text that is always valid UTF-8.
//!
//! An incomplete UTF-8 sequence at the end of the pending bytes is held back until the next token
//! completes it. Invalid sequences become U+FFFD with the same rule as `String::from_utf8_lossy`
//! (one replacement per maximal invalid subpart), so the concatenation of all pieces plus
//! [`StreamDecoder::finish`] equals [`crate::Tokenizer::decode`] of the same ids.

use crate::Tokenizer;

#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self { pending: Vec::with_capacity(8) }
    }

    /// Append one token; returns the text that became complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.push_bytes(tok.token_bytes(id))
    }

    /// Append raw bytes; returns the text that became complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut start = 0usize;
        loop {
            let rest = &self.pending[start..];
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // valid prefix is UTF-8 by construction
                    if let Ok(s) = std::str::from_utf8(&rest[..valid]) {
                        out.push_str(s);
                    }
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            start += valid + n;
                        }
                        None => {
                            // incomplete sequence at the end: hold it back
                            start += valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }

    /// Bytes held back (an incomplete UTF-8 sequence, at most 3 bytes).
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// End of stream: a held-back incomplete sequence becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}
