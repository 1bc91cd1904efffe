//! `POST /v1/chat/completions` (OpenAI Chat): messages with reasoning and tool calls in, `chat.completion`
//! or `chat.completion.chunk` SSE out (reasoning as `reasoning_content`, tool calls as `tool_calls`).
use crate::app::App;
use crate::errors::{ApiError, Flavor};
use crate::fields::{self, Obj};
use crate::logprobs::{self, TokenLogprob};
use crate::request::{self, openai_finish, openai_usage};
use crate::sse::{self, SseOut};
use crate::tool_choice::{prefill_call, ToolChoice};
use crate::tools::{chat_tool_schemas, new_id};
use crate::worker::{CancelOnDrop, Event};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ds4_tokenizer::chat::{ends_in_prefill, Message, Role, ToolCall};
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::mpsc;

pub async fn handle(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    match run(app, body).await {
        Ok(r) => r,
        Err(e) => e.flavor(Flavor::OpenAi).into_response(),
    }
}

/// Chat `messages` → conversation, plus the text of the last message (for `--test-script`).
pub fn parse_messages(arr: &[Value]) -> Result<(Vec<Message>, String), ApiError> {
    if arr.is_empty() {
        return Err(ApiError::bad_request("`messages` must not be empty").param("messages"));
    }
    let mut out = Vec::with_capacity(arr.len());
    for (i, m) in arr.iter().enumerate() {
        let at = format!("messages[{i}]");
        let o = m.as_object().ok_or_else(|| ApiError::bad_request(format!("{at} must be an object")).param("messages"))?;
        let role_s = fields::opt_str(o, "role").map_err(|e| e.param("messages"))?.ok_or_else(|| ApiError::bad_request(format!("{at}: `role` is required")).param("messages"))?;
        let role = Role::parse(role_s).ok_or_else(|| ApiError::bad_request(format!("{at}: unknown role `{role_s}`")).param("messages"))?;
        let content = fields::content_text(o.get("content").unwrap_or(&Value::Null), &at, &["text", "input_text", "output_text"]).map_err(|e| e.param("messages"))?;
        let mut msg = Message::new(role, content);
        let reasoning = match (fields::opt_str(o, "reasoning_content"), fields::opt_str(o, "reasoning")) {
            (Ok(Some(r)), _) | (Ok(None), Ok(Some(r))) => Some(r.to_string()),
            (Err(_), _) => return Err(ApiError::bad_request(format!("{at}: `reasoning_content` must be a string")).param("messages")),
            _ => None,
        };
        msg.reasoning = reasoning;
        if let Some(calls) = fields::opt_array(o, "tool_calls").map_err(|_| ApiError::bad_request(format!("{at}: `tool_calls` must be an array")).param("messages"))? {
            for (k, c) in calls.iter().enumerate() {
                let bad = || ApiError::bad_request(format!("{at}.tool_calls[{k}] must be {{id, type:\"function\", function:{{name, arguments}}}}")).param("messages");
                let f = c.get("function").and_then(Value::as_object).ok_or_else(bad)?;
                let name = f.get("name").and_then(Value::as_str).ok_or_else(bad)?;
                let arguments = match f.get("arguments") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Object(_)) => v.to_string(),
                    None | Some(Value::Null) => "{}".into(),
                    _ => return Err(bad()),
                };
                let id = match c.get("id") {
                    Some(Value::String(s)) => Some(s.clone()),
                    None | Some(Value::Null) => None,
                    _ => return Err(bad()),
                };
                msg.tool_calls.push(ToolCall { id, name: name.to_string(), arguments, raw_dsml: None });
            }
        }
        if role == Role::Tool {
            msg.tool_call_id = fields::opt_str(o, "tool_call_id").map_err(|e| e.param("messages"))?.map(str::to_string);
        }
        out.push(msg);
    }
    let last = out.last().map(|m| m.content.clone()).unwrap_or_default();
    Ok((out, last))
}

type Meta = sse::OpenAiMeta;

async fn run(app: Arc<App>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = body?;
    let o: Obj = fields::parse_object(&body)?;
    let msgs = fields::opt_array(&o, "messages")?.ok_or_else(|| ApiError::bad_request("`messages` is required").param("messages"))?;
    let (mut messages, last) = parse_messages(msgs)?;
    let choice = ToolChoice::openai_chat(o.get("tool_choice"))?;
    let tools = match fields::opt_array(&o, "tools")? {
        Some(t) if choice.allows_tools() => chat_tool_schemas(t)?,
        _ => Vec::new(),
    };
    let forced = choice.forced(&tools)?;
    let single_call = fields::opt_bool(&o, "parallel_tool_calls")? == Some(false);
    request::only_one_choice(&o)?;
    // vLLM's `continue_final_message`: the last (assistant) message is continued, not closed.
    let mut continue_last = fields::opt_bool(&o, "continue_final_message")?.unwrap_or(false);
    if continue_last && !ends_in_prefill(&messages) {
        return Err(ApiError::bad_request("`continue_final_message` needs a last message from the assistant without tool calls").param("continue_final_message"));
    }
    if let Some(f) = &forced {
        continue_last = prefill_call(&mut messages, f, continue_last);
    }
    let mode = request::think_mode(&o, app.default_mode)?;
    let sampling = request::sampling(&o, &app)?;
    let max = request::max_tokens(&o, &["max_completion_tokens", "max_tokens"])?;
    let stops = fields::opt_stops(&o, "stop")?;
    let logprobs = logprobs::chat_request(&o)?;
    let stream = fields::opt_bool(&o, "stream")?.unwrap_or(false);
    let include_usage = match fields::opt_obj(&o, "stream_options")? {
        Some(so) => fields::opt_bool(so, "include_usage")?.unwrap_or(false),
        None => false,
    };
    let model = fields::opt_str(&o, "model")?.unwrap_or(&app.ready()?.model_id).to_string();
    // The request JSON is not needed any more: free it before the prompt is rendered (bounded memory).
    drop(o);
    drop(body);
    let prompt = request::chat_prompt(&app, messages, tools, mode, continue_last).await?;
    // `tool_choice: none`: no call, also when the model writes one anyway (it is text).
    let mut params = request::params(&app, &prompt, sampling, max, stops, choice.allows_tools(), "call_", &last);
    params.logprobs = logprobs;
    params.forced = forced;
    params.single_call = single_call;
    let (rx, guard) = app.ready()?.submitter.submit("chat", prompt.tokens, prompt.rendered, params)?;
    let meta = Meta { id: new_id("chatcmpl-"), created: request::now_secs(), model, include_usage };
    if stream {
        let lp = logprobs.is_some();
        return Ok(sse::spawn(app.keepalive, move |out| stream_chat(rx, guard, out, meta, lp)));
    }
    let c = request::collect(rx, guard).await?;
    let finish = c.finish.map(openai_finish).unwrap_or("stop");
    let mut message = json!({ "role": "assistant", "content": if c.text.is_empty() && !c.calls.is_empty() { Value::Null } else { json!(c.text) } });
    if !c.reasoning.is_empty() {
        message["reasoning_content"] = json!(c.reasoning);
    }
    if !c.calls.is_empty() {
        message["tool_calls"] = Value::Array(
            c.calls.iter().map(|(id, name, args)| json!({ "id": id, "type": "function", "function": { "name": name, "arguments": args } })).collect(),
        );
    }
    Ok(Json(json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{ "index": 0, "message": message, "finish_reason": finish, "logprobs": if logprobs.is_some() { logprobs::chat_json(&c.logprobs) } else { Value::Null } }],
        "usage": openai_usage(&c.usage),
    }))
    .into_response())
}

fn chunk(meta: &Meta, delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "choices": [{ "index": 0, "delta": delta, "finish_reason": finish, "logprobs": null }],
    })
}

/// A content chunk carrying the logprobs of the tokens seen since the last one.
fn text_chunk(meta: &Meta, s: String, lp: &mut Option<Vec<TokenLogprob>>) -> Value {
    let mut c = chunk(meta, json!({ "content": s }), None);
    if let Some(l) = lp.as_mut() {
        c["choices"][0]["logprobs"] = logprobs::chat_json(&std::mem::take(l));
    }
    c
}

/// Logprobs whose text is still held back go out in an empty content chunk before `ev` is sent.
async fn flush_logprobs(out: &SseOut, meta: &Meta, lp: &mut Option<Vec<TokenLogprob>>) -> bool {
    match lp {
        Some(l) if !l.is_empty() => out.data(&text_chunk(meta, String::new(), lp)).await,
        _ => true,
    }
}

async fn stream_chat(mut rx: mpsc::UnboundedReceiver<Event>, _guard: CancelOnDrop, out: SseOut, meta: Meta, with_logprobs: bool) {
    if !out.data(&chunk(&meta, json!({ "role": "assistant", "content": "" }), None)).await {
        return;
    }
    // Token logprobs not sent yet (Some when the request asked for them).
    let mut lp: Option<Vec<TokenLogprob>> = with_logprobs.then(Vec::new);
    while let Some(ev) = rx.recv().await {
        let ok = match ev {
            Event::Started { .. } => true,
            Event::Logprob(l) => {
                if let Some(v) = lp.as_mut() {
                    v.push(l);
                }
                true
            }
            Event::Text(s) => out.data(&text_chunk(&meta, s, &mut lp)).await,
            Event::Reasoning(_) | Event::ToolDone { .. } | Event::Done { .. } if !flush_logprobs(&out, &meta, &mut lp).await => false,
            Event::Reasoning(s) => out.data(&chunk(&meta, json!({ "reasoning_content": s }), None)).await,
            // A call goes out whole once it is complete: one cut short (by the token limit, a stop
            // string, malformed DSML) then ends as text, as in the non-streamed answer, not as a call
            // with empty arguments beside that text.
            Event::ToolStart => true,
            Event::ToolDone { index, id, name, arguments } => {
                let d = json!({ "tool_calls": [{ "index": index, "id": id, "type": "function", "function": { "name": name, "arguments": arguments } }] });
                out.data(&chunk(&meta, d, None)).await
            }
            Event::Done { finish, usage } => {
                meta.finish(&out, "chat.completion.chunk", &chunk(&meta, json!({}), Some(openai_finish(finish))), openai_usage(&usage)).await;
                return;
            }
            Event::Error(e) => {
                out.data(&e.flavor(Flavor::OpenAi).body()).await;
                return;
            }
        };
        if !ok {
            return;
        }
    }
    out.data(&ApiError::internal("the generation ended without a result").body()).await;
}
