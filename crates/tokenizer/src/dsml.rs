//! Streaming parser for model output: reasoning, visible text and DSML tool calls
//! (spec dsv4-architecture.md §5.2, ds4-features.md §5.6).
//!
//! Feed decoded text pieces in order ([`DsmlParser::push`]); markers may be split anywhere across
//! pieces: text that could be the start of a marker is held back until decided. Events:
//! * `Reasoning` — inside `<think>…</think>` (the parser starts there when created for thinking mode,
//!   since the prompt ends with `<think>`);
//! * `Text` — visible content;
//! * `ToolCallStart{name}` once an `invoke` header is complete, `ToolCallDone{name, arguments_json}`
//!   at its close. Parameters with `string="true"` become JSON strings (`&lt;/｜DSML｜parameter>` is
//!   unescaped), `string="false"` values must be JSON literals;
//! * `Malformed{raw, reason}` — a block that cannot be parsed (bad syntax, invalid JSON literal,
//!   truncated at [`DsmlParser::finish`]): `raw` is the block's text, to be shown as text;
//!   [`DsmlParser::had_malformed`] is set. Parsing then continues in content state.

use crate::json_scan::{minify, quote};
use crate::special::{DSML, THINK_END};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DsmlEvent {
    Text(String),
    Reasoning(String),
    ToolCallStart { name: String },
    ToolCallDone { name: String, arguments_json: String },
    Malformed { raw: String, reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Reasoning,
    Content,
    /// Inside `<｜DSML｜tool_calls>`, between invokes.
    Block,
    /// Inside an invoke, between parameters.
    Invoke,
    /// Inside a parameter value.
    Param,
}

#[derive(Debug, Clone)]
pub struct DsmlParser {
    state: State,
    buf: String,
    /// Raw text of the current block since its start marker.
    block_raw: String,
    name: String,
    args: Vec<(String, bool, String)>,
    key: String,
    is_string: bool,
    value: String,
    json_in_str: bool,
    json_esc: bool,
    malformed: bool,
    calls: usize,
}

fn m_calls_open() -> String {
    format!("<{DSML}tool_calls>")
}
fn m_calls_close() -> String {
    format!("</{DSML}tool_calls>")
}
fn m_invoke_open() -> String {
    format!("<{DSML}invoke name=\"")
}
fn m_invoke_close() -> String {
    format!("</{DSML}invoke>")
}
fn m_param_open() -> String {
    format!("<{DSML}parameter name=\"")
}
fn m_param_close() -> String {
    format!("</{DSML}parameter>")
}

/// Length of the longest suffix of `buf` that is a proper prefix of one of `markers`.
fn held_suffix(buf: &str, markers: &[&str]) -> usize {
    for (i, _) in buf.char_indices() {
        let suf = &buf[i..];
        if markers.iter().any(|m| m.len() > suf.len() && m.starts_with(suf)) {
            return buf.len() - i;
        }
    }
    0
}

fn attr_unescape(s: &str) -> String {
    s.replace("&quot;", "\"").replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
}

impl DsmlParser {
    /// `thinking`: the prompt ended with `<think>`, so output starts as reasoning.
    pub fn new(thinking: bool) -> Self {
        Self {
            state: if thinking { State::Reasoning } else { State::Content },
            buf: String::new(),
            block_raw: String::new(),
            name: String::new(),
            args: Vec::new(),
            key: String::new(),
            is_string: true,
            value: String::new(),
            json_in_str: false,
            json_esc: false,
            malformed: false,
            calls: 0,
        }
    }

    /// True once any block was malformed.
    pub fn had_malformed(&self) -> bool {
        self.malformed
    }

    /// Number of completed tool calls.
    pub fn tool_calls(&self) -> usize {
        self.calls
    }

    /// Whether the next token is DSML syntax (tags, headers, JSON punctuation), which ds4 samples
    /// greedily; false for visible text, reasoning and payloads (string bodies, JSON string values).
    pub fn in_syntax(&self) -> bool {
        match self.state {
            State::Block | State::Invoke => true,
            State::Param => !self.is_string && !self.json_in_str,
            State::Reasoning | State::Content => false,
        }
    }

    /// Whether the parser is inside a tool-call block.
    pub fn in_tool_block(&self) -> bool {
        matches!(self.state, State::Block | State::Invoke | State::Param)
    }

    /// Feed one decoded text piece; returns the events it completes.
    pub fn push(&mut self, text: &str) -> Vec<DsmlEvent> {
        let mut ev = Vec::new();
        self.buf.push_str(text);
        while self.step(&mut ev) {}
        ev
    }

    /// End of output: releases held text; an unfinished block becomes `Malformed` ("truncated").
    pub fn finish(&mut self) -> Vec<DsmlEvent> {
        let mut ev = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Reasoning => {
                if !rest.is_empty() {
                    ev.push(DsmlEvent::Reasoning(rest));
                }
            }
            State::Content => {
                if !rest.is_empty() {
                    ev.push(DsmlEvent::Text(rest));
                }
            }
            _ => {
                let mut raw = std::mem::take(&mut self.block_raw);
                raw.push_str(&rest);
                self.malformed = true;
                ev.push(DsmlEvent::Malformed { raw, reason: "truncated tool-call block".into() });
            }
        }
        self.state = State::Content;
        ev
    }

    fn fail(&mut self, ev: &mut Vec<DsmlEvent>, reason: &str) {
        let mut raw = std::mem::take(&mut self.block_raw);
        raw.push_str(&self.buf);
        self.buf.clear();
        self.malformed = true;
        self.state = State::Content;
        ev.push(DsmlEvent::Malformed { raw, reason: reason.to_string() });
    }

    /// Move `n` bytes from the front of buf into the block's raw text.
    fn consume(&mut self, n: usize) {
        let taken: String = self.buf.drain(..n).collect();
        self.block_raw.push_str(&taken);
    }

    /// One state-machine step; returns true if it made progress and may continue.
    fn step(&mut self, ev: &mut Vec<DsmlEvent>) -> bool {
        match self.state {
            State::Reasoning => {
                if let Some(p) = self.buf.find(THINK_END) {
                    if p > 0 {
                        ev.push(DsmlEvent::Reasoning(self.buf[..p].to_string()));
                    }
                    self.buf.drain(..p + THINK_END.len());
                    self.state = State::Content;
                    return true;
                }
                let keep = held_suffix(&self.buf, &[THINK_END]);
                let n = self.buf.len() - keep;
                if n > 0 {
                    ev.push(DsmlEvent::Reasoning(self.buf[..n].to_string()));
                    self.buf.drain(..n);
                }
                false
            }
            State::Content => {
                let open = m_calls_open();
                let open_nl = format!("\n\n{open}");
                if let Some(p) = self.buf.find(&open) {
                    // the "\n\n" before the block belongs to the block
                    let start = if self.buf[..p].ends_with("\n\n") { p - 2 } else { p };
                    if start > 0 {
                        ev.push(DsmlEvent::Text(self.buf[..start].to_string()));
                    }
                    self.buf.drain(..start);
                    self.block_raw.clear();
                    let n = p - start + open.len();
                    self.consume(n);
                    self.state = State::Block;
                    return true;
                }
                let keep = held_suffix(&self.buf, &[&open, &open_nl]);
                let n = self.buf.len() - keep;
                if n > 0 {
                    ev.push(DsmlEvent::Text(self.buf[..n].to_string()));
                    self.buf.drain(..n);
                }
                false
            }
            State::Block => {
                let ws = self.buf.len() - self.buf.trim_start().len();
                if ws > 0 {
                    self.consume(ws);
                }
                if self.buf.is_empty() {
                    return false;
                }
                let close = m_calls_close();
                let inv = m_invoke_open();
                if self.buf.starts_with(&close) {
                    self.consume(close.len());
                    self.block_raw.clear();
                    self.state = State::Content;
                    return true;
                }
                if self.buf.starts_with(&inv) {
                    let Some(q) = self.buf[inv.len()..].find("\">") else {
                        if self.buf.contains('\n') {
                            self.fail(ev, "bad invoke header");
                        }
                        return false;
                    };
                    self.name = attr_unescape(&self.buf[inv.len()..inv.len() + q]);
                    self.args.clear();
                    self.consume(inv.len() + q + 2);
                    ev.push(DsmlEvent::ToolCallStart { name: self.name.clone() });
                    self.state = State::Invoke;
                    return true;
                }
                if close.starts_with(self.buf.as_str()) || inv.starts_with(self.buf.as_str()) {
                    return false; // partial marker
                }
                self.fail(ev, "expected invoke or end of tool_calls");
                false
            }
            State::Invoke => {
                let ws = self.buf.len() - self.buf.trim_start().len();
                if ws > 0 {
                    self.consume(ws);
                }
                if self.buf.is_empty() {
                    return false;
                }
                let close = m_invoke_close();
                let par = m_param_open();
                if self.buf.starts_with(&close) {
                    self.consume(close.len());
                    let mut json = String::from("{");
                    for (i, (k, is_s, v)) in self.args.iter().enumerate() {
                        if i > 0 {
                            json.push(',');
                        }
                        json.push_str(&quote(k));
                        json.push(':');
                        if *is_s {
                            json.push_str(&quote(v));
                        } else {
                            json.push_str(&minify(v));
                        }
                    }
                    json.push('}');
                    self.calls += 1;
                    ev.push(DsmlEvent::ToolCallDone { name: std::mem::take(&mut self.name), arguments_json: json });
                    self.state = State::Block;
                    return true;
                }
                if self.buf.starts_with(&par) {
                    let rest = &self.buf[par.len()..];
                    let Some(gt) = rest.find('>') else {
                        if rest.contains('\n') {
                            self.fail(ev, "bad parameter header");
                        }
                        return false;
                    };
                    let header = &rest[..gt];
                    let parsed = header
                        .strip_suffix("\" string=\"true\"")
                        .map(|k| (k, true))
                        .or_else(|| header.strip_suffix("\" string=\"false\"").map(|k| (k, false)));
                    let Some((k, is_s)) = parsed else {
                        self.fail(ev, "bad parameter header");
                        return false;
                    };
                    self.key = attr_unescape(k);
                    self.is_string = is_s;
                    self.value.clear();
                    self.json_in_str = false;
                    self.json_esc = false;
                    self.consume(par.len() + gt + 1);
                    self.state = State::Param;
                    return true;
                }
                if close.starts_with(self.buf.as_str()) || par.starts_with(self.buf.as_str()) {
                    return false;
                }
                self.fail(ev, "expected parameter or end of invoke");
                false
            }
            State::Param => {
                let close = m_param_close();
                let (n, done) = match self.buf.find(&close) {
                    Some(p) => (p, true),
                    None => (self.buf.len() - held_suffix(&self.buf, &[&close]), false),
                };
                if n > 0 {
                    let piece: String = self.buf[..n].to_string();
                    if !self.is_string {
                        for c in piece.chars() {
                            if self.json_in_str {
                                if self.json_esc {
                                    self.json_esc = false;
                                } else if c == '\\' {
                                    self.json_esc = true;
                                } else if c == '"' {
                                    self.json_in_str = false;
                                }
                            } else if c == '"' {
                                self.json_in_str = true;
                            }
                        }
                    }
                    self.value.push_str(&piece);
                    self.consume(n);
                }
                if !done {
                    return false;
                }
                self.consume(close.len());
                let mut v = std::mem::take(&mut self.value);
                if self.is_string {
                    v = v.replace(&format!("&lt;{}", &close[1..]), &close);
                } else if serde_json::from_str::<serde_json::Value>(&v).is_err() {
                    self.fail(ev, &format!("parameter `{}`: invalid JSON literal", self.key));
                    return false;
                }
                self.args.push((std::mem::take(&mut self.key), self.is_string, v));
                self.state = State::Invoke;
                true
            }
        }
    }
}

/// Parse a complete output in one go (convenience; same events as streaming).
pub fn parse_all(text: &str, thinking: bool) -> (Vec<DsmlEvent>, bool) {
    let mut p = DsmlParser::new(thinking);
    let mut ev = p.push(text);
    ev.extend(p.finish());
    (ev, p.had_malformed())
}
