//! Shared server state and the router: endpoints, API-key check, request accounting, CORS, body limit,
//! and JSON 404/405 answers in the API's own error shape.
use crate::args::Args;
use crate::errors::{ApiError, Flavor};
use crate::metrics::Metrics;
use crate::script::Script;
use crate::tools::ToolMemory;
use crate::worker::Submitter;
use crate::{anthropic_messages, models, openai_chat, openai_completions, openai_responses};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use ds4_tokenizer::chat::ThinkMode;
use ds4_tokenizer::sampling::SamplerConfig;
use ds4_tokenizer::Tokenizer;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// What exists once the model is loaded (the HTTP listener is up before that).
pub struct Ready {
    /// `deepseek-v4-flash` or `deepseek-v4-pro`, from the loaded model's shape.
    pub model_id: String,
    pub tok: Arc<Tokenizer>,
    /// Bytes of the longest token: a text of B bytes has at least B / this many tokens.
    pub max_token_bytes: usize,
    pub submitter: Submitter,
    /// `--role coordinator`: the route's registry (for /health).
    pub coordinator: Option<Arc<ds4_dist::Coordinator>>,
}

pub struct App {
    pub ctx: usize,
    pub default_max_tokens: usize,
    pub ready: OnceLock<Ready>,
    /// What the server is doing while not ready (for /health).
    pub loading: Mutex<String>,
    pub metrics: Arc<Metrics>,
    pub tool_mem: Arc<Mutex<ToolMemory>>,
    pub script: Option<Script>,
    pub default_mode: ThinkMode,
    pub default_sampling: SamplerConfig,
    /// `--seed`: the seed of requests without one (None: a fresh random seed per request).
    pub default_seed: Option<u64>,
    pub exact_replay: bool,
    pub api_key: Option<String>,
    pub keepalive: Duration,
}

impl App {
    pub fn from_args(args: &Args, metrics: Arc<Metrics>, tool_mem: Arc<Mutex<ToolMemory>>, script: Option<Script>) -> Self {
        let default_mode = if args.nothink {
            ThinkMode::None
        } else if args.think_max {
            ThinkMode::Max
        } else {
            ThinkMode::High
        };
        Self {
            ctx: args.ctx,
            default_max_tokens: args.tokens,
            ready: OnceLock::new(),
            loading: Mutex::new("starting".into()),
            metrics,
            tool_mem,
            script,
            default_mode,
            default_sampling: SamplerConfig { temperature: args.temp, top_k: args.top_k, top_p: args.top_p, min_p: args.min_p, seed: args.seed.unwrap_or(0) },
            default_seed: args.seed,
            exact_replay: !args.disable_exact_dsml_tool_replay,
            api_key: args.api_key.clone(),
            keepalive: Duration::from_secs(args.keepalive_secs),
        }
    }

    /// The loaded model, or 503 while it is loading.
    pub fn ready(&self) -> Result<&Ready, ApiError> {
        self.ready.get().ok_or_else(|| {
            let what = self.loading.lock().map(|s| s.clone()).unwrap_or_default();
            ApiError::unavailable(format!("the model is not loaded yet ({what}); retry when /health answers 200")).code("model_loading")
        })
    }

    pub fn set_loading(&self, what: &str) {
        if let Ok(mut s) = self.loading.lock() {
            *s = what.to_string();
        }
    }
}

pub fn router(app: Arc<App>, max_body: usize, cors: bool) -> Router {
    let mut r = Router::new()
        .route("/v1/models", get(models::list))
        .route("/v1/models/{id}", get(models::get_one))
        .route("/v1/chat/completions", post(openai_chat::handle))
        .route("/v1/completions", post(openai_completions::handle))
        .route("/v1/responses", post(openai_responses::handle))
        .route("/v1/messages", post(anthropic_messages::handle))
        .route("/v1/messages/count_tokens", post(anthropic_messages::count_tokens))
        .route("/health", get(models::health))
        .route("/metrics", get(models::metrics))
        .fallback(fallback)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(app);
    if cors {
        use tower_http::cors::{Any, CorsLayer};
        r = r.layer(CorsLayer::new().allow_origin(Any).allow_methods([Method::GET, Method::POST, Method::OPTIONS]).allow_headers(Any));
    }
    r
}

async fn fallback(req: Request) -> Response {
    let path = req.uri().path().to_string();
    ApiError::not_found(format!("unknown endpoint {} {path}", req.method())).flavor(Flavor::of_path(&path)).into_response()
}

async fn method_not_allowed(req: Request) -> Response {
    let path = req.uri().path().to_string();
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, format!("method {} is not allowed on {path}", req.method()))
        .flavor(Flavor::of_path(&path))
        .into_response()
}

fn key_matches(headers: &HeaderMap, key: &str) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    let x = headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim);
    // Constant-time comparison of equal-length keys.
    let eq = |a: &str| a.len() == key.len() && a.bytes().zip(key.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0;
    bearer.is_some_and(eq) || x.is_some_and(eq)
}

/// API-key check (every endpoint but /health and CORS preflights) and per-endpoint request counts.
async fn guard(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let endpoint = match path.as_str() {
        p if p.starts_with("/v1/models") => "/v1/models",
        "/v1/chat/completions" | "/v1/completions" | "/v1/responses" | "/v1/messages" | "/health" | "/metrics" => path.as_str(),
        _ => "other",
    }
    .to_string();
    let resp = if req.method() == Method::OPTIONS {
        // As ds4: OPTIONS answers 204 with or without --cors (a CORS preflight is answered by the
        // CORS layer before this when --cors is on).
        (StatusCode::NO_CONTENT, [(header::ALLOW, "GET, POST, OPTIONS")]).into_response()
    } else if let Some(key) = &app.api_key {
        if path != "/health" && !key_matches(req.headers(), key) {
            ApiError::new(StatusCode::UNAUTHORIZED, "missing or invalid API key (send `Authorization: Bearer KEY` or `x-api-key: KEY`)")
                .code("invalid_api_key")
                .flavor(Flavor::of_path(&path))
                .into_response()
        } else {
            run_when_ready(&app, &path, req, next).await
        }
    } else {
        run_when_ready(&app, &path, req, next).await
    };
    app.metrics.request(&endpoint, resp.status().as_u16());
    resp
}

/// The API endpoints answer 503 until the model is loaded; /health and /metrics always answer.
async fn run_when_ready(app: &App, path: &str, req: Request, next: Next) -> Response {
    if path.starts_with("/v1/") {
        if let Err(e) = app.ready() {
            return e.flavor(Flavor::of_path(path)).into_response();
        }
    }
    next.run(req).await
}
