//! Server-sent events: a per-request task translates worker events into SSE frames and pushes them into
//! a bounded channel that is the response body. When the client disconnects, the body (and with it the
//! channel) is dropped, the task's next send fails, the task ends and drops the worker-event receiver
//! and the cancel guard, and the worker stops generating within one token. While nothing is sent (a long
//! prefill) `: prefill` comments keep the connection alive.
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

pub type Item = Result<Event, Infallible>;

pub struct SseOut {
    tx: mpsc::Sender<Item>,
}

impl SseOut {
    /// `data: <json>`; false once the client is gone.
    pub async fn data(&self, v: &Value) -> bool {
        self.tx.send(Ok(Event::default().data(v.to_string()))).await.is_ok()
    }

    /// `event: <name>` + `data: <json>` (Anthropic and Responses streams).
    pub async fn named(&self, name: &str, v: &Value) -> bool {
        self.tx.send(Ok(Event::default().event(name).data(v.to_string()))).await.is_ok()
    }

    /// `data: <text>` verbatim (e.g. `[DONE]`).
    pub async fn raw(&self, s: &str) -> bool {
        self.tx.send(Ok(Event::default().data(s))).await.is_ok()
    }
}

/// Identity of an OpenAI-style stream (chat completions, completions).
pub struct OpenAiMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
}

impl OpenAiMeta {
    /// The closing frames of an OpenAI stream: the chunk carrying `finish_reason`, the usage chunk when
    /// `stream_options.include_usage` asked for it, then `[DONE]`.
    pub async fn finish(&self, out: &SseOut, object: &str, last: &Value, usage: Value) {
        if !out.data(last).await {
            return;
        }
        if self.include_usage {
            let u = serde_json::json!({ "id": self.id, "object": object, "created": self.created, "model": self.model, "choices": [], "usage": usage });
            if !out.data(&u).await {
                return;
            }
        }
        out.raw("[DONE]").await;
    }
}

/// Starts `f` on its own task and returns the streaming response it feeds.
pub fn spawn<F, Fut>(keepalive: Duration, f: F) -> Response
where
    F: FnOnce(SseOut) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Item>(64);
    tokio::spawn(f(SseOut { tx }));
    Sse::new(ReceiverStream::new(rx)).keep_alive(KeepAlive::new().interval(keepalive).text("prefill")).into_response()
}
