//! Tool calls: unguessable call ids, the id → exact sampled DSML map (so a client sending a tool call
//! back gets byte-identical history and the live KV prefix still matches, spec §5.6), and the
//! conversion of each API's tool schemas into the JSON lines of the DSML tools prompt.
use crate::errors::ApiError;
use ds4_tokenizer::chat::{Message, Role};
use ds4_tokenizer::dsml::{parse_all, DsmlEvent};
use serde_json::{json, Value};
use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// `prefix` + 24 random alphanumerics (three [`random_u64`] words).
pub fn new_id(prefix: &str) -> String {
    const ALPHA: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(prefix.len() + 24);
    out.push_str(prefix);
    let words = [random_u64(), random_u64(), random_u64()];
    for i in 0..24 {
        let w = words[i / 8] >> ((i % 8) * 8);
        out.push(ALPHA[(w as usize) % ALPHA.len()] as char);
    }
    out
}

/// A random 64-bit number (the process's randomly keyed SipHash over a counter and the time; fresh keys
/// per call), e.g. the sampling seed of a request that sends none.
pub fn random_u64() -> u64 {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(n);
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    h.finish()
}

/// Bounded map from tool-call id to the exact DSML text sampled for the block containing that call
/// (including the whitespace that preceded the block). Oldest ids are forgotten first.
pub struct ToolMemory {
    map: HashMap<String, Arc<str>>,
    order: VecDeque<String>,
    max: usize,
}

impl ToolMemory {
    pub fn new(max: usize) -> Self {
        Self { map: HashMap::new(), order: VecDeque::new(), max }
    }

    pub fn insert(&mut self, ids: &[String], raw: &str) {
        if self.max == 0 {
            return;
        }
        let raw: Arc<str> = Arc::from(raw);
        for id in ids {
            if self.map.insert(id.clone(), raw.clone()).is_none() {
                self.order.push_back(id.clone());
            }
        }
        while self.map.len() > self.max {
            match self.order.pop_front() {
                Some(old) => {
                    self.map.remove(&old);
                }
                None => break,
            }
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<str>> {
        self.map.get(id).cloned()
    }

    /// Every remembered id with its DSML block.
    pub fn entries(&self) -> Vec<(String, Arc<str>)> {
        self.order.iter().filter_map(|id| self.map.get(id).map(|r| (id.clone(), r.clone()))).collect()
    }

    #[cfg_attr(not(test), allow(dead_code))]
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

/// For each assistant message with tool calls whose first id is remembered, replays the exact DSML
/// block — but only when that block parses back to the same calls (names and argument values), so
/// a client that edited its history gets the canonical rendering of what it sent. Returns how many
/// messages were replayed exactly.
pub fn apply_exact_replay(messages: &mut [Message], mem: &ToolMemory) -> usize {
    let mut n = 0;
    for m in messages.iter_mut().filter(|m| m.role == Role::Assistant && !m.tool_calls.is_empty()) {
        let Some(raw) = m.tool_calls[0].id.as_deref().and_then(|id| mem.get(id)) else { continue };
        let (events, malformed) = parse_all(&raw, false);
        if malformed {
            continue;
        }
        let parsed: Vec<(String, Option<Value>)> = events
            .into_iter()
            .filter_map(|e| match e {
                DsmlEvent::ToolCallDone { name, arguments_json } => Some((name, serde_json::from_str(&arguments_json).ok())),
                _ => None,
            })
            .collect();
        let same = parsed.len() == m.tool_calls.len()
            && parsed.iter().zip(&m.tool_calls).all(|((name, args), c)| {
                name == &c.name && args.is_some() && args.as_ref() == serde_json::from_str::<Value>(&c.arguments).ok().as_ref()
            });
        if same {
            m.tool_calls[0].raw_dsml = Some(raw.to_string());
            n += 1;
        }
    }
    n
}

fn schema_line(name: &Value, description: Option<&Value>, parameters: Option<&Value>, what: &str) -> Result<String, ApiError> {
    let Some(name) = name.as_str().filter(|s| !s.is_empty()) else {
        return Err(ApiError::bad_request(format!("{what}: each tool needs a non-empty string `name`")).param("tools"));
    };
    let mut o = serde_json::Map::new();
    o.insert("name".into(), json!(name));
    if let Some(d) = description.filter(|d| !d.is_null()) {
        if !d.is_string() {
            return Err(ApiError::bad_request(format!("{what}: tool `description` must be a string")).param("tools"));
        }
        o.insert("description".into(), d.clone());
    }
    if let Some(p) = parameters.filter(|p| !p.is_null()) {
        if !p.is_object() {
            return Err(ApiError::bad_request(format!("{what}: tool parameters must be a JSON schema object")).param("tools"));
        }
        o.insert("parameters".into(), p.clone());
    }
    Ok(Value::Object(o).to_string())
}

/// OpenAI Chat tools: `[{type:"function", function:{name, description, parameters}}]`.
pub fn chat_tool_schemas(tools: &[Value]) -> Result<Vec<String>, ApiError> {
    tools
        .iter()
        .map(|t| {
            let f = t.get("function").filter(|f| f.is_object()).ok_or_else(|| {
                ApiError::bad_request("tools: each tool must be {\"type\":\"function\",\"function\":{...}}").param("tools")
            })?;
            schema_line(f.get("name").unwrap_or(&Value::Null), f.get("description"), f.get("parameters"), "tools")
        })
        .collect()
}

/// Responses tools: `[{type:"function", name, description, parameters}]`; other (hosted) tool types
/// are skipped since this server cannot run them.
pub fn responses_tool_schemas(tools: &[Value]) -> Result<Vec<String>, ApiError> {
    let mut out = Vec::new();
    for t in tools {
        if !t.is_object() {
            return Err(ApiError::bad_request("tools: each tool must be an object").param("tools"));
        }
        if t.get("type").and_then(Value::as_str).unwrap_or("function") != "function" {
            continue;
        }
        out.push(schema_line(t.get("name").unwrap_or(&Value::Null), t.get("description"), t.get("parameters"), "tools")?);
    }
    Ok(out)
}

/// Anthropic tools: `[{name, description, input_schema}]`.
pub fn anthropic_tool_schemas(tools: &[Value]) -> Result<Vec<String>, ApiError> {
    tools
        .iter()
        .map(|t| {
            if !t.is_object() {
                return Err(ApiError::bad_request("tools: each tool must be an object").param("tools"));
            }
            schema_line(t.get("name").unwrap_or(&Value::Null), t.get("description"), t.get("input_schema"), "tools")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct_and_prefixed() {
        let a = new_id("call_");
        let b = new_id("call_");
        assert!(a.starts_with("call_") && a.len() == 29);
        assert_ne!(a, b);
    }

    #[test]
    fn memory_is_bounded() {
        let mut m = ToolMemory::new(2);
        m.insert(&["a".into()], "x");
        m.insert(&["b".into(), "c".into()], "y");
        assert_eq!(m.len(), 2);
        assert!(m.get("a").is_none());
        assert_eq!(m.get("c").as_deref(), Some("y"));
    }

    #[test]
    fn replay_only_when_calls_match() {
        let raw = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
        let mut mem = ToolMemory::new(10);
        mem.insert(&["call_1".into()], raw);
        let mut msgs = vec![Message::assistant("").with_tool_call("call_1", "f", "{\"x\": 1}")];
        assert_eq!(apply_exact_replay(&mut msgs, &mem), 1);
        assert_eq!(msgs[0].tool_calls[0].raw_dsml.as_deref(), Some(raw));
        let mut edited = vec![Message::assistant("").with_tool_call("call_1", "f", "{\"x\": 2}")];
        assert_eq!(apply_exact_replay(&mut edited, &mem), 0);
    }
}
