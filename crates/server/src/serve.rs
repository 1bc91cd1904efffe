//! The HTTP/1 accept loop in front of the router: a cap on open connections (`conn_limit`), an idle
//! timeout that is also the header read timeout (a connection with no request in flight is closed after
//! `--header-timeout-secs`), the request body read here with its limits (a declared `Content-Length`
//! over `--max-body-bytes` is answered 413 before a byte of it is read; a body not received within
//! `--body-timeout-secs` is answered 408), a send timeout (a connection whose client has not read for
//! `--send-timeout-secs` while a write waits on it is closed, which also cancels its generation), and a
//! graceful stop.
use crate::conn_limit::{Busy, Conn, Registry};
use crate::errors::{ApiError, Flavor};
use axum::body::Body;
use axum::http::{header, HeaderValue, Request, Response, StatusCode};
use axum::Router;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower::ServiceExt;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    /// Longest a write may wait for a client that does not read.
    pub send_timeout: Duration,
    pub max_body: usize,
}

/// Serves `router` on `listener` until `stop` turns true; then stops accepting, lets requests in
/// flight finish, and returns once every connection is closed or `grace` has passed.
pub async fn run(listener: TcpListener, router: Router, limits: Limits, metrics: &crate::metrics::Metrics, mut stop: watch::Receiver<bool>, grace: Duration) {
    let registry = Arc::new(Registry::new(limits.max_connections));
    let _ = metrics.connections.set(registry.clone());
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    if !matches!(e.kind(), std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    continue;
                }
            },
            _ = stop.wait_for(|v| *v) => break,
        };
        let _ = stream.set_nodelay(true);
        match registry.admit() {
            Some(conn) => {
                tokio::spawn(connection(stream, conn, registry.clone(), router.clone(), limits, stop.clone()));
            }
            None => {
                tokio::spawn(refuse(stream));
            }
        }
    }
    drop(listener);
    let t0 = tokio::time::Instant::now();
    while registry.open() > 0 && t0.elapsed() < grace {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every open connection has a request in flight: a short 503, then close.
async fn refuse(mut stream: TcpStream) {
    let body = ApiError::unavailable("too many open connections (--max-connections); retry later").code("too_many_connections").body().to_string();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\nretry-after: 1\r\n\r\n",
        body.len()
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), write).await;
}

async fn connection(stream: TcpStream, conn: Arc<Conn>, registry: Arc<Registry>, router: Router, limits: Limits, mut stop: watch::Receiver<bool>) {
    let c = conn.clone();
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let busy = c.busy();
        let router = router.clone();
        Box::pin(async move { Ok::<_, Infallible>(handle(req, router, limits, busy).await) })
    });
    let io = Watched { inner: stream, conn: conn.clone() };
    let mut http = hyper::server::conn::http1::Builder::new().keep_alive(true).serve_connection(TokioIo::new(io), svc);
    let mut stopping = false;
    let mut finished = false;
    loop {
        tokio::select! {
            r = std::future::poll_fn(|cx| http.poll_without_shutdown(cx)) => {
                finished = r.is_ok();
                break;
            }
            _ = conn.evicted.notified() => break,
            _ = idle_expired(&conn, limits.header_timeout) => break,
            // A client that stopped reading: the response (and the generation behind it) is dropped.
            _ = write_stalled(&conn, limits.send_timeout) => break,
            _ = stop.wait_for(|v| *v), if !stopping => {
                stopping = true;
                Pin::new(&mut http).graceful_shutdown();
            }
        }
    }
    registry.remove(&conn);
    if finished {
        linger(http.into_parts().io.into_inner().inner).await;
    }
}

/// Closes a connection whose request body may be partly unread (a 413 answered before the body): stop
/// writing, then read and discard what the client is still sending for a short while, so that closing
/// does not reset the connection before the client has read the answer.
async fn linger(mut stream: TcpStream) {
    use tokio::io::AsyncReadExt;
    if stream.shutdown().await.is_err() {
        return;
    }
    let drain = async {
        let mut buf = vec![0u8; 64 << 10];
        let mut total = 0usize;
        while total < LINGER_MAX_BYTES {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_MAX_TIME, drain).await;
}

const LINGER_MAX_TIME: Duration = Duration::from_secs(2);
const LINGER_MAX_BYTES: usize = 256 << 20;

/// Resolves once a write to the connection has waited `timeout` for the client to read.
async fn write_stalled(conn: &Conn, timeout: Duration) {
    deadline_passed(timeout, || conn.write_deadline(timeout)).await
}

/// Resolves once `deadline()` (re-read after each wait: it moves, or is None while it does not apply)
/// lies in the past; checks at least every `timeout`.
async fn deadline_passed(timeout: Duration, deadline: impl Fn() -> Option<std::time::Instant>) {
    loop {
        let now = std::time::Instant::now();
        let wait = match deadline() {
            Some(d) if d <= now => return,
            Some(d) => d - now,
            None => timeout,
        };
        tokio::time::sleep(wait).await;
    }
}

/// The connection's socket; notes on its `Conn` whether writes are waiting for the client to read.
struct Watched {
    inner: TcpStream,
    conn: Arc<Conn>,
}

impl Watched {
    fn note<T>(&self, r: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        self.conn.note_write(r.is_pending());
        r
    }
}

impl tokio::io::AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut tokio::io::ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note(r)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note(r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // Only a write that went through shows the client reads again (a socket's flush is a no-op).
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        if r.is_pending() {
            self.conn.note_write(true);
        }
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Resolves once the connection has had no request in flight for `timeout`.
async fn idle_expired(conn: &Conn, timeout: Duration) {
    deadline_passed(timeout, || conn.idle_deadline(timeout)).await
}

fn error(e: ApiError, path: &str) -> Response<Body> {
    use axum::response::IntoResponse;
    let mut r = e.flavor(Flavor::of_path(path)).into_response();
    // The unread rest of the body makes the connection unusable.
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

fn too_large(max: usize) -> ApiError {
    ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("request body is larger than the server's limit of {max} bytes (--max-body-bytes)")).code("request_too_large")
}

/// The body limits, then the router; the response body holds `busy` until it is fully sent.
async fn handle(req: Request<Incoming>, router: Router, limits: Limits, busy: Busy) -> Response<Body> {
    let path = req.uri().path().to_string();
    let (parts, body) = req.into_parts();
    if let Some(v) = parts.headers.get(header::CONTENT_LENGTH) {
        match v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()) {
            Some(n) if n > limits.max_body as u64 => return guarded(error(too_large(limits.max_body), &path), busy),
            Some(_) => {}
            None => return guarded(error(ApiError::bad_request("invalid Content-Length header"), &path), busy),
        }
    }
    let read = Limited::new(body, limits.max_body).collect();
    let bytes = match tokio::time::timeout(limits.body_timeout, read).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return guarded(error(too_large(limits.max_body), &path), busy),
        Ok(Err(e)) => return guarded(error(ApiError::bad_request(format!("cannot read the request body: {e}")), &path), busy),
        Err(_) => {
            let msg = format!("the request body was not received within {} s (--body-timeout-secs)", limits.body_timeout.as_secs());
            return guarded(error(ApiError::new(StatusCode::REQUEST_TIMEOUT, msg).code("request_timeout"), &path), busy);
        }
    };
    let req = Request::from_parts(parts, Body::from(bytes));
    let resp = match router.oneshot(req).await {
        Ok(r) => r,
        Err(e) => match e {},
    };
    guarded(resp, busy)
}

fn guarded(resp: Response<Body>, busy: Busy) -> Response<Body> {
    resp.map(|b| Body::new(Guarded { inner: b, _busy: busy }))
}

/// A response body that keeps its connection marked busy until it is sent or dropped.
struct Guarded {
    inner: Body,
    _busy: Busy,
}

impl http_body::Body for Guarded {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Raises the soft open-file limit to the hard one (many connections each hold a descriptor).
#[cfg(unix)]
#[allow(clippy::unnecessary_cast)] // rlim_t is narrower than u64 on some targets
pub fn raise_nofile_limit() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit struct through a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur < lim.rlim_max {
        let want = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        // SAFETY: setrlimit reads one rlimit struct through a valid pointer.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            return Some(want.rlim_cur as u64);
        }
    }
    Some(lim.rlim_cur as u64)
}

#[cfg(not(unix))]
pub fn raise_nofile_limit() -> Option<u64> {
    None
}

#[cfg(all(test, unix))]
mod tests {
    #[test]
    #[allow(clippy::unnecessary_cast)] // rlim_t is narrower than u64 on some targets
    fn nofile_soft_limit_reaches_the_hard_limit() {
        let n = super::raise_nofile_limit().expect("getrlimit");
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes one rlimit struct through a valid pointer.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(lim.rlim_cur, lim.rlim_max);
        assert_eq!(n, lim.rlim_cur as u64);
    }
}
