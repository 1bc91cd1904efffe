//! GPT-2 byte-level alphabet: each byte is shown as one printable char in token strings.
//!
//! Bytes that are printable Latin-1 (`!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`) stand for themselves; the other
//! 68 bytes are mapped, in increasing byte order, to U+0100, U+0101, ... (so space 0x20 is `Ġ`,
//! newline 0x0A is `Ċ`).

/// True for the bytes that are shown as the char with the same code point.
const fn is_direct(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

const fn build_byte_to_char() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    let mut b = 0usize;
    while b < 256 {
        if is_direct(b as u8) {
            out[b] = match char::from_u32(b as u32) { Some(c) => c, None => '\0' };
        } else {
            out[b] = match char::from_u32(256 + n) { Some(c) => c, None => '\0' };
            n += 1;
        }
        b += 1;
    }
    out
}

const fn build_high_to_byte() -> [u8; 68] {
    let mut out = [0u8; 68];
    let mut n = 0usize;
    let mut b = 0usize;
    while b < 256 {
        if !is_direct(b as u8) {
            out[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    out
}

/// Byte for the alphabet chars U+0100..U+0143.
const HIGH_TO_BYTE: [u8; 68] = build_high_to_byte();

/// `BYTE_TO_CHAR[b]` is the alphabet char for byte `b`.
pub const BYTE_TO_CHAR: [char; 256] = build_byte_to_char();

/// The byte a char of the alphabet stands for, or None for chars outside the alphabet.
pub fn char_to_byte(c: char) -> Option<u8> {
    let u = c as u32;
    if u < 256 {
        let b = u as u8;
        if is_direct(b) { Some(b) } else { None }
    } else if (256..256 + 68).contains(&u) {
        Some(HIGH_TO_BYTE[(u - 256) as usize])
    } else {
        None
    }
}

/// Bytes a token string stands for, as the HF ByteLevel decoder does: if every char is in the
/// alphabet, the mapped bytes; otherwise (added tokens such as `<｜User｜>`) the string's UTF-8.
pub fn token_string_bytes(s: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    for c in s.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => return s.as_bytes().to_vec(),
        }
    }
    out
}

/// Token string of a byte sequence (each byte through the alphabet).
pub fn bytes_to_token_string(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| BYTE_TO_CHAR[b as usize]).collect()
}

/// True when every char of `s` is in the byte-level alphabet (a string BPE can produce).
pub fn is_byte_level_string(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| char_to_byte(c).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_a_bijection() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = BYTE_TO_CHAR[b as usize];
            assert!(seen.insert(c));
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(BYTE_TO_CHAR[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_TO_CHAR[b'\n' as usize], 'Ċ');
        assert_eq!(char_to_byte('｜'), None);
    }
}
