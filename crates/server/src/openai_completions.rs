//! `POST /v1/completions` (OpenAI legacy completions): a raw prompt (text or token ids), no chat template.
use crate::app::App;
use crate::errors::{ApiError, Flavor};
use crate::fields::{self, Obj};
use crate::logprobs::{self, TokenLogprob};
use crate::request::{self, openai_finish, openai_usage, RawPrompt};
use crate::sse::{self, SseOut};
use crate::tools::new_id;
use crate::worker::{CancelOnDrop, Event, Usage};
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

/// `echo`: the reply's text starts with the prompt. Prompt logprobs are not computed (a reused KV
/// prefix has no logits for its positions), so `echo` with `logprobs` is refused.
fn echo_request(o: &Obj) -> Result<bool, ApiError> {
    let echo = fields::opt_bool(o, "echo")?.unwrap_or(false);
    if echo && o.get("logprobs").is_some_and(|v| !v.is_null() && *v != Value::Bool(false)) {
        return Err(ApiError::bad_request(
            "`echo` together with `logprobs` is not supported: this server does not compute the prompt tokens' logprobs; drop one of them",
        )
        .param("echo"));
    }
    Ok(echo)
}

/// Options this server cannot honour are refused rather than ignored: `suffix` (text to insert
/// before, fill-in-the-middle) and `best_of` above 1 (several candidates, the best returned).
fn unsupported_options(o: &Obj) -> Result<(), ApiError> {
    match o.get("suffix") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(_)) => {
            return Err(ApiError::bad_request("`suffix` is not supported: this server completes the prompt only (no fill-in-the-middle)").param("suffix"))
        }
        Some(_) => return Err(ApiError::bad_request("`suffix` must be a string or null").param("suffix")),
    }
    match fields::opt_u64(o, "best_of")? {
        None | Some(1) => Ok(()),
        Some(_) => Err(ApiError::bad_request("only `best_of`: 1 is supported (one candidate per request)").param("best_of")),
    }
}

/// The output limit: at least 1, except that `echo` allows 0 (the reply is then just the prompt).
fn completion_limit(o: &Obj, echo: bool) -> Result<Option<usize>, ApiError> {
    if echo && fields::opt_u64(o, "max_tokens")? == Some(0) {
        return Ok(Some(0));
    }
    Ok(request::max_tokens(o, &["max_tokens"])?.or(Some(16)))
}

/// The prompt as text, for `echo`: the string sent, or the token ids detokenized.
fn echo_text(app: &App, raw: &RawPrompt) -> Result<String, ApiError> {
    Ok(match raw {
        RawPrompt::Text(t) => t.clone(),
        RawPrompt::Ids(ids) => {
            let ids: Vec<u32> = ids.iter().map(|&i| i.min(u32::MAX as u64) as u32).collect();
            app.ready()?.tok.decode(&ids)
        }
    })
}

async fn run(app: Arc<App>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = body?;
    let o: Obj = fields::parse_object(&body)?;
    let raw = parse_prompt(o.get("prompt"))?;
    let last = match &raw {
        RawPrompt::Text(t) => t.clone(),
        RawPrompt::Ids(_) => String::new(),
    };
    request::only_one_choice(&o)?;
    unsupported_options(&o)?;
    let sampling = request::sampling(&o, &app)?;
    let echo = echo_request(&o)?;
    let max = completion_limit(&o, echo)?;
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
    // Only the ids of a prompt that tokenizes are detokenized (out-of-vocabulary ids are refused first).
    let echoed = if echo { Some(raw.clone()) } else { None };
    let prompt = request::raw_prompt(&app, raw).await?;
    let echoed = match echoed {
        Some(r) => echo_text(&app, &r)?,
        None => String::new(),
    };
    let meta = Meta { id: new_id("cmpl-"), created: request::now_secs(), model, include_usage };
    if max == Some(0) {
        return Ok(prompt_only(&app, meta, echoed, prompt.tokens.len(), stream));
    }
    let mut params = request::params(&app, &prompt, sampling, max, stops, false, "call_", &last);
    params.logprobs = logprobs;
    let (rx, guard) = app.ready()?.submitter.submit("completion", prompt.tokens, None, params)?;
    if stream {
        let lp = logprobs.is_some();
        return Ok(sse::spawn(app.keepalive, move |out| stream_completion(rx, guard, out, meta, lp, echoed)));
    }
    let c = request::collect(rx, guard).await?;
    let lp = if logprobs.is_some() { logprobs::completions_json(&c.logprobs, &mut 0) } else { Value::Null };
    Ok(Json(json!({
        "id": meta.id,
        "object": "text_completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{ "index": 0, "text": echoed + &c.text, "finish_reason": c.finish.map(openai_finish).unwrap_or("stop"), "logprobs": lp }],
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

/// `echo` with `max_tokens: 0`: the prompt is the whole reply; nothing is generated.
fn prompt_only(app: &App, meta: Meta, echoed: String, prompt_tokens: usize, stream: bool) -> Response {
    let usage = openai_usage(&Usage { prompt_tokens, ..Usage::default() });
    if stream {
        return sse::spawn(app.keepalive, move |out| async move {
            if out.data(&chunk(&meta, &echoed, None)).await {
                meta.finish(&out, "text_completion", &chunk(&meta, "", Some("length")), usage).await;
            }
        });
    }
    Json(json!({
        "id": meta.id,
        "object": "text_completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{ "index": 0, "text": echoed, "finish_reason": "length", "logprobs": null }],
        "usage": usage,
    }))
    .into_response()
}

async fn stream_completion(mut rx: mpsc::UnboundedReceiver<Event>, _guard: CancelOnDrop, out: SseOut, meta: Meta, with_logprobs: bool, echoed: String) {
    let mut lp = with_logprobs.then(|| Pending { entries: Vec::new(), offset: 0 });
    // The echoed prompt goes out first, as its own chunk.
    if !echoed.is_empty() && !out.data(&chunk(&meta, &echoed, None)).await {
        return;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Obj {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn echo_with_logprobs_is_refused() {
        assert!(!echo_request(&obj(json!({}))).unwrap());
        assert!(echo_request(&obj(json!({"echo": true, "logprobs": null}))).unwrap());
        assert!(echo_request(&obj(json!({"echo": true, "logprobs": false}))).unwrap());
        let e = echo_request(&obj(json!({"echo": true, "logprobs": 2}))).unwrap_err();
        assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some("echo")));
        assert!(e.message.contains("logprobs"));
        assert!(echo_request(&obj(json!({"echo": "yes"}))).is_err());
    }

    #[test]
    fn suffix_and_best_of_are_refused_not_ignored() {
        for ok in [json!({}), json!({"suffix": null, "best_of": null}), json!({"suffix": "", "best_of": 1})] {
            assert!(unsupported_options(&obj(ok.clone())).is_ok(), "{ok}");
        }
        for (bad, param) in [(json!({"suffix": " end"}), "suffix"), (json!({"suffix": 3}), "suffix"), (json!({"best_of": 2}), "best_of"), (json!({"best_of": 0}), "best_of"), (json!({"best_of": "2"}), "best_of")] {
            let e = unsupported_options(&obj(bad.clone())).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(param)), "{bad}");
        }
    }

    #[test]
    fn zero_max_tokens_only_with_echo() {
        assert_eq!(completion_limit(&obj(json!({"max_tokens": 0})), true).unwrap(), Some(0));
        assert!(completion_limit(&obj(json!({"max_tokens": 0})), false).is_err());
        assert_eq!(completion_limit(&obj(json!({})), true).unwrap(), Some(16));
        assert_eq!(completion_limit(&obj(json!({"max_tokens": 5})), true).unwrap(), Some(5));
    }
}
