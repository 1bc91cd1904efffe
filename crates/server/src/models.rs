//! `GET /v1/models`, `GET /v1/models/{id}`, `GET /health`, `GET /metrics`.
use crate::app::App;
use crate::errors::ApiError;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Model ids served; all are aliases of the loaded model.
pub const MODEL_IDS: [&str; 2] = ["deepseek-v4-flash", "deepseek-v4-pro"];

fn model_object(app: &App, id: &str) -> Value {
    json!({
        "id": id,
        "object": "model",
        "created": 0,
        "owned_by": "dwarfstar",
        "context_length": app.ctx,
        "top_provider": { "context_length": app.ctx, "max_completion_tokens": app.default_max_tokens.min(app.ctx) },
        "supported_parameters": ["tools", "tool_choice", "max_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "seed", "stream", "reasoning_effort"],
    })
}

pub async fn list(State(app): State<Arc<App>>) -> Response {
    let data: Vec<Value> = MODEL_IDS.iter().map(|id| model_object(&app, id)).collect();
    Json(json!({ "object": "list", "data": data })).into_response()
}

pub async fn get_one(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    if MODEL_IDS.contains(&id.as_str()) {
        Json(model_object(&app, &id)).into_response()
    } else {
        ApiError::not_found(format!("model `{id}` does not exist (served: {})", MODEL_IDS.join(", "))).code("model_not_found").into_response()
    }
}

pub async fn health(State(app): State<Arc<App>>) -> Response {
    let m = &app.metrics;
    let mut h = json!({
        "status": "ok",
        "model": app.model_id,
        "ctx": app.ctx,
        "queue_depth": m.queue_depth.load(Relaxed),
        "busy": m.busy.load(Relaxed) == 1,
    });
    if let Some(c) = &app.coordinator {
        let workers: Vec<Value> = c.workers().iter().map(|(addr, r)| json!({ "address": addr.to_string(), "layers": r.label() })).collect();
        h["route"] = json!({ "local_layers": c.config().local.label(), "status": crate::route_kv::RouteKv::status(c), "workers": workers });
    }
    Json(h).into_response()
}

pub async fn metrics(State(app): State<Arc<App>>) -> Response {
    let mut body = app.metrics.render();
    // A coordinator adds the distributed route's per-hop totals (prefill chunks and decode steps).
    if app.coordinator.is_some() {
        body.push_str(&ds4_dist::telemetry::prometheus());
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}
