//! `POST /v1/responses` (OpenAI Responses): `input` items (messages, function_call,
//! function_call_output, reasoning) in; a `response` object or the Codex event lifecycle out
//! (`response.created` … `response.output_text.delta` … function-call argument events …
//! `response.completed` / `.incomplete` / `.failed`). No durable store: `previous_response_id` → 400.
use crate::app::App;
use crate::errors::{ApiError, Flavor};
use crate::fields::{self, Obj};
use crate::logprobs::{self, TokenLogprob};
use crate::request;
use crate::sse::{self, SseOut};
use crate::tool_choice::{prefill_call, ToolChoice};
use crate::tools::{new_id, responses_tool_schemas};
use crate::worker::{CancelOnDrop, Event, Finish, Usage};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ds4_tokenizer::chat::{Message, Role, ToolCall};
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::mpsc;

pub async fn handle(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    match run(app, body).await {
        Ok(r) => r,
        Err(e) => e.flavor(Flavor::OpenAi).into_response(),
    }
}

const PARTS: &[&str] = &["input_text", "output_text", "text", "summary_text", "reasoning_text"];

/// The assistant message being assembled from consecutive reasoning / message / function_call items.
fn open_assistant(out: &mut Vec<Message>) -> &mut Message {
    if out.last().is_none_or(|m| m.role != Role::Assistant) {
        out.push(Message::assistant(""));
    }
    out.last_mut().expect("just pushed")
}

fn parse_input(o: &Obj) -> Result<(Vec<Message>, String), ApiError> {
    let mut out = Vec::new();
    if let Some(i) = fields::opt_str(o, "instructions")? {
        out.push(Message::system(i));
    }
    let input = o.get("input").filter(|v| !v.is_null()).ok_or_else(|| ApiError::bad_request("`input` is required").param("input"))?;
    let items: Vec<Value> = match input {
        Value::String(s) => vec![json!({ "type": "message", "role": "user", "content": s })],
        Value::Array(a) => a.clone(),
        _ => return Err(ApiError::bad_request("`input` must be a string or an array of items").param("input")),
    };
    if items.is_empty() {
        return Err(ApiError::bad_request("`input` must not be empty").param("input"));
    }
    let mut last = String::new();
    for (i, it) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let io = it.as_object().ok_or_else(|| ApiError::bad_request(format!("{at} must be an object")).param("input"))?;
        let ty = fields::opt_str(io, "type").map_err(|e| e.param("input"))?.unwrap_or("message");
        match ty {
            "message" => {
                let role_s = fields::opt_str(io, "role").map_err(|e| e.param("input"))?.ok_or_else(|| ApiError::bad_request(format!("{at}: `role` is required")).param("input"))?;
                let role = match role_s {
                    "user" | "system" | "developer" | "assistant" => Role::parse(role_s).unwrap_or(Role::User),
                    r => return Err(ApiError::bad_request(format!("{at}: unknown role `{r}`")).param("input")),
                };
                let text = fields::content_text(io.get("content").unwrap_or(&Value::Null), &at, PARTS).map_err(|e| e.param("input"))?;
                last = text.clone();
                if role == Role::Assistant {
                    let m = open_assistant(&mut out);
                    if !m.content.is_empty() || !m.tool_calls.is_empty() {
                        out.push(Message::assistant(text));
                    } else {
                        m.content = text;
                    }
                } else {
                    out.push(Message::new(role, text));
                }
            }
            "reasoning" => {
                let pick = |k: &str| io.get(k).filter(|v| v.as_array().is_some_and(|a| !a.is_empty())).map(|v| fields::content_text(v, &at, PARTS));
                let text = match pick("content").or_else(|| pick("summary")) {
                    Some(r) => r.map_err(|e| e.param("input"))?,
                    None => String::new(),
                };
                if out.last().is_some_and(|m| m.role == Role::Assistant) {
                    out.push(Message::assistant(""));
                }
                open_assistant(&mut out).reasoning = Some(text);
            }
            "function_call" => {
                let call_id = fields::opt_str(io, "call_id").map_err(|e| e.param("input"))?.map(str::to_string);
                let name = fields::opt_str(io, "name").map_err(|e| e.param("input"))?.ok_or_else(|| ApiError::bad_request(format!("{at}: `name` is required")).param("input"))?;
                let arguments = fields::opt_str(io, "arguments").map_err(|e| e.param("input"))?.unwrap_or("{}").to_string();
                open_assistant(&mut out).tool_calls.push(ToolCall { id: call_id, name: name.to_string(), arguments, raw_dsml: None });
            }
            "function_call_output" => {
                let call_id = fields::opt_str(io, "call_id").map_err(|e| e.param("input"))?.ok_or_else(|| ApiError::bad_request(format!("{at}: `call_id` is required")).param("input"))?;
                let output = match io.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => fields::content_text(v, &at, PARTS).map_err(|e| e.param("input"))?,
                    _ => return Err(ApiError::bad_request(format!("{at}: `output` must be a string")).param("input")),
                };
                last = output.clone();
                out.push(Message::tool(call_id, output));
            }
            t => return Err(ApiError::bad_request(format!("{at}: item type `{t}` is not supported")).param("input")),
        }
    }
    Ok((out, last))
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    summary: bool,
    /// Output-text logprobs were asked for.
    logprobs: bool,
    /// Request fields the response object echoes (as OpenAI's does: `instructions`, `tools`, ...).
    echo: serde_json::Map<String, Value>,
}

/// The request's members that a Responses object reports back; absent ones keep the defaults.
const ECHOED: &[&str] = &["instructions", "metadata", "parallel_tool_calls", "tool_choice", "tools", "temperature", "top_p", "max_output_tokens", "text", "user"];

fn echoed(o: &Obj) -> serde_json::Map<String, Value> {
    ECHOED.iter().filter_map(|k| o.get(*k).filter(|v| !v.is_null()).map(|v| (k.to_string(), v.clone()))).collect()
}

fn usage(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        // The live KV reuse is reported as cache reads; nothing is billed as a cache write.
        "input_tokens_details": { "cached_tokens": u.cached_tokens, "cache_write_tokens": 0 },
        "output_tokens": u.completion_tokens,
        "output_tokens_details": { "reasoning_tokens": u.reasoning_tokens },
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

fn response(meta: &Meta, status: &str, output: &[Value], usage_v: Value, finish: Option<Finish>, error: Value) -> Value {
    let incomplete = if finish == Some(Finish::Length) { json!({ "reason": "max_output_tokens" }) } else { Value::Null };
    let mut r = json!({
        "id": meta.id,
        "object": "response",
        "created_at": meta.created,
        "status": status,
        "model": meta.model,
        "output": output,
        "usage": usage_v,
        "incomplete_details": incomplete,
        "error": error,
        "instructions": null,
        "metadata": {},
        "parallel_tool_calls": true,
        "tool_choice": "auto",
        "tools": [],
    });
    for (k, v) in &meta.echo {
        r[k] = v.clone();
    }
    r
}

fn reasoning_item(id: &str, text: &str, summary: bool) -> Value {
    let s = if summary { json!([{ "type": "summary_text", "text": text }]) } else { json!([]) };
    json!({ "type": "reasoning", "id": id, "summary": s, "content": [{ "type": "reasoning_text", "text": text }], "status": "completed" })
}

/// The `output_text` part; `logprobs` only when they were asked for.
fn text_part(text: &str, logprobs: Option<&[Value]>) -> Value {
    let mut p = json!({ "type": "output_text", "text": text, "annotations": [] });
    if let Some(l) = logprobs {
        p["logprobs"] = Value::Array(l.to_vec());
    }
    p
}

fn message_item(id: &str, text: &str, status: &str, logprobs: Option<&[Value]>) -> Value {
    json!({ "type": "message", "id": id, "role": "assistant", "status": status, "content": [text_part(text, logprobs)] })
}

fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({ "type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments, "status": status })
}

fn status_of(f: Finish) -> &'static str {
    if f == Finish::Length { "incomplete" } else { "completed" }
}

async fn run(app: Arc<App>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = body?;
    let o: Obj = fields::parse_object(&body)?;
    for k in ["previous_response_id", "conversation"] {
        if o.get(k).is_some_and(|v| !v.is_null()) {
            return Err(ApiError::bad_request(format!("`{k}` is not supported: this server keeps no response store; send the full input")).param(k));
        }
    }
    let (mut messages, last) = parse_input(&o)?;
    let choice = ToolChoice::responses(o.get("tool_choice"))?;
    let tools = match fields::opt_array(&o, "tools")? {
        Some(t) if choice.allows_tools() => responses_tool_schemas(t)?,
        _ => Vec::new(),
    };
    let forced = choice.forced(&tools)?;
    let single_call = fields::opt_bool(&o, "parallel_tool_calls")? == Some(false);
    let mode = request::think_mode(&o, app.default_mode)?;
    let summary = match fields::opt_obj(&o, "reasoning")? {
        Some(r) => matches!(fields::opt_str(r, "summary")?, Some("auto" | "concise" | "detailed")),
        None => false,
    };
    let sampling = request::sampling(&o, &app)?;
    let max = request::max_tokens(&o, &["max_output_tokens", "max_tokens"])?;
    let lp_top = logprobs::responses_request(&o)?;
    let stream = fields::opt_bool(&o, "stream")?.unwrap_or(false);
    let model = fields::opt_str(&o, "model")?.unwrap_or(&app.ready()?.model_id).to_string();
    let echo = echoed(&o);
    // The request JSON is not needed any more: free it before the prompt is rendered (bounded memory).
    drop(o);
    drop(body);
    let continue_last = match &forced {
        Some(f) => prefill_call(&mut messages, f, false),
        None => false,
    };
    let prompt = request::chat_prompt(&app, messages, tools, mode, continue_last).await?;
    // `tool_choice: none`: no call, also when the model writes one anyway (it is text).
    let mut params = request::params(&app, &prompt, sampling, max, Vec::new(), choice.allows_tools(), "call_", &last);
    params.logprobs = lp_top;
    params.forced = forced;
    params.single_call = single_call;
    let (rx, guard) = app.ready()?.submitter.submit("responses", prompt.tokens, prompt.rendered, params)?;
    let meta = Meta { id: new_id("resp_"), created: request::now_secs(), model, summary, logprobs: lp_top.is_some(), echo };
    if stream {
        return Ok(sse::spawn(app.keepalive, move |out| stream_responses(rx, guard, out, meta)));
    }
    let c = request::collect(rx, guard).await?;
    let mut output = Vec::new();
    if !c.reasoning.is_empty() {
        output.push(reasoning_item(&new_id("rs_"), &c.reasoning, meta.summary));
    }
    if !c.text.is_empty() {
        let lp: Vec<Value> = c.logprobs.iter().map(TokenLogprob::json).collect();
        output.push(message_item(&new_id("msg_"), &c.text, "completed", meta.logprobs.then_some(&lp[..])));
    }
    for (id, name, args) in &c.calls {
        output.push(call_item(&new_id("fc_"), id, name, args, "completed"));
    }
    let finish = c.finish.unwrap_or(Finish::Stop);
    Ok(Json(response(&meta, status_of(finish), &output, usage(&c.usage), Some(finish), Value::Null)).into_response())
}

#[derive(PartialEq, Clone, Copy)]
enum Open {
    None,
    Reasoning,
    Message,
}

struct Stream<'a> {
    out: &'a SseOut,
    meta: &'a Meta,
    seq: u64,
    items: Vec<Value>,
    open: Open,
    item_id: String,
    text: String,
    /// Logprobs of tokens whose text has not been sent yet.
    lp_pending: Vec<TokenLogprob>,
    /// Logprobs of the open message's text so far.
    lp_text: Vec<Value>,
}

impl Stream<'_> {
    /// The pending logprobs as JSON, also kept for the message's final content.
    fn take_logprobs(&mut self) -> Vec<Value> {
        let v: Vec<Value> = self.lp_pending.drain(..).map(|l| l.json()).collect();
        self.lp_text.extend(v.iter().cloned());
        v
    }

    async fn send(&mut self, ty: &str, mut v: Value) -> bool {
        v["type"] = json!(ty);
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.out.named(ty, &v).await
    }

    async fn close(&mut self) -> bool {
        let idx = self.items.len();
        let id = self.item_id.clone();
        let text = std::mem::take(&mut self.text);
        let ok = match self.open {
            Open::None => return true,
            Open::Reasoning => {
                let item = reasoning_item(&id, &text, self.meta.summary);
                let mut ok = self.send("response.reasoning_text.done", json!({ "item_id": id, "output_index": idx, "content_index": 0, "text": text })).await;
                if ok && self.meta.summary {
                    ok = self.send("response.reasoning_summary_text.done", json!({ "item_id": id, "output_index": idx, "summary_index": 0, "text": text })).await;
                }
                ok = ok && self.send("response.output_item.done", json!({ "output_index": idx, "item": item })).await;
                self.items.push(item);
                ok
            }
            Open::Message => {
                // Logprobs of text that never came (a stop, held-back whitespace) close the message.
                if !self.lp_pending.is_empty() {
                    let lp = self.take_logprobs();
                    if !self.send("response.output_text.delta", json!({ "item_id": id, "output_index": idx, "content_index": 0, "delta": "", "logprobs": lp })).await {
                        return false;
                    }
                }
                let lp = std::mem::take(&mut self.lp_text);
                let shown = self.meta.logprobs.then_some(&lp[..]);
                let item = message_item(&id, &text, "completed", shown);
                let part = text_part(&text, shown);
                let ok = self.send("response.output_text.done", json!({ "item_id": id, "output_index": idx, "content_index": 0, "text": text, "logprobs": lp })).await
                    && self.send("response.content_part.done", json!({ "item_id": id, "output_index": idx, "content_index": 0, "part": part })).await
                    && self.send("response.output_item.done", json!({ "output_index": idx, "item": item })).await;
                self.items.push(item);
                ok
            }
        };
        self.open = Open::None;
        ok
    }

    async fn delta(&mut self, kind: Open, s: String) -> bool {
        if self.open != kind {
            if !self.close().await {
                return false;
            }
            self.open = kind;
            let idx = self.items.len();
            if kind == Open::Reasoning {
                self.item_id = new_id("rs_");
                let item = json!({ "type": "reasoning", "id": self.item_id, "summary": [], "content": [], "status": "in_progress" });
                if !self.send("response.output_item.added", json!({ "output_index": idx, "item": item })).await {
                    return false;
                }
            } else {
                self.item_id = new_id("msg_");
                let item = json!({ "type": "message", "id": self.item_id, "role": "assistant", "status": "in_progress", "content": [] });
                let part = json!({ "type": "output_text", "text": "", "annotations": [] });
                if !(self.send("response.output_item.added", json!({ "output_index": idx, "item": item })).await
                    && self.send("response.content_part.added", json!({ "item_id": self.item_id, "output_index": idx, "content_index": 0, "part": part })).await)
                {
                    return false;
                }
            }
        }
        let idx = self.items.len();
        self.text.push_str(&s);
        let id = self.item_id.clone();
        if kind == Open::Reasoning {
            self.send("response.reasoning_text.delta", json!({ "item_id": id, "output_index": idx, "content_index": 0, "delta": s })).await
        } else {
            let lp = self.take_logprobs();
            self.send("response.output_text.delta", json!({ "item_id": id, "output_index": idx, "content_index": 0, "delta": s, "logprobs": lp })).await
        }
    }
}

async fn stream_responses(mut rx: mpsc::UnboundedReceiver<Event>, _guard: CancelOnDrop, out: SseOut, meta: Meta) {
    let mut st = Stream { out: &out, meta: &meta, seq: 0, items: Vec::new(), open: Open::None, item_id: String::new(), text: String::new(), lp_pending: Vec::new(), lp_text: Vec::new() };
    let skeleton = response(&meta, "in_progress", &[], Value::Null, None, Value::Null);
    if !(st.send("response.created", json!({ "response": skeleton.clone() })).await && st.send("response.in_progress", json!({ "response": skeleton })).await) {
        return;
    }
    while let Some(ev) = rx.recv().await {
        let ok = match ev {
            Event::Started { .. } => true,
            Event::Reasoning(s) => st.delta(Open::Reasoning, s).await,
            Event::Text(s) => st.delta(Open::Message, s).await,
            Event::Logprob(l) => {
                st.lp_pending.push(l);
                true
            }
            // A call's item is only added once the call is complete: a block cut short (the output
            // limit, a stop string, malformed DSML) comes back as text, and an item added early could
            // never be finished (the SDK's stream accumulator refuses a second item at its index).
            Event::ToolStart => true,
            Event::ToolDone { id, name, arguments, .. } => {
                if !st.close().await {
                    return;
                }
                let idx = st.items.len();
                let fc = new_id("fc_");
                let item = call_item(&fc, &id, &name, &arguments, "completed");
                let ok = st.send("response.output_item.added", json!({ "output_index": idx, "item": call_item(&fc, &id, &name, "", "in_progress") })).await
                    && st.send("response.function_call_arguments.delta", json!({ "item_id": fc, "output_index": idx, "delta": arguments })).await
                    && st.send("response.function_call_arguments.done", json!({ "item_id": fc, "output_index": idx, "name": name, "arguments": arguments })).await
                    && st.send("response.output_item.done", json!({ "output_index": idx, "item": item })).await;
                st.items.push(item);
                ok
            }
            Event::Done { finish, usage: u } => {
                if !st.close().await {
                    return;
                }
                let status = status_of(finish);
                let r = response(&meta, status, &st.items, usage(&u), Some(finish), Value::Null);
                let ty = if status == "completed" { "response.completed" } else { "response.incomplete" };
                st.send(ty, json!({ "response": r })).await;
                return;
            }
            Event::Error(e) => {
                let err = json!({ "code": "server_error", "message": e.message });
                let r = response(&meta, "failed", &st.items, Value::Null, None, err);
                st.send("response.failed", json!({ "response": r })).await;
                return;
            }
        };
        if !ok {
            return;
        }
    }
    let err = json!({ "code": "server_error", "message": "the generation ended without a result" });
    let r = response(&meta, "failed", &st.items, Value::Null, None, err);
    st.send("response.failed", json!({ "response": r })).await;
}
