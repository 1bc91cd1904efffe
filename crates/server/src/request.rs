//! What every generation endpoint shares: sampling and thinking controls, output limits, prompt
//! rendering/tokenization with the context check, queueing, and collecting a non-streamed result.
use crate::app::App;
use crate::errors::ApiError;
use crate::fields::{self, Obj};
use crate::prompt_bound;
use crate::tools::apply_exact_replay;
use crate::worker::{CancelOnDrop, Event, Finish, GenParams, Usage};
use ds4_tokenizer::chat::{continues_assistant, render_chat, Message, RenderOptions, ThinkMode};
use ds4_tokenizer::sampling::SamplerConfig;
use ds4_tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Sampling knobs: server defaults for omitted ones, explicit values win (spec §5.4, R2 behaviour).
pub fn sampling(o: &Obj, app: &App) -> Result<SamplerConfig, ApiError> {
    let mut c = app.default_sampling;
    if let Some(t) = fields::opt_f64(o, "temperature")? {
        if !(0.0..=2.0).contains(&t) {
            return Err(ApiError::bad_request("`temperature` must be within [0, 2]").param("temperature"));
        }
        c.temperature = t as f32;
    }
    if let Some(p) = fields::opt_f64(o, "top_p")? {
        if !(0.0..=1.0).contains(&p) {
            return Err(ApiError::bad_request("`top_p` must be within [0, 1]").param("top_p"));
        }
        c.top_p = p as f32;
    }
    if let Some(p) = fields::opt_f64(o, "min_p")? {
        if !(0.0..=1.0).contains(&p) {
            return Err(ApiError::bad_request("`min_p` must be within [0, 1]").param("min_p"));
        }
        c.min_p = p as f32;
    }
    if let Some(k) = fields::opt_u64(o, "top_k")? {
        c.top_k = k.min(u32::MAX as u64) as usize;
    }
    // A request without a seed samples anew each time (as OpenAI's and Anthropic's APIs), unless the
    // server was started with `--seed`.
    c.seed = match fields::opt_i64_bits(o, "seed")? {
        Some(s) => s,
        None => app.default_seed.unwrap_or_else(crate::tools::random_u64),
    };
    Ok(c)
}

/// `n` (choices per request): only 1 is served; any other value is a 400 rather than fewer choices than
/// asked for.
pub fn only_one_choice(o: &Obj) -> Result<(), ApiError> {
    match fields::opt_u64(o, "n")? {
        None | Some(1) => Ok(()),
        Some(_) => Err(ApiError::bad_request("only `n`: 1 is supported").param("n")),
    }
}

/// The first present output limit among `names`; it must be at least 1.
pub fn max_tokens(o: &Obj, names: &[&str]) -> Result<Option<usize>, ApiError> {
    for n in names {
        if let Some(v) = fields::opt_u64(o, n)? {
            if v == 0 {
                return Err(ApiError::bad_request(format!("`{n}` must be at least 1")).param(n));
            }
            return Ok(Some(v.min(usize::MAX as u64 / 2) as usize));
        }
    }
    Ok(None)
}

fn effort(s: &str, key: &str) -> Result<ThinkMode, ApiError> {
    ThinkMode::from_reasoning_effort(s).ok_or_else(|| {
        ApiError::bad_request(format!("`{key}`: unknown reasoning effort `{s}` (none, minimal, low, medium, high, xhigh, max)")).param(key)
    })
}

/// Thinking mode of a request: the server default, then model aliases (`deepseek-chat` no thinking,
/// `deepseek-reasoner` thinking), then efforts (`reasoning_effort`, `reasoning.effort`,
/// `output_config.effort`), then explicit switches (`think`, `thinking`).
pub fn think_mode(o: &Obj, default: ThinkMode) -> Result<ThinkMode, ApiError> {
    let mut m = default;
    match fields::opt_str(o, "model")? {
        Some("deepseek-chat") => m = ThinkMode::None,
        Some("deepseek-reasoner") if m == ThinkMode::None => m = ThinkMode::High,
        _ => {}
    }
    if let Some(e) = fields::opt_str(o, "reasoning_effort")? {
        m = effort(e, "reasoning_effort")?;
    }
    if let Some(r) = fields::opt_obj(o, "reasoning")? {
        if let Some(e) = fields::opt_str(r, "effort").map_err(|e| e.param("reasoning.effort"))? {
            m = effort(e, "reasoning.effort")?;
        }
    }
    if let Some(oc) = fields::opt_obj(o, "output_config")? {
        if let Some(e) = fields::opt_str(oc, "effort").map_err(|e| e.param("output_config.effort"))? {
            m = effort(e, "output_config.effort")?;
        }
    }
    if let Some(t) = fields::opt_bool(o, "think")? {
        m = if t { on(m, default) } else { ThinkMode::None };
    }
    match o.get("thinking") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(b)) => m = if *b { on(m, default) } else { ThinkMode::None },
        Some(Value::Object(t)) => match t.get("type").and_then(Value::as_str) {
            Some("enabled") | Some("adaptive") => m = on(m, default),
            Some("disabled") => m = ThinkMode::None,
            _ => return Err(ApiError::bad_request("`thinking.type` must be \"enabled\" or \"disabled\"").param("thinking")),
        },
        Some(_) => return Err(ApiError::bad_request("`thinking` must be a boolean or an object").param("thinking")),
    }
    Ok(m)
}

fn on(current: ThinkMode, default: ThinkMode) -> ThinkMode {
    match (current, default) {
        (ThinkMode::None, ThinkMode::Max) => ThinkMode::Max,
        (ThinkMode::None, _) => ThinkMode::High,
        (m, _) => m,
    }
}

/// A rendered, tokenized prompt that fits the context.
pub struct Prompt {
    pub tokens: Vec<u32>,
    pub rendered: Option<String>,
    pub thinking: bool,
}

fn context_error(n: usize, ctx: usize) -> ApiError {
    ApiError::bad_request(format!(
        "the prompt has {n} tokens but the context is {ctx} tokens (at least one token must be left for the reply)"
    ))
    .code("context_length_exceeded")
    .param("messages")
    .extra("n_prompt_tokens", json!(n))
    .extra("n_ctx", json!(ctx))
}

/// The prompt is known to be too long before all of it was tokenized: `n` is a lower bound.
fn context_error_at_least(n: usize, ctx: usize) -> ApiError {
    ApiError::bad_request(format!(
        "the prompt has at least {n} tokens but the context is {ctx} tokens (at least one token must be left for the reply)"
    ))
    .code("context_length_exceeded")
    .param("messages")
    .extra("n_prompt_tokens", json!(n))
    .extra("n_ctx", json!(ctx))
}

/// Tokens of a prompt text that must leave room for one reply token: refused from its length alone when
/// it cannot fit, else tokenized in bounded pieces (`prompt_bound`).
fn encode_fitting(tok: &Tokenizer, text: &str, max_token_bytes: usize, ctx: usize) -> Result<Vec<u32>, ApiError> {
    let least = prompt_bound::min_tokens(text.len(), max_token_bytes);
    if least >= ctx {
        return Err(context_error_at_least(least, ctx));
    }
    prompt_bound::encode_bounded(tok, text, ctx - 1).map_err(|n| context_error_at_least(n, ctx))
}

/// Renders a conversation (tools block, thinking mode, exact DSML replay of known tool ids), tokenizes
/// it off the async threads, and checks it fits the context. With `continue_last` a conversation ending
/// in an assistant message is continued from its text (assistant prefill: Anthropic's last assistant
/// turn, OpenAI chat's `continue_final_message`); the reply then starts in the answer, not in a
/// thinking block.
pub async fn chat_prompt(app: &Arc<App>, mut messages: Vec<Message>, tools: Vec<String>, mode: ThinkMode, continue_last: bool) -> Result<Prompt, ApiError> {
    if app.exact_replay {
        if let Ok(mem) = app.tool_mem.lock() {
            let n = apply_exact_replay(&mut messages, &mem);
            app.metrics.tool_replay_exact.fetch_add(n as u64, Relaxed);
        }
    }
    let ctx = app.ctx;
    let ready = app.ready()?;
    let (tok, max_bytes) = (ready.tok.clone(), ready.max_token_bytes);
    let eff = mode.effective(ctx as u64);
    let (tokens, rendered, prefill) = tokio::task::spawn_blocking(move || {
        let opts = RenderOptions { mode: eff, ctx: ctx as u64, tools, developer_as_system: true, continue_last_assistant: continue_last, ..RenderOptions::default() };
        let text = render_chat(&messages, &opts);
        let prefill = continues_assistant(&messages, &opts);
        drop(messages);
        encode_fitting(&tok, &text, max_bytes, ctx).map(|t| (t, text, prefill))
    })
    .await
    .map_err(|_| ApiError::internal("prompt rendering failed"))??;
    if tokens.len() >= ctx {
        return Err(context_error(tokens.len(), ctx));
    }
    Ok(Prompt { tokens, rendered: Some(rendered), thinking: eff.thinking() && !prefill })
}

/// Raw completion prompt: BOS + text (unless the text already starts with BOS), or token ids.
pub async fn raw_prompt(app: &Arc<App>, prompt: RawPrompt) -> Result<Prompt, ApiError> {
    let ready = app.ready()?;
    let (tok, max_bytes, ctx) = (ready.tok.clone(), ready.max_token_bytes, app.ctx);
    let tokens = match prompt {
        RawPrompt::Ids(ids) => {
            let n = tok.n_vocab() as u64;
            if let Some(bad) = ids.iter().find(|&&i| i >= n) {
                return Err(ApiError::bad_request(format!("`prompt`: token id {bad} is outside the vocabulary (size {n})")).param("prompt"));
            }
            ids.into_iter().map(|i| i as u32).collect()
        }
        RawPrompt::Text(text) => tokio::task::spawn_blocking(move || {
            let bos = ds4_tokenizer::special::BOS;
            let text = if text.starts_with(bos) { text } else { format!("{bos}{text}") };
            encode_fitting(&tok, &text, max_bytes, ctx).map_err(|e| e.param("prompt"))
        })
        .await
        .map_err(|_| ApiError::internal("tokenization failed"))??,
    };
    if tokens.is_empty() {
        return Err(ApiError::bad_request("`prompt` must not be empty").param("prompt"));
    }
    if tokens.len() >= ctx {
        return Err(context_error(tokens.len(), ctx).param("prompt"));
    }
    Ok(Prompt { tokens, rendered: None, thinking: false })
}

#[derive(Debug, Clone)]
pub enum RawPrompt {
    Text(String),
    Ids(Vec<u64>),
}

/// Generation parameters for a prompt.
#[allow(clippy::too_many_arguments)]
pub fn params(
    app: &App,
    prompt: &Prompt,
    sampling: SamplerConfig,
    max_tokens: Option<usize>,
    stops: Vec<String>,
    parse_tools: bool,
    id_prefix: &'static str,
    last_text: &str,
) -> GenParams {
    let room = app.ctx - prompt.tokens.len();
    let script = app.script.as_ref().and_then(|s| s.find(last_text)).map(|o| app.ready().map(|r| r.tok.encode(o)).unwrap_or_default());
    GenParams {
        max_tokens: max_tokens.unwrap_or(app.default_max_tokens).min(room),
        sampling,
        stops,
        thinking: prompt.thinking,
        parse_tools,
        id_prefix,
        script,
        logprobs: None,
        forced: None,
        single_call: false,
    }
}

/// A finished generation, for non-streamed responses.
#[derive(Debug, Default)]
pub struct Collected {
    pub reasoning: String,
    pub text: String,
    /// (id, name, arguments JSON)
    pub calls: Vec<(String, String, String)>,
    pub finish: Option<Finish>,
    pub usage: Usage,
    /// Per-token logprobs of the visible text (when asked for).
    pub logprobs: Vec<crate::logprobs::TokenLogprob>,
}

/// Waits for the whole generation. A generation that ends without its final event is an error, never
/// an empty success (seed 003).
pub async fn collect(mut rx: mpsc::UnboundedReceiver<Event>, _guard: CancelOnDrop) -> Result<Collected, ApiError> {
    let mut c = Collected::default();
    while let Some(e) = rx.recv().await {
        match e {
            Event::Started { .. } => {}
            Event::Reasoning(s) => c.reasoning.push_str(&s),
            Event::Text(s) => c.text.push_str(&s),
            Event::Logprob(l) => c.logprobs.push(l),
            Event::ToolStart => {}
            Event::ToolDone { id, name, arguments, .. } => c.calls.push((id, name, arguments)),
            Event::Done { finish, usage } => {
                c.finish = Some(finish);
                c.usage = usage;
                return Ok(c);
            }
            Event::Error(e) => return Err(e),
        }
    }
    Err(ApiError::internal("the generation ended without a result"))
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// OpenAI usage object.
pub fn openai_usage(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": { "cached_tokens": u.cached_tokens, "cache_write_tokens": 0 },
        "completion_tokens_details": { "reasoning_tokens": u.reasoning_tokens },
    })
}

pub fn openai_finish(f: Finish) -> &'static str {
    match f {
        Finish::Stop | Finish::StopSequence(_) => "stop",
        Finish::Length => "length",
        Finish::ToolCalls => "tool_calls",
    }
}
