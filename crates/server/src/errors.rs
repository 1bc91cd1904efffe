//! API errors in each API's own shape: OpenAI `{"error":{message,type,param,code}}` and Anthropic
//! `{"type":"error","error":{type,message}}`. Every failure a client can see goes through here.
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

/// Which API's error shape to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    OpenAi,
    Anthropic,
}

impl Flavor {
    /// The flavor for a request path (Anthropic for `/v1/messages`, OpenAI otherwise).
    pub fn of_path(path: &str) -> Flavor {
        if path.starts_with("/v1/messages") {
            Flavor::Anthropic
        } else {
            Flavor::OpenAi
        }
    }
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Extra members of the OpenAI error object (e.g. `n_prompt_tokens`).
    pub extra: Map<String, Value>,
    pub flavor: Flavor,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), param: None, code: None, extra: Map::new(), flavor: Flavor::OpenAi }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }
    /// 429: the client should retry later (ds4's `--max-queue` answer; the SDKs back off on it).
    pub fn too_many(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
    pub fn param(mut self, p: &str) -> Self {
        self.param = Some(p.to_string());
        self
    }
    pub fn code(mut self, c: &'static str) -> Self {
        self.code = Some(c);
        self
    }
    pub fn extra(mut self, k: &str, v: Value) -> Self {
        self.extra.insert(k.to_string(), v);
        self
    }
    pub fn flavor(mut self, f: Flavor) -> Self {
        self.flavor = f;
        self
    }

    fn openai_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "invalid_request_error",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            s if s >= 500 => "server_error",
            _ => "invalid_request_error",
        }
    }

    fn anthropic_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            s if s >= 500 => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// The error body in this error's flavor.
    pub fn body(&self) -> Value {
        match self.flavor {
            Flavor::OpenAi => {
                let mut e = Map::new();
                e.insert("message".into(), json!(self.message));
                e.insert("type".into(), json!(self.openai_type()));
                e.insert("param".into(), json!(self.param));
                e.insert("code".into(), json!(self.code));
                for (k, v) in &self.extra {
                    e.insert(k.clone(), v.clone());
                }
                json!({ "error": Value::Object(e) })
            }
            Flavor::Anthropic => json!({
                "type": "error",
                "error": { "type": self.anthropic_type(), "message": self.message },
            }),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.body()).unwrap_or_else(|_| b"{}".to_vec());
        (self.status, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
    }
}

impl From<axum::extract::rejection::BytesRejection> for ApiError {
    fn from(r: axum::extract::rejection::BytesRejection) -> Self {
        let status = r.status();
        let msg = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "request body is larger than the server's limit (--max-body-bytes)".to_string()
        } else {
            format!("cannot read the request body: {}", r.body_text())
        };
        ApiError::new(status, msg)
    }
}
