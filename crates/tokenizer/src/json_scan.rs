//! Minimal order-preserving JSON helpers (serde_json's default map sorts keys, and tool arguments
//! must keep the client's key order and bytes).

/// Skip JSON whitespace from `i`.
fn ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// End (exclusive) of the JSON string starting at `i` (which must be `"`).
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
    None
}

/// End (exclusive) of the JSON value starting at `i` (validated afterwards by serde_json).
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth = depth.checked_sub(1)?;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                j += 1;
            }
            if j == i { None } else { Some(j) }
        }
    }
}

/// One top-level member of a JSON object: key, and either a decoded string or a minified raw value.
#[derive(Debug, Clone, PartialEq)]
pub enum ArgValue {
    Str(String),
    Raw(String),
}

/// Parse a JSON object into its members in source order. None if it is not a valid JSON object.
pub fn object_members(text: &str) -> Option<Vec<(String, ArgValue)>> {
    // validate the whole text first
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    if !v.is_object() {
        return None;
    }
    let b = text.as_bytes();
    let mut i = ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = ws(b, i + 1);
    let mut out = Vec::new();
    while i < b.len() && b[i] != b'}' {
        let ke = string_end(b, i)?;
        let key: String = serde_json::from_str(text.get(i..ke)?).ok()?;
        i = ws(b, ke);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = ws(b, i + 1);
        let ve = value_end(b, i)?;
        let raw = text.get(i..ve)?;
        let val = if b[i] == b'"' {
            ArgValue::Str(serde_json::from_str(raw).ok()?)
        } else {
            ArgValue::Raw(minify(raw))
        };
        out.push((key, val));
        i = ws(b, ve);
        if b.get(i) == Some(&b',') {
            i = ws(b, i + 1);
        }
    }
    Some(out)
}

/// Remove whitespace outside strings (keeps key order and number spelling).
pub fn minify(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut in_str = false;
    let mut esc = false;
    for c in raw.chars() {
        if in_str {
            out.push(c);
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == '"' {
                in_str = false;
            }
        } else if c == '"' {
            in_str = true;
            out.push(c);
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            out.push(c);
        }
    }
    out
}

/// JSON string literal of `s` (with quotes).
pub fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_keep_order_and_minify() {
        let m = object_members(r#" { "z": "a\"b", "a": [1, 2, {"y": 1, "b": 2}], "n" : null , "f": 1.50 } "#).unwrap();
        assert_eq!(m[0], ("z".into(), ArgValue::Str("a\"b".into())));
        assert_eq!(m[1], ("a".into(), ArgValue::Raw(r#"[1,2,{"y":1,"b":2}]"#.into())));
        assert_eq!(m[2], ("n".into(), ArgValue::Raw("null".into())));
        assert_eq!(m[3], ("f".into(), ArgValue::Raw("1.50".into())));
        assert!(object_members("[1]").is_none());
        assert!(object_members("{").is_none());
        assert!(object_members("").is_none());
        assert_eq!(object_members("{}").unwrap(), vec![]);
    }
}
