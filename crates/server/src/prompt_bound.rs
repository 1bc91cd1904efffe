//! Tokenizing a prompt with bounded memory. The tokenizer's working memory is many times the text
//! (per-byte alignments, a string per token): a 50 MB prompt once cost 8.5 GB. Two bounds keep it small:
//! a text of B bytes has at least B / (longest token in bytes) tokens, so a prompt that cannot fit the
//! context is refused before any tokenizing; and the rest is tokenized in pieces of about `PIECE` bytes
//! cut where the pre-tokenizer always splits, stopping as soon as the context is exceeded.
use ds4_tokenizer::Tokenizer;

/// Target piece size in bytes.
const PIECE: usize = 64 << 10;

/// The fewest tokens a text of `bytes` bytes can have.
pub fn min_tokens(bytes: usize, max_token_bytes: usize) -> usize {
    bytes.div_ceil(max_token_bytes.max(1))
}

/// Whether `i` (a char boundary) is a place where the DeepSeek pre-tokenizer always splits, so the
/// tokens of `text[..i]` and `text[i..]` concatenate to the tokens of `text`: before an ASCII letter
/// that follows a line break, or before a single space between two ASCII letters. No pre-token pattern
/// spans either point (letters runs end at a space or line break; space runs and line-break runs end
/// before a letter; a space before letters starts the next word), and no added token contains one.
fn is_cut(b: &[u8], i: usize) -> bool {
    if i < 2 || i + 1 >= b.len() {
        return false;
    }
    let letter = |c: u8| c.is_ascii_alphabetic();
    (b[i - 1] == b'\n' && letter(b[i])) || (b[i] == b' ' && letter(b[i - 1]) && letter(b[i + 1]))
}

/// Where the piece starting at `start` ends: the first cut at or after `start + piece` (the piece runs
/// on when there is none: texts without cuts are rare and still bounded by the context check).
fn piece_end(b: &[u8], start: usize, piece: usize) -> usize {
    let target = start + piece;
    if target >= b.len() {
        return b.len();
    }
    (target..b.len()).find(|&i| is_cut(b, i)).unwrap_or(b.len())
}

/// Tokens of `text`, or Err(at least this many tokens) once more than `limit` are certain.
pub fn encode_bounded(tok: &Tokenizer, text: &str, limit: usize) -> Result<Vec<u32>, usize> {
    encode_in_pieces(tok, text, limit, PIECE)
}

fn encode_in_pieces(tok: &Tokenizer, text: &str, limit: usize, piece: usize) -> Result<Vec<u32>, usize> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    while start < b.len() {
        let end = piece_end(b, start, piece);
        out.extend(tok.encode(&text[start..end]));
        if out.len() > limit {
            return Err(out.len());
        }
        start = end;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_points() {
        let t = b"ab cd\nef  gh.\nij";
        let cuts: Vec<usize> = (0..t.len()).filter(|&i| is_cut(t, i)).collect();
        // before " cd" (space between letters) and before "ef" and "ij" (after a line break)
        assert_eq!(cuts, vec![2, 6, 14]);
    }

    fn embedded_tokenizer() -> Tokenizer {
        let src = ds4_engine::resolve_model(None).expect("embedded model");
        let f = ds4_gguf::GgufFile::open(src.path()).expect("open");
        Tokenizer::from_gguf(&f).expect("tokenizer")
    }

    /// Text with every kind of pre-token: words, runs of spaces, line breaks (also after spaces and
    /// punctuation), digits, punctuation, CJK, accents, emoji and special tokens.
    fn mixed_text(n: usize) -> String {
        let parts = [
            "hello", " world", "  two  spaces", "\n", "\n\n", " \nafter", "x.y", "12345", "3.14", "日本語テキスト", "é", "naïve",
            "🙂", "<｜User｜>", "<｜Assistant｜>", "</think>", "\t", "foo:\nbar", "(a, b)", "end.", "--", "ABC def", "\r\n", " ",
        ];
        let mut s = String::new();
        let mut x: u64 = 0x9E3779B97F4A7C15;
        while s.len() < n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            s.push_str(parts[(x % parts.len() as u64) as usize]);
        }
        s
    }

    #[test]
    fn pieces_tokenize_exactly_as_the_whole_text() {
        let tok = embedded_tokenizer();
        let text = mixed_text(40_000);
        let whole = tok.encode(&text);
        for piece in [1, 7, 50, 1000] {
            let cuts = (0..text.len()).filter(|&i| is_cut(text.as_bytes(), i)).count();
            assert!(cuts > 100, "the text must have many cut points ({cuts})");
            assert_eq!(encode_in_pieces(&tok, &text, usize::MAX, piece).unwrap(), whole, "piece size {piece}");
        }
    }

    #[test]
    fn stops_once_the_limit_is_passed() {
        let tok = embedded_tokenizer();
        let text = mixed_text(40_000);
        let n = tok.encode(&text).len();
        let over = encode_in_pieces(&tok, &text, n / 10, 500).unwrap_err();
        assert!(over > n / 10 && over < n / 2, "{over} of {n}");
        assert_eq!(encode_in_pieces(&tok, &text, n, 500).unwrap().len(), n);
    }

    #[test]
    fn longest_token_bounds_the_count() {
        let tok = embedded_tokenizer();
        let m = tok.max_token_bytes();
        assert!(m >= 2);
        let text = mixed_text(20_000);
        assert!(tok.encode(&text).len() >= min_tokens(text.len(), m));
    }

    #[test]
    fn min_tokens_rounds_up() {
        assert_eq!(min_tokens(0, 16), 0);
        assert_eq!(min_tokens(17, 16), 2);
        assert_eq!(min_tokens(10, 0), 10);
    }
}
