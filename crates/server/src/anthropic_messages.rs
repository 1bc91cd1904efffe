//! `POST /v1/messages` (Anthropic Messages): system + content blocks (text, thinking, tool_use,
//! tool_result) in; a `message` or the `message_start … message_stop` SSE lifecycle out, with thinking
//! blocks streamed live and `tool_use` blocks emitted once each call is complete.
use crate::app::App;
use crate::errors::{ApiError, Flavor};
use crate::fields::{self, Obj};
use crate::request;
use crate::sse::{self, SseOut};
use crate::tool_choice::{prefill_call, Forced, ToolChoice};
use crate::tools::{anthropic_tool_schemas, new_id};
use crate::worker::{CancelOnDrop, Event, Finish, Usage};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ds4_tokenizer::chat::{Message, Role, ThinkMode, ToolCall};
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::mpsc;

pub async fn handle(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    match run(app, body).await {
        Ok(r) => r,
        Err(e) => e.flavor(Flavor::Anthropic).into_response(),
    }
}

/// `POST /v1/messages/count_tokens`: the tokens the same request body would put in the prompt
/// (system, messages, tools and thinking mode rendered as `/v1/messages` renders them), as
/// `{"input_tokens": N}`; nothing is generated. A prompt over the context is the same 400.
pub async fn count_tokens(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    let run = async {
        let body = body?;
        let o: Obj = fields::parse_object(&body)?;
        let p = prompt_parts(&o, &app)?;
        drop(o);
        drop(body);
        let prompt = request::chat_prompt(&app, p.messages, p.tools, p.mode, true).await?;
        Ok::<_, ApiError>(Json(json!({ "input_tokens": prompt.tokens.len() })).into_response())
    };
    run.await.unwrap_or_else(|e| e.flavor(Flavor::Anthropic).into_response())
}

/// What a request puts in the prompt.
struct PromptParts {
    /// The conversation; with a forced tool choice it ends in the call's opening (an assistant prefill).
    messages: Vec<Message>,
    /// The last message's text (for `--test-script`).
    last: String,
    /// Tool schemas (none with `tool_choice: none`).
    tools: Vec<String>,
    mode: ThinkMode,
    forced: Option<Forced>,
    /// `tool_choice.disable_parallel_tool_use`.
    single_call: bool,
    /// Tool calls are parsed (not with `tool_choice: none`, whose calls the model writes anyway are text).
    calls: bool,
}

fn prompt_parts(o: &Obj, app: &App) -> Result<PromptParts, ApiError> {
    let (mut messages, last) = parse_conversation(o)?;
    check_prefill(&messages)?;
    let (choice, single_call) = ToolChoice::anthropic(o.get("tool_choice"))?;
    let tools = match fields::opt_array(o, "tools")? {
        Some(t) if choice.allows_tools() => anthropic_tool_schemas(t)?,
        _ => Vec::new(),
    };
    let forced = choice.forced(&tools)?;
    if let Some(f) = &forced {
        // As Anthropic's API: a forced tool use cannot follow extended thinking.
        if thinking_enabled(o) {
            return Err(ApiError::bad_request("Thinking may not be enabled when tool_choice forces tool use.").param("tool_choice"));
        }
        prefill_call(&mut messages, f, true);
    }
    Ok(PromptParts { messages, last, tools, mode: request::think_mode(o, app.default_mode)?, forced, single_call, calls: choice.allows_tools() })
}

/// Whether the request itself turns extended thinking on (`thinking: {type: enabled|adaptive}`).
fn thinking_enabled(o: &Obj) -> bool {
    match o.get("thinking") {
        Some(Value::Bool(b)) => *b,
        Some(Value::Object(t)) => matches!(t.get("type").and_then(Value::as_str), Some("enabled" | "adaptive")),
        _ => false,
    }
}

/// A conversation ending in an assistant message is an assistant prefill, continued from its text
/// (`chat_prompt` with `continue_last`); Anthropic refuses one whose text ends in whitespace, and a
/// last turn with tool calls wants their results, not a continuation.
fn check_prefill(messages: &[Message]) -> Result<(), ApiError> {
    match messages.last() {
        Some(m) if m.role == Role::Assistant && !m.tool_calls.is_empty() => {
            Err(ApiError::bad_request("messages: the last assistant message has `tool_use` blocks; send their `tool_result` blocks in a user message after it"))
        }
        Some(m) if m.role == Role::Assistant && m.content.ends_with(char::is_whitespace) => {
            Err(ApiError::bad_request("messages: final assistant content cannot end with trailing whitespace"))
        }
        _ => Ok(()),
    }
}

fn text_of(v: &Value, at: &str) -> Result<String, ApiError> {
    fields::content_text(v, at, &["text"])
}

/// `system` + `messages` → conversation, plus the text of the last message (for `--test-script`).
fn parse_conversation(o: &Obj) -> Result<(Vec<Message>, String), ApiError> {
    let mut out = Vec::new();
    if let Some(s) = o.get("system").filter(|v| !v.is_null()) {
        let t = text_of(s, "system")?;
        if !t.is_empty() {
            out.push(Message::system(t));
        }
    }
    let msgs = fields::opt_array(o, "messages")?.ok_or_else(|| ApiError::bad_request("`messages` is required"))?;
    if msgs.is_empty() {
        return Err(ApiError::bad_request("`messages` must not be empty"));
    }
    let mut last = String::new();
    for (i, m) in msgs.iter().enumerate() {
        let at = format!("messages[{i}]");
        let mo = m.as_object().ok_or_else(|| ApiError::bad_request(format!("{at} must be an object")))?;
        let role = fields::opt_str(mo, "role")?.ok_or_else(|| ApiError::bad_request(format!("{at}: `role` is required")))?;
        let content = mo.get("content").unwrap_or(&Value::Null);
        let blocks: Vec<Value> = match content {
            Value::String(s) => vec![json!({ "type": "text", "text": s })],
            Value::Array(a) => a.clone(),
            _ => return Err(ApiError::bad_request(format!("{at}: `content` must be a string or an array of content blocks"))),
        };
        match role {
            "user" => {
                let mut text = String::new();
                let mut results = Vec::new();
                for (k, b) in blocks.iter().enumerate() {
                    let bat = format!("{at}.content[{k}]");
                    let bo = b.as_object().ok_or_else(|| ApiError::bad_request(format!("{bat} must be an object")))?;
                    match bo.get("type").and_then(Value::as_str) {
                        Some("text") => text.push_str(fields::opt_str(bo, "text")?.unwrap_or("")),
                        Some("tool_result") => {
                            let id = fields::opt_str(bo, "tool_use_id")?.ok_or_else(|| ApiError::bad_request(format!("{bat}: `tool_use_id` is required")))?;
                            let c = text_of(bo.get("content").unwrap_or(&Value::Null), &bat)?;
                            results.push(Message::tool(id, c));
                        }
                        Some(t) => return Err(ApiError::bad_request(format!("{bat}: content block type `{t}` is not supported in user messages"))),
                        None => return Err(ApiError::bad_request(format!("{bat}: `type` is required"))),
                    }
                }
                last = if text.is_empty() { results.iter().map(|r| r.content.as_str()).collect::<Vec<_>>().join("\n") } else { text.clone() };
                out.extend(results);
                if !text.is_empty() || out.last().is_none_or(|m| m.role != Role::Tool) {
                    out.push(Message::user(text));
                }
            }
            "assistant" => {
                let mut msg = Message::assistant("");
                for (k, b) in blocks.iter().enumerate() {
                    let bat = format!("{at}.content[{k}]");
                    let bo = b.as_object().ok_or_else(|| ApiError::bad_request(format!("{bat} must be an object")))?;
                    match bo.get("type").and_then(Value::as_str) {
                        Some("text") => msg.content.push_str(fields::opt_str(bo, "text")?.unwrap_or("")),
                        Some("thinking") => {
                            let r = msg.reasoning.get_or_insert_with(String::new);
                            r.push_str(fields::opt_str(bo, "thinking")?.unwrap_or(""));
                        }
                        Some("redacted_thinking") => {}
                        Some("tool_use") => {
                            let id = fields::opt_str(bo, "id")?.map(str::to_string);
                            let name = fields::opt_str(bo, "name")?.ok_or_else(|| ApiError::bad_request(format!("{bat}: `name` is required")))?;
                            let input = bo.get("input").cloned().unwrap_or(json!({}));
                            if !input.is_object() {
                                return Err(ApiError::bad_request(format!("{bat}: `input` must be an object")));
                            }
                            msg.tool_calls.push(ToolCall { id, name: name.to_string(), arguments: input.to_string(), raw_dsml: None });
                        }
                        Some(t) => return Err(ApiError::bad_request(format!("{bat}: content block type `{t}` is not supported in assistant messages"))),
                        None => return Err(ApiError::bad_request(format!("{bat}: `type` is required"))),
                    }
                }
                last = msg.content.clone();
                out.push(msg);
            }
            r => return Err(ApiError::bad_request(format!("{at}: role must be \"user\" or \"assistant\", not `{r}`"))),
        }
    }
    Ok((out, last))
}

struct Meta {
    id: String,
    model: String,
    stops: Vec<String>,
}

fn stop_reason(f: Finish, stops: &[String]) -> (&'static str, Value) {
    match f {
        Finish::Stop => ("end_turn", Value::Null),
        Finish::Length => ("max_tokens", Value::Null),
        Finish::ToolCalls => ("tool_use", Value::Null),
        Finish::StopSequence(i) => ("stop_sequence", stops.get(i).map(|s| json!(s)).unwrap_or(Value::Null)),
    }
}

fn usage(u: &Usage) -> Value {
    json!({
        // Anthropic semantics: input_tokens + cache_read + cache_creation = the whole prompt.
        "input_tokens": u.prompt_tokens - u.cached_tokens.min(u.prompt_tokens),
        "output_tokens": u.completion_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
    })
}

async fn run(app: Arc<App>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = body?;
    let o: Obj = fields::parse_object(&body)?;
    let p = prompt_parts(&o, &app)?;
    let sampling = request::sampling(&o, &app)?;
    let max = request::max_tokens(&o, &["max_tokens"])?;
    let stops = fields::opt_stops(&o, "stop_sequences")?;
    let stream = fields::opt_bool(&o, "stream")?.unwrap_or(false);
    let model = fields::opt_str(&o, "model")?.unwrap_or(&app.ready()?.model_id).to_string();
    // The request JSON is not needed any more: free it before the prompt is rendered (bounded memory).
    drop(o);
    drop(body);
    let prompt = request::chat_prompt(&app, p.messages, p.tools, p.mode, true).await?;
    let mut params = request::params(&app, &prompt, sampling, max, stops.clone(), p.calls, "toolu_", &p.last);
    params.forced = p.forced;
    params.single_call = p.single_call;
    let (rx, guard) = app.ready()?.submitter.submit("messages", prompt.tokens, prompt.rendered, params)?;
    let meta = Meta { id: new_id("msg_"), model, stops };
    if stream {
        return Ok(sse::spawn(app.keepalive, move |out| stream_messages(rx, guard, out, meta)));
    }
    let c = request::collect(rx, guard).await?;
    let mut content = Vec::new();
    if !c.reasoning.is_empty() {
        content.push(json!({ "type": "thinking", "thinking": c.reasoning, "signature": "" }));
    }
    if !c.text.is_empty() {
        content.push(json!({ "type": "text", "text": c.text }));
    }
    for (id, name, args) in &c.calls {
        let input: Value = serde_json::from_str(args).unwrap_or(json!({}));
        content.push(json!({ "type": "tool_use", "id": id, "name": name, "input": input }));
    }
    let (reason, seq) = stop_reason(c.finish.unwrap_or(Finish::Stop), &meta.stops);
    Ok(Json(json!({
        "id": meta.id,
        "type": "message",
        "role": "assistant",
        "model": meta.model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": usage(&c.usage),
    }))
    .into_response())
}

#[derive(PartialEq, Clone, Copy)]
enum Open {
    None,
    Thinking,
    Text,
}

struct Blocks<'a> {
    out: &'a SseOut,
    open: Open,
    index: usize,
}

impl Blocks<'_> {
    async fn close(&mut self) -> bool {
        if self.open == Open::None {
            return true;
        }
        self.open = Open::None;
        let ok = self.out.named("content_block_stop", &json!({ "type": "content_block_stop", "index": self.index })).await;
        self.index += 1;
        ok
    }

    async fn delta(&mut self, kind: Open, s: String) -> bool {
        if self.open != kind {
            if !self.close().await {
                return false;
            }
            let block = if kind == Open::Thinking { json!({ "type": "thinking", "thinking": "", "signature": "" }) } else { json!({ "type": "text", "text": "" }) };
            if !self.out.named("content_block_start", &json!({ "type": "content_block_start", "index": self.index, "content_block": block })).await {
                return false;
            }
            self.open = kind;
        }
        let d = if kind == Open::Thinking { json!({ "type": "thinking_delta", "thinking": s }) } else { json!({ "type": "text_delta", "text": s }) };
        self.out.named("content_block_delta", &json!({ "type": "content_block_delta", "index": self.index, "delta": d })).await
    }
}

async fn stream_messages(mut rx: mpsc::UnboundedReceiver<Event>, _guard: CancelOnDrop, out: SseOut, meta: Meta) {
    let mut b = Blocks { out: &out, open: Open::None, index: 0 };
    while let Some(ev) = rx.recv().await {
        let ok = match ev {
            Event::Started { prompt_tokens, cached_tokens } => {
                let u = Usage { prompt_tokens, cached_tokens, completion_tokens: 0, reasoning_tokens: 0 };
                let m = json!({
                    "id": meta.id, "type": "message", "role": "assistant", "model": meta.model, "content": [],
                    "stop_reason": null, "stop_sequence": null, "usage": usage(&u),
                });
                out.named("message_start", &json!({ "type": "message_start", "message": m })).await
            }
            Event::Reasoning(s) => b.delta(Open::Thinking, s).await,
            Event::Text(s) => b.delta(Open::Text, s).await,
            Event::ToolStart => b.close().await,
            Event::Logprob(_) => true,
            Event::ToolDone { id, name, arguments, .. } => {
                let i = b.index;
                b.index += 1;
                out.named("content_block_start", &json!({ "type": "content_block_start", "index": i, "content_block": { "type": "tool_use", "id": id, "name": name, "input": {} } })).await
                    && out.named("content_block_delta", &json!({ "type": "content_block_delta", "index": i, "delta": { "type": "input_json_delta", "partial_json": arguments } })).await
                    && out.named("content_block_stop", &json!({ "type": "content_block_stop", "index": i })).await
            }
            Event::Done { finish, usage: u } => {
                if !b.close().await {
                    return;
                }
                let (reason, seq) = stop_reason(finish, &meta.stops);
                let d = json!({ "type": "message_delta", "delta": { "stop_reason": reason, "stop_sequence": seq }, "usage": { "output_tokens": u.completion_tokens } });
                if out.named("message_delta", &d).await {
                    out.named("message_stop", &json!({ "type": "message_stop" })).await;
                }
                return;
            }
            Event::Error(e) => {
                out.named("error", &e.flavor(Flavor::Anthropic).body()).await;
                return;
            }
        };
        if !ok {
            return;
        }
    }
    out.named("error", &ApiError::internal("the generation ended without a result").flavor(Flavor::Anthropic).body()).await;
}
