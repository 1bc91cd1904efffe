//! Chat prompt rendering (spec dsv4-architecture.md §5.2, ds4-features.md §5.4/§5.6).
//!
//! Produces the prompt as a String with special tokens written as their strings; `Tokenizer::encode`
//! then turns it into ids (added tokens are matched whole).
//!
//! Where the sources differ, this follows DS4's server renderer (the engine whose GGUFs and KV
//! prefixes we must match): tool schemas come before the client's system text, several tool results
//! of one user turn are concatenated without a separator (ENC 0731 uses "\n\n": see
//! [`RenderOptions::tool_result_separator`]). `developer` renders as `<｜User｜>` + content as the spec
//! says; DS4's server folds it into the system text instead ([`RenderOptions::developer_as_system`]).

use crate::json_scan::{object_members, ArgValue};
use crate::special::{ASSISTANT, BOS, DSML, EOS, LATEST_REMINDER, THINK_END, THINK_START, USER};

/// Think Max needs at least this context (DS4 `DS4_THINK_MAX_MIN_CONTEXT`).
pub const THINK_MAX_MIN_CONTEXT: u64 = 393_216;

/// The V4 "Reasoning Effort" prefix for Think Max (3 sentences + blank line), right after BOS.
pub const THINK_MAX_PREFIX: &str = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n\
You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, \
rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n\
Explicitly write out your entire deliberation process, documenting every intermediate step, considered \
alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

/// Thinking mode of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ThinkMode {
    /// Non-thinking: the reply opens with `</think>`.
    None,
    /// Normal thinking ("high"): the reply opens with `<think>`.
    #[default]
    High,
    /// Think Max: like High plus [`THINK_MAX_PREFIX`]; only when ctx ≥ [`THINK_MAX_MIN_CONTEXT`].
    Max,
}

impl ThinkMode {
    pub fn thinking(self) -> bool {
        !matches!(self, ThinkMode::None)
    }

    /// The mode actually used for a context size: Max falls back to High below 393216 (as ds4; the
    /// caller should warn when the result differs from `self`).
    pub fn effective(self, ctx: u64) -> ThinkMode {
        match self {
            ThinkMode::Max if ctx < THINK_MAX_MIN_CONTEXT => ThinkMode::High,
            m => m,
        }
    }

    /// Map a `reasoning_effort` value (ds4-features.md §5.4): max → Max; xhigh/high/medium/low/minimal
    /// → High; none → None. Unknown values: None returned (caller keeps its default).
    pub fn from_reasoning_effort(s: &str) -> Option<ThinkMode> {
        match s {
            "max" => Some(ThinkMode::Max),
            "xhigh" | "high" | "medium" | "low" | "minimal" => Some(ThinkMode::High),
            "none" => Some(ThinkMode::None),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    /// Tool result (`tool` / `function` roles).
    Tool,
    LatestReminder,
}

impl Role {
    /// Parse an API role name; unknown names give None.
    pub fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" | "function" => Role::Tool,
            "latest_reminder" => Role::LatestReminder,
            _ => return None,
        })
    }
}

/// One tool call of an assistant message (history).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolCall {
    pub id: Option<String>,
    pub name: String,
    /// Arguments as JSON text (an object); anything else is rendered as one `arguments` string.
    pub arguments: String,
    /// The exact DSML block sampled for this call set, replayed byte-exact when present
    /// (set on the first call of a message).
    pub raw_dsml: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// Assistant `reasoning_content`.
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    /// For tool results: the call they answer.
    pub tool_call_id: Option<String>,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self { role, content: content.into(), reasoning: None, tool_calls: Vec::new(), tool_call_id: None }
    }
    pub fn system(c: impl Into<String>) -> Self {
        Self::new(Role::System, c)
    }
    pub fn user(c: impl Into<String>) -> Self {
        Self::new(Role::User, c)
    }
    pub fn assistant(c: impl Into<String>) -> Self {
        Self::new(Role::Assistant, c)
    }
    pub fn tool(call_id: impl Into<String>, c: impl Into<String>) -> Self {
        let mut m = Self::new(Role::Tool, c);
        m.tool_call_id = Some(call_id.into());
        m
    }
    pub fn with_reasoning(mut self, r: impl Into<String>) -> Self {
        self.reasoning = Some(r.into());
        self
    }
    pub fn with_tool_call(mut self, id: &str, name: &str, arguments: &str) -> Self {
        self.tool_calls.push(ToolCall {
            id: Some(id.to_string()),
            name: name.to_string(),
            arguments: arguments.to_string(),
            raw_dsml: None,
        });
        self
    }
}

#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    pub mode: ThinkMode,
    /// Context size; Think Max needs ≥ [`THINK_MAX_MIN_CONTEXT`].
    pub ctx: u64,
    /// Tool schemas, one JSON object text each (the OpenAI tool's `function` value), one per line.
    pub tools: Vec<String>,
    /// Joins several tool results of one user turn (DS4: "", ENC 0731: "\n\n").
    pub tool_result_separator: String,
    /// Render `developer` like `system` (DS4 server) instead of `<｜User｜>` + content (spec / ENC).
    pub developer_as_system: bool,
    /// A conversation ending in an assistant message is continued (Anthropic's assistant prefill):
    /// that turn is left open, with no end-of-sentence and no new assistant turn after it, so the
    /// model writes on from its text (see [`continues_assistant`]).
    pub continue_last_assistant: bool,
}

/// Whether the conversation ends in an assistant message without tool calls: a turn that can be
/// continued (an assistant prefill).
pub fn ends_in_prefill(messages: &[Message]) -> bool {
    messages.last().is_some_and(|m| m.role == Role::Assistant && m.tool_calls.is_empty())
}

/// Whether `render_chat` leaves the last message open: asked for, and [`ends_in_prefill`]. Its text is
/// answer text, so generation starts in the answer (not in a thinking block), whatever the thinking mode.
pub fn continues_assistant(messages: &[Message], opts: &RenderOptions) -> bool {
    opts.continue_last_assistant && ends_in_prefill(messages)
}

/// The "## Tools" block appended to the system text (DS4 `append_tools_prompt_text`).
pub fn tools_prompt(schemas: &[String]) -> String {
    let lines: Vec<&str> = schemas.iter().map(|s| s.trim()).filter(|s| !s.is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let d = DSML;
    let mut s = String::new();
    s.push_str("## Tools\n\n");
    s.push_str("You have access to a set of tools to help answer the user question. ");
    s.push_str(&format!("You can invoke tools by writing a \"<{d}tool_calls>\" block like the following:\n\n"));
    s.push_str(&format!("<{d}tool_calls>\n"));
    s.push_str(&format!("<{d}invoke name=\"$TOOL_NAME\">\n"));
    s.push_str(&format!(
        "<{d}parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{d}parameter>\n"
    ));
    s.push_str("...\n");
    s.push_str(&format!("</{d}invoke>\n"));
    s.push_str(&format!("<{d}invoke name=\"$TOOL_NAME2\">\n"));
    s.push_str("...\n");
    s.push_str(&format!("</{d}invoke>\n"));
    s.push_str(&format!("</{d}tool_calls>\n\n"));
    s.push_str("String parameters should be specified as raw text and set `string=\"true\"`. ");
    s.push_str("Preserve characters such as `>`, `&`, and `&&` exactly; never replace normal string characters with XML or HTML entity escapes. ");
    s.push_str(&format!(
        "Only if a string value itself contains the exact closing parameter tag `</{d}parameter>`, write that tag as `&lt;/{d}parameter>` inside the value. "
    ));
    s.push_str("For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n");
    s.push_str("If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n");
    s.push_str("Otherwise, output directly after </think> with tool calls or final response.\n\n");
    s.push_str("### Available Tool Schemas\n\n");
    s.push_str(&lines.join("\n"));
    s.push_str("\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls. ");
    s.push_str("Use the exact parameter names from the schemas.");
    s
}

/// Replace the first `<` of every occurrence of `needle` with `repl` (DS4's escaping of closing tags).
fn escape_closing(s: &str, needle: &str, repl: &str) -> String {
    if !s.contains(needle) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 8);
    let mut rest = s;
    while let Some(p) = rest.find(needle) {
        out.push_str(&rest[..p]);
        out.push_str(repl);
        out.push_str(&needle[1..]);
        rest = &rest[p + needle.len()..];
    }
    out.push_str(rest);
    out
}

fn attr_escape(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
}

fn param_close() -> String {
    format!("</{DSML}parameter>")
}

fn push_param(out: &mut String, key: &str, is_string: bool, value: &str) {
    let close = param_close();
    out.push_str(&format!("<{DSML}parameter name=\""));
    attr_escape(key, out);
    out.push_str(if is_string { "\" string=\"true\">" } else { "\" string=\"false\">" });
    if is_string {
        out.push_str(&escape_closing(value, &close, "&lt;"));
    } else {
        out.push_str(&escape_closing(value, &close, "\\u003c"));
    }
    out.push_str(&close);
    out.push('\n');
}

/// The DSML block for a list of calls (DS4 `append_dsml_tool_calls_text`): replays `raw_dsml` of the
/// first call when present, else the canonical form. Empty for no calls.
pub fn dsml_tool_calls(calls: &[ToolCall]) -> String {
    let Some(first) = calls.first() else { return String::new() };
    if let Some(raw) = first.raw_dsml.as_deref().filter(|r| !r.is_empty()) {
        return raw.to_string();
    }
    let mut out = format!("\n\n<{DSML}tool_calls>\n");
    for c in calls {
        out.push_str(&format!("<{DSML}invoke name=\""));
        attr_escape(&c.name, &mut out);
        out.push_str("\">\n");
        match object_members(&c.arguments) {
            Some(members) => {
                for (k, v) in members {
                    match v {
                        ArgValue::Str(s) => push_param(&mut out, &k, true, &s),
                        ArgValue::Raw(r) => push_param(&mut out, &k, false, &r),
                    }
                }
            }
            None => push_param(&mut out, "arguments", true, &c.arguments),
        }
        out.push_str(&format!("</{DSML}invoke>\n"));
    }
    out.push_str(&format!("</{DSML}tool_calls>"));
    out
}

/// The start of a tool-call block as [`dsml_tool_calls`] writes it: up to the block's opening, or with
/// `name` through that call's `invoke` header (what a forced tool choice puts at the start of a reply).
pub fn dsml_call_opening(name: Option<&str>) -> String {
    let mut out = format!("\n\n<{DSML}tool_calls>\n");
    if let Some(n) = name {
        out.push_str(&format!("<{DSML}invoke name=\""));
        attr_escape(n, &mut out);
        out.push_str("\">\n");
    }
    out
}

/// Render a conversation to prompt text (see module docs and spec §5.2).
pub fn render_chat(messages: &[Message], opts: &RenderOptions) -> String {
    let mode = opts.mode.effective(opts.ctx);
    let think = mode.thinking();
    let is_system = |r: Role| r == Role::System || (opts.developer_as_system && r == Role::Developer);
    let is_user_like =
        |r: Role| r == Role::User || r == Role::Tool || (!opts.developer_as_system && r == Role::Developer);

    // "if any message carries tools nothing is dropped"
    let tool_context = !tools_prompt(&opts.tools).is_empty()
        || messages.iter().any(|m| (m.role == Role::Assistant && !m.tool_calls.is_empty()) || m.role == Role::Tool);
    let last_user = messages.iter().rposition(|m| is_user_like(m.role));

    // system text: tool block first, then system messages joined by a blank line
    let mut system = tools_prompt(&opts.tools);
    for m in messages.iter().filter(|m| is_system(m.role)) {
        if !system.is_empty() {
            system.push_str("\n\n");
        }
        system.push_str(&m.content);
    }

    let order = tool_result_order(messages);
    let open_last = continues_assistant(messages, opts).then(|| messages.len() - 1);

    let mut out = String::from(BOS);
    if mode == ThinkMode::Max {
        out.push_str(THINK_MAX_PREFIX);
    }
    out.push_str(&system);

    let mut pending_assistant = false;
    let mut pending_tool_result = false;
    for &i in &order {
        let m = &messages[i];
        match m.role {
            r if is_system(r) => {}
            Role::User | Role::Developer => {
                out.push_str(USER);
                out.push_str(&m.content);
                pending_assistant = true;
                pending_tool_result = false;
            }
            Role::Tool => {
                if !pending_tool_result {
                    out.push_str(USER);
                } else {
                    out.push_str(&opts.tool_result_separator);
                }
                out.push_str("<tool_result>");
                out.push_str(&escape_closing(&m.content, "</tool_result>", "&lt;"));
                out.push_str("</tool_result>");
                pending_assistant = true;
                pending_tool_result = true;
            }
            Role::LatestReminder => {
                out.push_str(LATEST_REMINDER);
                out.push_str(&m.content);
            }
            Role::Assistant => {
                if pending_assistant {
                    out.push_str(ASSISTANT);
                    let keep_reasoning = tool_context || last_user.is_none_or(|lu| i > lu);
                    // A prefill without reasoning is answer text: no (empty) thinking block before it.
                    let bare_prefill = open_last == Some(i) && m.reasoning.is_none();
                    if think && keep_reasoning && !bare_prefill {
                        out.push_str(THINK_START);
                        out.push_str(m.reasoning.as_deref().unwrap_or(""));
                        out.push_str(THINK_END);
                    } else {
                        out.push_str(THINK_END);
                    }
                }
                out.push_str(&m.content);
                if open_last == Some(i) {
                    // The prefill: the model continues this turn.
                    return out;
                }
                out.push_str(&dsml_tool_calls(&m.tool_calls));
                out.push_str(EOS);
                pending_assistant = false;
                pending_tool_result = false;
            }
            Role::System => {}
        }
    }
    if pending_assistant {
        out.push_str(ASSISTANT);
        out.push_str(if think { THINK_START } else { THINK_END });
    }
    out
}

/// Message order for rendering: a run of tool results right after an assistant message with calls is
/// sorted by the position of each result's `tool_call_id` among those calls (unknown ids keep their
/// relative order, after the known ones).
fn tool_result_order(messages: &[Message]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..messages.len()).collect();
    let mut i = 0;
    while i < messages.len() {
        if messages[i].role == Role::Assistant && !messages[i].tool_calls.is_empty() {
            let calls = &messages[i].tool_calls;
            let start = i + 1;
            let mut end = start;
            while end < messages.len() && messages[end].role == Role::Tool {
                end += 1;
            }
            let rank = |k: usize| {
                let id = messages[k].tool_call_id.as_deref();
                calls.iter().position(|c| c.id.is_some() && c.id.as_deref() == id).unwrap_or(usize::MAX)
            };
            order[start..end].sort_by_key(|&k| rank(k)); // stable
            i = end;
        } else {
            i += 1;
        }
    }
    order
}
