//! `POST /v1/completions` (OpenAI legacy completions): a raw prompt (text or token ids), no chat template.
use crate::app::App;
use crate::errors::{ApiError, Flavor};
use crate::fields::{self, Obj};
use crate::logprobs::{self, TokenLogprob};
use crate::request::{self, openai_finish, openai_usage, RawPrompt};
use crate::sse::{self, SseOut};
use crate::tools::new_id;
use crate::worker::{CancelOnDrop, Event};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::mpsc;

pub async fn handle(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    match run(app, body).await {
        Ok(r) => r,
        Err(e) => e.flavor(Flavor::OpenAi).into_response(),
    }
}

fn parse_prompt(v: Option<&Value>) -> Result<RawPrompt, ApiError> {
    let bad = || ApiError::bad_request("`prompt` must be a string, an array of one string, or an array of token ids").param("prompt");
    match v {
        None | Some(Value::Null) => Err(ApiError::bad_request("`prompt` is required").param("prompt")),
        Some(Value::String(s)) => Ok(RawPrompt::Text(s.clone())),
        Some(Value::Array(a)) if a.is_empty() => Err(ApiError::bad_request("`prompt` must not be empty").param("prompt")),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => Ok(RawPrompt::Text(a[0].as_str().unwrap_or_default().to_string())),
        Some(Value::Array(a)) if a.iter().all(Value::is_u64) => Ok(RawPrompt::Ids(a.iter().filter_map(Value::as_u64).collect())),
        Some(Value::Array(a)) if a.len() > 1 && a.iter().all(Value::is_string) => {
            Err(ApiError::bad_request("`prompt`: only one prompt per request is supported").param("prompt"))
        }
        _ => Err(bad()),
    }
}

type Meta = sse::OpenAiMeta;

async fn run(app: Arc<App>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = body?;
    let o: Obj = fields::parse_object(&body)?;
    let raw = parse_prompt(o.get("prompt"))?;
    let last = match &raw {
        RawPrompt::Text(t) => t.clone(),
        RawPrompt::Ids(_) => String::new(),
    };
    request::only_one_choice(&o)?;
    let sampling = request::sampling(&o, &app)?;
    let max = request::max_tokens(&o, &["max_tokens"])?.or(Some(16));
    let stops = fields::opt_stops(&o, "stop")?;
    let logprobs = logprobs::completions_request(&o)?;
    let stream = fields::opt_bool(&o, "stream")?.unwrap_or(false);
    let include_usage = match fields::opt_obj(&o, "stream_options")? {
        Some(so) => fields::opt_bool(so, "include_usage")?.unwrap_or(false),
        None => false,
    };
    let model = fields::opt_str(&o, "model")?.unwrap_or(&app.ready()?.model_id).to_string();
    drop(o);
    drop(body);
    let prompt = request::raw_prompt(&app, raw).await?;
    let mut params = request::params(&app, &prompt, sampling, max, stops, false, "call_", &last);
    params.logprobs = logprobs;
    let (rx, guard) = app.ready()?.submitter.submit("completion", prompt.tokens, None, params)?;
    let meta = Meta { id: new_id("cmpl-"), created: request::now_secs(), model, include_usage };
    if stream {
        let lp = logprobs.is_some();
        return Ok(sse::spawn(app.keepalive, move |out| stream_completion(rx, guard, out, meta, lp)));
    }
    let c = request::collect(rx, guard).await?;
    let lp = if logprobs.is_some() { logprobs::completions_json(&c.logprobs, &mut 0) } else { Value::Null };
    Ok(Json(json!({
        "id": meta.id,
        "object": "text_completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{ "index": 0, "text": c.text, "finish_reason": c.finish.map(openai_finish).unwrap_or("stop"), "logprobs": lp }],
        "usage": openai_usage(&c.usage),
    }))
    .into_response())
}

fn chunk(meta: &Meta, text: &str, finish: Option<&str>) -> Value {
    json!({
        "id": meta.id,
        "object": "text_completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{ "index": 0, "text": text, "finish_reason": finish, "logprobs": null }],
    })
}

/// Token logprobs not sent yet, and the text offset of the first of them.
struct Pending {
    entries: Vec<TokenLogprob>,
    offset: usize,
}

/// A text chunk carrying the logprobs of the tokens seen since the last one (when asked for).
fn text_chunk(meta: &Meta, text: &str, finish: Option<&str>, lp: &mut Option<Pending>) -> Value {
    let mut c = chunk(meta, text, finish);
    if let Some(p) = lp.as_mut() {
        c["choices"][0]["logprobs"] = logprobs::completions_json(&std::mem::take(&mut p.entries), &mut p.offset);
    }
    c
}

async fn stream_completion(mut rx: mpsc::UnboundedReceiver<Event>, _guard: CancelOnDrop, out: SseOut, meta: Meta, with_logprobs: bool) {
    let mut lp = with_logprobs.then(|| Pending { entries: Vec::new(), offset: 0 });
    while let Some(ev) = rx.recv().await {
        let ok = match ev {
            Event::Logprob(l) => {
                if let Some(p) = lp.as_mut() {
                    p.entries.push(l);
                }
                true
            }
            Event::Text(s) | Event::Reasoning(s) => out.data(&text_chunk(&meta, &s, None, &mut lp)).await,
            Event::Done { finish, usage } => {
                meta.finish(&out, "text_completion", &text_chunk(&meta, "", Some(openai_finish(finish)), &mut lp), openai_usage(&usage)).await;
                return;
            }
            Event::Error(e) => {
                out.data(&e.flavor(Flavor::OpenAi).body()).await;
                return;
            }
            _ => true,
        };
        if !ok {
            return;
        }
    }
    out.data(&ApiError::internal("the generation ended without a result").body()).await;
}
