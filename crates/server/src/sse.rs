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
