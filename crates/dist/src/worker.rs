//! A worker: loads its layer range, dials the coordinator, proves the shared secret, registers, and
//! serves forward requests with its local stage on the thread that computes (socket reads and
//! replies included). When the coordinator goes away (closed, silent for the timeout, or a
//! malformed frame) it drops every session and reconnects with backoff.
use crate::auth;
use crate::error::{DistError, Result};
use crate::exec::{ActRef, LocalStage, StageRequest};
use crate::identity;
use crate::protocol::{self, fnv1a_tokens, Busy, Conn, ForwardRes, Msg, Payload, Registration, HANDSHAKE_MAX_FRAME};
use crate::wire::{self, FrameReader, ForwardView, Incoming, ReadStep};
use ds4_gguf::GgufFile;
use ds4_engine::{Engine, LoadOptions};
use ds4_model::{Config, LayerRange};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone)]
pub struct WorkerOptions {
    /// How the stage is loaded (context, threads, backend, prefill chunk, memory budget); the layers
    /// come from the worker's `--layers`.
    pub load: LoadOptions,
    pub token: Option<String>,
    /// The coordinator is gone after this long without a frame; also the connect timeout.
    pub timeout: Duration,
    /// Reconnect after the coordinator goes away (false: return).
    pub reconnect: bool,
    /// Set to end the worker (tests): the connection is dropped at once.
    pub stop: Arc<AtomicBool>,
    pub debug: bool,
    /// Test only (env `DS4_DIST_TEST_HANG=N` for the worker binaries): the compute thread blocks
    /// after the first layer of the N-th forward request this worker serves (counted from 1 over
    /// all its connections) until `stop` is set, while the heartbeat thread goes on: a hung
    /// computation (deadlock, GPU hang) on a live connection, which the coordinator must detect.
    pub test_hang_at: Option<u64>,
    /// Test only: every completed layer takes this much longer (a slow machine whose requests
    /// outlast the timeout while layers keep completing: it must not be taken for a hung one).
    pub test_layer_delay: Option<Duration>,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            load: LoadOptions::default(),
            token: None,
            timeout: Duration::from_secs(10),
            reconnect: true,
            stop: Arc::new(AtomicBool::new(false)),
            debug: false,
            test_hang_at: None,
            test_layer_delay: None,
        }
    }
}

/// The worker's stage and what it registers with.
pub fn load_stage(model: &Path, layers: &str, load: &LoadOptions) -> Result<(LocalStage, Registration)> {
    let file = Arc::new(GgufFile::open(model).map_err(|e| DistError::Model(format!("{}: {e}", model.display())))?);
    let cfg = Config::from_gguf(&file)?;
    let range = LayerRange::parse(layers, cfg.n_layer).map_err(|e| DistError::Usage(e.to_string()))?;
    let table_id = identity::table_id(&file, range)
        .ok_or_else(|| DistError::Model(format!("{} lacks tensors of layers {}", model.display(), range.label())))?;
    let weights_id = identity::weights_id(&file, range)
        .ok_or_else(|| DistError::Model(format!("{} lacks tensors of layers {}", model.display(), range.label())))?;
    let reg = Registration {
        model_id: identity::model_id(&file),
        table_id,
        weights_id,
        model_name: file.get("general.name").and_then(|v| v.as_str()).unwrap_or("").to_string(),
        n_layer: cfg.n_layer as u32,
        first: range.first as u32,
        last: range.last as u32,
        head: range.head,
        ctx: load.ctx as u64,
        activation_bits: vec![32, 16, 8],
    };
    let engine = Engine::load(model, &LoadOptions { layers: Some(range), ..load.clone() })?;
    Ok((LocalStage::from_engine(engine), reg))
}

/// Runs the worker until `stop` is set, or the coordinator refuses it.
pub fn run_worker(model: &Path, layers: &str, coordinator: &str, opts: &WorkerOptions) -> Result<()> {
    let (stage, reg) = load_stage(model, layers, &opts.load)?;
    serve(stage, reg, coordinator, opts)
}

/// Serves an already loaded stage (tests load once and restart the network side). The calling
/// thread computes and does the session's socket I/O itself (a request wakes it straight from the
/// socket read and it writes the reply: no thread hand-off on the decode path); a helper thread
/// sends heartbeats so a long computation does not look like a hung worker.
pub fn serve(mut stage: LocalStage, reg: Registration, coordinator: &str, opts: &WorkerOptions) -> Result<()> {
    let progress = Arc::new(Progress::new(opts));
    let p = progress.clone();
    stage.engine.stage.on_progress = Some(Arc::new(move |_layer| p.step()));
    // The async runtime only dials and runs the handshake.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| DistError::Io(format!("cannot start the network runtime: {e}")))?;
    let range = format!("{}:{}", reg.first, if reg.head { "output".to_string() } else { reg.last.to_string() });
    eprintln!("ds4: distributed worker: layers {range} model_id={} connecting to coordinator {coordinator}", identity::short(&reg.model_id));
    let mut backoff = Duration::from_millis(100);
    let mut last_err: Option<String> = None;
    loop {
        if opts.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let t0 = Instant::now();
        match rt.block_on(connect(&reg, coordinator, opts)) {
            Ok(conn) => {
                last_err = None;
                eprintln!("ds4: distributed worker: registered with coordinator {coordinator} layers {range}");
                match session(&mut stage, conn, &progress, opts) {
                    Ok(why) => eprintln!("ds4: distributed worker: coordinator session ended: {why}"),
                    Err(e) => eprintln!("ds4: distributed worker: {e}"),
                }
            }
            Err(e @ (DistError::Rejected(_) | DistError::Auth(_))) => return Err(e),
            Err(e) => {
                // Each new kind of failure once (a coordinator not up yet is retried quietly).
                let m = e.to_string();
                if opts.debug || last_err.as_deref() != Some(&m) {
                    eprintln!("ds4: distributed worker: {m}; retrying");
                }
                last_err = Some(m);
            }
        }
        // Sessions belong to the coordinator connection that built them.
        stage.drop_sessions(None);
        if !opts.reconnect || opts.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(2) {
            backoff = Duration::from_millis(100);
        }
        let until = Instant::now() + backoff;
        while Instant::now() < until && !opts.stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// Dials the coordinator and registers; the connection comes back with the data-frame limit set.
async fn connect(reg: &Registration, coordinator: &str, opts: &WorkerOptions) -> Result<Conn> {
    let sock = tokio::time::timeout(opts.timeout, tokio::net::TcpStream::connect(coordinator))
        .await
        .map_err(|_| DistError::Io(format!("connect to {coordinator} timed out")))?
        .map_err(|e| DistError::Io(format!("connect to {coordinator}: {e}")))?;
    let mut conn = protocol::framed(sock, HANDSHAKE_MAX_FRAME);
    let max_frame = tokio::time::timeout(opts.timeout, handshake(&mut conn, reg, opts))
        .await
        .map_err(|_| DistError::Io(format!("{coordinator} did not answer the handshake within {:.1}s (is it a ds4 coordinator's --listen port?)", opts.timeout.as_secs_f64())))?
        .map_err(|e| match e {
            // Something answered, but not a coordinator of this build (an HTTP server, garbage, another version).
            DistError::Protocol(m) => DistError::Protocol(format!("{coordinator} is not a ds4 coordinator speaking protocol version {}: {m}", protocol::PROTOCOL_VERSION)),
            e => e,
        })?;
    conn.codec_mut().set_max_frame_length(max_frame);
    Ok(conn)
}

/// The compute thread's progress, which the heartbeat thread reports ([`Busy`]): the coordinator
/// tells a long computation (layers keep completing) from a hung one (none does for the timeout).
/// Updated with relaxed atomics once per request and once per layer.
struct Progress {
    epoch: Instant,
    busy: AtomicBool,
    request: AtomicU64,
    layers_done: AtomicU32,
    /// Microseconds after `epoch` of the last progress.
    last_us: AtomicU64,
    /// Forward requests begun (for the test hang hook).
    begun: AtomicU64,
    test_hang_at: Option<u64>,
    test_layer_delay: Option<Duration>,
    hung: AtomicBool,
    stop: Arc<AtomicBool>,
}

impl Progress {
    fn new(opts: &WorkerOptions) -> Self {
        Self {
            epoch: Instant::now(),
            busy: AtomicBool::new(false),
            request: AtomicU64::new(0),
            layers_done: AtomicU32::new(0),
            last_us: AtomicU64::new(0),
            begun: AtomicU64::new(0),
            test_hang_at: opts.test_hang_at,
            test_layer_delay: opts.test_layer_delay,
            hung: AtomicBool::new(false),
            stop: opts.stop.clone(),
        }
    }

    fn now_us(&self) -> u64 { self.epoch.elapsed().as_micros() as u64 }

    /// A forward request was read: the compute thread is busy with it from now on.
    fn begin(&self, request: u64) {
        self.begun.fetch_add(1, Ordering::Relaxed);
        self.request.store(request, Ordering::Relaxed);
        self.layers_done.store(0, Ordering::Relaxed);
        self.last_us.store(self.now_us(), Ordering::Relaxed);
        self.busy.store(true, Ordering::Release);
    }

    /// A layer (or the output head) completed, on the computing thread.
    fn step(&self) {
        if let Some(d) = self.test_layer_delay {
            std::thread::sleep(d);
        }
        self.layers_done.fetch_add(1, Ordering::Relaxed);
        self.last_us.store(self.now_us(), Ordering::Relaxed);
        if self.test_hang_at.is_some_and(|n| self.begun.load(Ordering::Relaxed) == n) && !self.hung.swap(true, Ordering::Relaxed) {
            eprintln!(
                "ds4: distributed worker: DS4_DIST_TEST_HANG (test only): compute thread blocked in request {} until the worker stops; heartbeats go on",
                self.request.load(Ordering::Relaxed)
            );
            while !self.stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// The reply is ready (called before it is sent).
    fn end(&self) { self.busy.store(false, Ordering::Release); }

    fn snapshot(&self) -> Option<Busy> {
        if !self.busy.load(Ordering::Acquire) {
            return None;
        }
        let last = self.last_us.load(Ordering::Relaxed);
        Some(Busy {
            request: self.request.load(Ordering::Relaxed),
            layers_done: self.layers_done.load(Ordering::Relaxed),
            stalled_ms: self.now_us().saturating_sub(last) / 1000,
        })
    }
}

/// The writing half of a session: frames go out whole under the lock (replies from the computing
/// thread, heartbeats from the helper), written gathered from where their bytes lie
/// ([`wire::Gathered`]: a reply's activations are not copied into a frame first).
struct Writer {
    inner: Mutex<std::net::TcpStream>,
    max_frame: usize,
}

impl Writer {
    fn send(&self, m: &Msg) -> Result<()> {
        let frame = wire::msg_frame(m, self.max_frame)?;
        let mut g = self.inner.lock().map_err(|_| DistError::Io("writer lock poisoned".into()))?;
        frame.write_to(&mut *g).map_err(|e| DistError::Io(format!("send {}: {e}", m.name())))
    }

    /// A heartbeat with the progress read under the lock: it is never older than a reply already
    /// on the wire (the compute thread marks itself idle before it sends its reply), so the
    /// coordinator never sees a stale "busy" after the result.
    fn heartbeat(&self, seq: u64, progress: &Progress) -> Result<Option<Busy>> {
        let mut g = self.inner.lock().map_err(|_| DistError::Io("writer lock poisoned".into()))?;
        let busy = progress.snapshot();
        let m = Msg::Heartbeat { seq, busy };
        let frame = wire::msg_frame(&m, self.max_frame)?;
        frame.write_to(&mut *g).map_err(|e| DistError::Io(format!("send Heartbeat: {e}")))?;
        Ok(busy)
    }
}

/// How often the session loop looks at `stop` and at the coordinator's silence.
const TICK: Duration = Duration::from_millis(50);

/// One registered connection, served on this thread until it ends. Ok(reason) when it ended
/// without a fatal error (closed, silent for the timeout, malformed frame, stop).
fn session(stage: &mut LocalStage, conn: Conn, progress: &Arc<Progress>, opts: &WorkerOptions) -> Result<String> {
    let parts = conn.into_parts();
    let max_frame = parts.codec.max_frame_length();
    // Bytes the handshake's codec read past the Accept frame are the first of the data frames.
    let mut reader = FrameReader::new(max_frame, &parts.read_buf);
    // A full prefill chunk's hidden rows (the frame of the first long prompt), mapped now.
    reader.reserve(stage.chunk_hidden_bytes() + (1 << 16));
    let sock = parts.io.into_std().map_err(|e| DistError::Io(e.to_string()))?;
    sock.set_nonblocking(false)?;
    sock.set_read_timeout(Some(TICK))?;
    let wsock = sock.try_clone()?;
    wsock.set_write_timeout(Some(opts.timeout))?;
    let writer = Arc::new(Writer { inner: Mutex::new(wsock), max_frame });
    let alive = Arc::new(AtomicBool::new(true));
    let hb = {
        let (w, alive, progress) = (writer.clone(), alive.clone(), progress.clone());
        let every = (opts.timeout / 4).max(Duration::from_millis(20));
        let timeout_ms = opts.timeout.as_millis() as u64;
        std::thread::Builder::new()
            .name("ds4-dist-heartbeat".into())
            .spawn(move || {
                let mut seq = 0u64;
                let mut next = Instant::now() + every;
                let mut warned = None;
                while alive.load(Ordering::SeqCst) {
                    std::thread::sleep(TICK.min(every));
                    if Instant::now() >= next {
                        seq += 1;
                        next += every;
                        match w.heartbeat(seq, &progress) {
                            Err(_) => break,
                            // Said here too: the coordinator drops this worker for it.
                            Ok(Some(b)) if b.stalled_ms >= timeout_ms && warned != Some(b.request) => {
                                warned = Some(b.request);
                                eprintln!(
                                    "ds4: distributed worker: compute thread made no progress on request {} for {:.1}s ({} layers done): hung",
                                    b.request,
                                    b.stalled_ms as f64 / 1e3,
                                    b.layers_done
                                );
                            }
                            Ok(_) => {}
                        }
                    }
                }
            })
            .map_err(|e| DistError::Io(format!("cannot start the heartbeat thread: {e}")))?
    };
    let r = serve_frames(stage, &sock, &mut reader, &writer, progress, opts);
    alive.store(false, Ordering::SeqCst);
    let _ = sock.shutdown(std::net::Shutdown::Both);
    let _ = hb.join();
    r
}

fn serve_frames(stage: &mut LocalStage, mut sock: &std::net::TcpStream, reader: &mut FrameReader, out: &Writer, progress: &Progress, opts: &WorkerOptions) -> Result<String> {
    let mut last = Instant::now();
    loop {
        if opts.stop.load(Ordering::SeqCst) {
            return Ok("stopped".into());
        }
        // While requests are coming (the last within a second), busy-poll for the next one first.
        let spun = if crate::spin::budget().is_zero() || last.elapsed() > Duration::from_secs(1) {
            None
        } else {
            sock.set_nonblocking(true)?;
            let r = crate::spin::poll(|| match reader.read(&mut sock) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
                r => Some(r),
            });
            sock.set_nonblocking(false)?;
            r
        };
        match spun.unwrap_or_else(|| reader.read(&mut sock)) {
            Ok(ReadStep::Closed) => return Ok("connection closed by the coordinator".into()),
            Ok(ReadStep::Partial) => last = Instant::now(),
            Ok(ReadStep::Frame) => {
                last = Instant::now();
                match wire::decode_data(reader.frame()) {
                    Err(e) => return Ok(e.to_string()),
                    Ok(Incoming::Forward(req)) => {
                        progress.begin(req.request);
                        let reply = forward(stage, req, opts.debug);
                        progress.end();
                        // A dead connection just drops the reply; the coordinator replays.
                        let sent = out.send(&reply);
                        if let Msg::Result(ForwardRes { payload: Payload::Hidden { data, .. }, .. }) = reply {
                            wire::give_back(data);
                        }
                        if let Err(e) = sent {
                            return Ok(e.to_string());
                        }
                    }
                    Ok(Incoming::Other(Msg::Reset { session })) => stage.drop_sessions(session),
                    // Liveness both ways: the helper thread sends ours.
                    Ok(Incoming::Other(Msg::Heartbeat { .. })) => {}
                    Ok(Incoming::Other(m)) => return Ok(format!("unexpected {} from the coordinator", m.name())),
                    Ok(Incoming::Result(_)) => return Ok("unexpected Result from the coordinator".into()),
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => {
                if last.elapsed() > opts.timeout {
                    return Ok(format!("no frame from the coordinator for {:.1}s", opts.timeout.as_secs_f64()));
                }
            }
            Err(e) => return Ok(format!("receive: {e}")),
        }
    }
}

/// Runs one forward request on the stage; the reply (result or error) to send back.
fn forward(stage: &mut LocalStage, req: ForwardView, debug: bool) -> Msg {
    let input = (!req.activations.is_empty()).then_some(ActRef { bits: req.bits, data: req.activations });
    let sreq = StageRequest {
        session: req.session,
        pos: req.pos as usize,
        prefix_hash: req.prefix_hash,
        tokens: &req.tokens,
        input,
        want: req.want,
        bits: req.bits,
    };
    match stage.run(&sreq) {
        Ok((payload, eval)) => {
            if debug {
                eprintln!(
                    "ds4: distributed worker: request={} layers={} pos={} tokens={} eval={:.3}ms",
                    req.request,
                    stage.engine.range().label(),
                    req.pos,
                    req.tokens.len(),
                    eval.as_secs_f64() * 1e3
                );
            }
            Msg::Result(ForwardRes { request: req.request, eval_us: eval.as_micros() as u64, hash_after: fnv1a_tokens(req.prefix_hash, &req.tokens), payload })
        }
        Err((kind, message)) => Msg::Error { request: req.request, kind, message },
    }
}

async fn handshake(conn: &mut Conn, reg: &Registration, opts: &WorkerOptions) -> Result<usize> {
    let wn = auth::nonce()?;
    protocol::send(conn, &Msg::Hello { nonce: wn }).await?;
    let (cn, _required) = match protocol::recv(conn).await? {
        Msg::Challenge { nonce, auth_required } => (nonce, auth_required),
        Msg::Reject { reason } => return Err(DistError::Rejected(reason)),
        m => return Err(DistError::Protocol(format!("expected Challenge, got {}", m.name()))),
    };
    let mac = opts.token.as_ref().map(|s| auth::worker_proof(s, &cn, &wn));
    protocol::send(conn, &Msg::Auth { mac }).await?;
    protocol::send(conn, &Msg::Register(reg.clone())).await?;
    match protocol::recv(conn).await? {
        Msg::Accept { mac, max_frame } => {
            if let Some(secret) = &opts.token {
                match mac {
                    Some(m) if auth::verify_coordinator(secret, &wn, &cn, &m) => {}
                    _ => return Err(DistError::Auth("the coordinator did not prove the shared --dist-token".into())),
                }
            }
            Ok((max_frame as usize).clamp(HANDSHAKE_MAX_FRAME, protocol::ABSOLUTE_MAX_FRAME))
        }
        Msg::Reject { reason } => Err(DistError::Rejected(reason)),
        m => Err(DistError::Protocol(format!("expected Accept, got {}", m.name()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn reg() -> Registration {
        Registration { model_id: [0; 32], table_id: [0; 32], weights_id: [0; 32], model_name: String::new(), n_layer: 6, first: 3, last: 5, head: true, ctx: 512, activation_bits: vec![32] }
    }

    /// A peer that is not a coordinator (what it answers to the worker's Hello) fails the connect with
    /// an error that says so, within the timeout (it used to be `i/o: receive: frame size too big` or
    /// `handshake timed out`).
    #[test]
    fn a_peer_that_is_not_a_coordinator_is_named_as_such() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let answers: [(&[u8], &str); 3] = [
            (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", "is not a ds4 coordinator"),
            (&[0, 0, 0, 4, 9, 9, 9, 9], "is not a ds4 coordinator"),
            (b"", "did not answer the handshake"),
        ];
        for (answer, want) in answers {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap().to_string();
            let answer = answer.to_vec();
            let peer = std::thread::spawn(move || {
                let (mut s, _) = l.accept().unwrap();
                let mut b = [0u8; 256];
                let _ = s.read(&mut b);
                let _ = s.write_all(&answer);
                // Silent afterwards, the connection left open: only the timeout ends a wait.
                std::thread::sleep(Duration::from_millis(1500));
            });
            let opts = WorkerOptions { timeout: Duration::from_millis(500), ..WorkerOptions::default() };
            let t0 = Instant::now();
            let Err(e) = rt.block_on(connect(&reg(), &addr, &opts)) else { panic!("{addr} taken for a coordinator") };
            assert!(t0.elapsed() < Duration::from_secs(2), "bounded by the timeout");
            let m = e.to_string();
            assert!(m.contains(&addr) && m.contains(want), "{m}");
            peer.join().unwrap();
        }
    }
}
