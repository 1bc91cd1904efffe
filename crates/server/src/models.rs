//! `GET /v1/models`, `GET /v1/models/{id}`, `GET /health`, `GET /metrics`.
use crate::app::App;
use crate::errors::ApiError;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Model ids accepted by `/v1/models/{id}`; both are aliases of the loaded model.
pub const MODEL_IDS: [&str; 2] = ["deepseek-v4-flash", "deepseek-v4-pro"];

/// The id of a loaded model: Pro by its shape (61 layers, 384 routed experts), Flash otherwise (43
/// layers, 256 experts, and every small test model).
pub fn model_id(cfg: &ds4_model::Config) -> &'static str {
    if cfg.n_layer >= 61 || cfg.n_expert >= 384 {
        MODEL_IDS[1]
    } else {
        MODEL_IDS[0]
    }
}

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

/// Lists the model actually loaded (the other id is accepted as an alias, not listed).
pub async fn list(State(app): State<Arc<App>>) -> Response {
    let id = match app.ready() {
        Ok(r) => r.model_id.clone(),
        Err(e) => return e.into_response(),
    };
    Json(json!({ "object": "list", "data": [model_object(&app, &id)] })).into_response()
}

pub async fn get_one(State(app): State<Arc<App>>, id: Result<Path<String>, PathRejection>) -> Response {
    // A percent-escape that is not UTF-8 (`/v1/models/%ff`): a JSON 400, not axum's plain-text one.
    let id = match id {
        Ok(Path(id)) => id,
        Err(e) => return ApiError::bad_request(format!("invalid model id in the path: {}", e.body_text())).param("model").into_response(),
    };
    if MODEL_IDS.contains(&id.as_str()) {
        Json(model_object(&app, &id)).into_response()
    } else {
        ApiError::not_found(format!("model `{id}` does not exist (served: {})", MODEL_IDS.join(", "))).code("model_not_found").into_response()
    }
}

/// 200 `{"status":"ok"}` when serving; 503 with `status` and `reason` while the model loads or while a
/// distributed route is incomplete.
pub async fn health(State(app): State<Arc<App>>) -> Response {
    let m = &app.metrics;
    let Some(ready) = app.ready.get() else {
        let reason = app.loading.lock().map(|s| s.clone()).unwrap_or_default();
        let h = json!({ "status": "loading", "reason": reason, "ctx": app.ctx });
        return (StatusCode::SERVICE_UNAVAILABLE, Json(h)).into_response();
    };
    let mut h = json!({
        "status": "ok",
        "model": ready.model_id,
        "ctx": app.ctx,
        "queue_depth": m.queue_depth.load(Relaxed),
        "busy": m.busy.load(Relaxed) == 1,
    });
    let mut code = StatusCode::OK;
    if let Some(c) = &ready.coordinator {
        let workers: Vec<Value> = c.workers().iter().map(|(addr, r)| json!({ "address": addr.to_string(), "layers": r.label() })).collect();
        let status = crate::route_kv::RouteKv::status(c);
        if status != "complete" {
            code = StatusCode::SERVICE_UNAVAILABLE;
            h["status"] = json!("route_incomplete");
            h["reason"] = json!(format!("distributed route incomplete: {status}"));
        }
        h["route"] = json!({ "local_layers": c.config().local.label(), "status": status, "workers": workers });
    }
    (code, Json(h)).into_response()
}

pub async fn metrics(State(app): State<Arc<App>>) -> Response {
    let mut body = app.metrics.render();
    // A coordinator adds the distributed route's per-hop totals (prefill chunks and decode steps).
    if app.ready.get().is_some_and(|r| r.coordinator.is_some()) {
        body.push_str(&ds4_dist::telemetry::prometheus());
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flash_and_pro_by_shape() {
        let id = |s: &str| model_id(&ds4_model::synth::shape(s).unwrap());
        assert_eq!(id("tiny"), "deepseek-v4-flash");
        assert_eq!(id("flash"), "deepseek-v4-flash");
        assert_eq!(id("flash:1"), "deepseek-v4-flash");
        assert_eq!(id("pro"), "deepseek-v4-pro");
        assert_eq!(id("pro:2"), "deepseek-v4-pro");
    }
}
