//! Typed access to request JSON: absent or null fields are `None`, a field of the wrong type is a 400
//! naming the field. Unknown fields are ignored (as ds4 does).
use crate::errors::ApiError;
use serde_json::{Map, Value};

pub type Obj = Map<String, Value>;

/// Most JSON values a request may hold. A parsed value costs tens of bytes however short its text
/// (`0,` is two bytes), so a body of many tiny values would cost over ten times its size; real requests
/// hold at most thousands (long texts are one value each).
pub const MAX_JSON_VALUES: usize = 1 << 20;

/// Counts the values of a JSON text from its structure (separators and openers outside strings), a
/// cheap upper-bound estimate made before parsing.
fn json_values(body: &[u8]) -> usize {
    let (mut n, mut in_str, mut esc) = (1usize, false, false);
    for &c in body {
        if in_str {
            if esc {
                esc = false;
            } else if c == b'\\' {
                esc = true;
            } else if c == b'"' {
                in_str = false;
            }
        } else {
            match c {
                b'"' => in_str = true,
                b',' | b'[' | b'{' | b':' => n += 1,
                _ => {}
            }
        }
    }
    n
}

/// Parses a request body that must be a JSON object.
pub fn parse_object(body: &[u8]) -> Result<Obj, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request("invalid JSON request: empty body"));
    }
    if json_values(body) > MAX_JSON_VALUES {
        return Err(ApiError::new(
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            format!("request JSON has more than {MAX_JSON_VALUES} values"),
        )
        .code("request_too_large"));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::bad_request("invalid JSON request: the body must be a JSON object")),
        Err(e) => Err(ApiError::bad_request(format!("invalid JSON request: {e}"))),
    }
}

fn present<'a>(o: &'a Obj, key: &str) -> Option<&'a Value> {
    o.get(key).filter(|v| !v.is_null())
}

fn type_error(key: &str, what: &str) -> ApiError {
    ApiError::bad_request(format!("`{key}` must be {what}")).param(key)
}

pub fn opt_f64(o: &Obj, key: &str) -> Result<Option<f64>, ApiError> {
    match present(o, key) {
        None => Ok(None),
        Some(v) => v.as_f64().filter(|x| x.is_finite()).map(Some).ok_or_else(|| type_error(key, "a number")),
    }
}

/// A non-negative integer.
pub fn opt_u64(o: &Obj, key: &str) -> Result<Option<u64>, ApiError> {
    match present(o, key) {
        None => Ok(None),
        Some(v) => {
            if let Some(x) = v.as_u64() {
                return Ok(Some(x));
            }
            // 16.0 is accepted as 16; negative and fractional numbers are not.
            match v.as_f64() {
                Some(f) if f >= 0.0 && f.fract() == 0.0 && f < 1.8e19 => Ok(Some(f as u64)),
                _ => Err(type_error(key, "a non-negative integer")),
            }
        }
    }
}

/// Any integer (seeds may be negative in some clients); mapped to its two's complement.
pub fn opt_i64_bits(o: &Obj, key: &str) -> Result<Option<u64>, ApiError> {
    match present(o, key) {
        None => Ok(None),
        Some(v) => match (v.as_u64(), v.as_i64()) {
            (Some(u), _) => Ok(Some(u)),
            (None, Some(i)) => Ok(Some(i as u64)),
            _ => Err(type_error(key, "an integer")),
        },
    }
}

pub fn opt_bool(o: &Obj, key: &str) -> Result<Option<bool>, ApiError> {
    match present(o, key) {
        None => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or_else(|| type_error(key, "a boolean")),
    }
}

pub fn opt_str<'a>(o: &'a Obj, key: &str) -> Result<Option<&'a str>, ApiError> {
    match present(o, key) {
        None => Ok(None),
        Some(v) => v.as_str().map(Some).ok_or_else(|| type_error(key, "a string")),
    }
}

pub fn opt_array<'a>(o: &'a Obj, key: &str) -> Result<Option<&'a Vec<Value>>, ApiError> {
    match present(o, key) {
        None => Ok(None),
        Some(v) => v.as_array().map(Some).ok_or_else(|| type_error(key, "an array")),
    }
}

pub fn opt_obj<'a>(o: &'a Obj, key: &str) -> Result<Option<&'a Obj>, ApiError> {
    match present(o, key) {
        None => Ok(None),
        Some(v) => v.as_object().map(Some).ok_or_else(|| type_error(key, "an object")),
    }
}

/// `stop`: a string or an array of strings (at most 16). Empty strings can never match and are dropped
/// here, so the index a stop hit reports (the matcher skips them too) names the right entry.
pub fn opt_stops(o: &Obj, key: &str) -> Result<Vec<String>, ApiError> {
    let all: Vec<String> = match present(o, key) {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            if a.len() > 16 {
                return Err(ApiError::bad_request(format!("`{key}` allows at most 16 entries")).param(key));
            }
            a.iter()
                .map(|v| v.as_str().map(str::to_string).ok_or_else(|| type_error(key, "a string or an array of strings")))
                .collect::<Result<_, _>>()?
        }
        Some(_) => return Err(type_error(key, "a string or an array of strings")),
    };
    Ok(all.into_iter().filter(|s| !s.is_empty()).collect())
}

/// Text of a `content` value: a string, or an array of parts whose `text` members are concatenated
/// (parts of the listed `types`; other part types are rejected).
pub fn content_text(v: &Value, what: &str, types: &[&str]) -> Result<String, ApiError> {
    match v {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match p {
                    Value::String(s) => out.push_str(s),
                    Value::Object(po) => {
                        let ty = po.get("type").and_then(Value::as_str).unwrap_or("text");
                        if !types.contains(&ty) {
                            return Err(ApiError::bad_request(format!(
                                "{what}: content part type `{ty}` is not supported (supported: {})",
                                types.join(", ")
                            )));
                        }
                        match po.get("text") {
                            Some(Value::String(s)) => out.push_str(s),
                            _ => return Err(ApiError::bad_request(format!("{what}: a `{ty}` part needs a string `text`"))),
                        }
                    }
                    _ => return Err(ApiError::bad_request(format!("{what}: content parts must be objects"))),
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::bad_request(format!("{what}: `content` must be a string or an array of parts"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_stops_are_dropped() {
        let o = parse_object(br#"{"stop":["", "x", ""]}"#).unwrap();
        assert_eq!(opt_stops(&o, "stop").unwrap(), vec!["x".to_string()]);
    }

    #[test]
    fn value_count_ignores_strings() {
        assert_eq!(json_values(br#"{"a":"x,y:[{"}"#), 3);
        assert_eq!(json_values(br#"[0,0,0]"#), 4);
        assert_eq!(json_values(br#"{"a":"\"[,,,"}"#), 3);
    }

    #[test]
    fn many_tiny_values_are_refused_before_parsing() {
        let mut b = b"{\"x\":[".to_vec();
        for _ in 0..MAX_JSON_VALUES {
            b.extend_from_slice(b"0,");
        }
        b.extend_from_slice(b"0]}");
        let e = parse_object(&b).unwrap_err();
        assert_eq!(e.status.as_u16(), 413);
        // A long string is one value.
        let text = format!("{{\"content\":\"{}\"}}", ",".repeat(4 * MAX_JSON_VALUES));
        assert!(parse_object(text.as_bytes()).is_ok());
    }
}
