//! A worker: loads its layer range, dials the coordinator, proves the shared secret, registers, and
//! serves forward requests with its local stage. When the coordinator goes away (closed, silent for
//! the timeout, or a malformed frame) it drops every session and reconnects with backoff.
use crate::auth;
use crate::error::{DistError, Result};
use crate::exec::{Activations, LocalStage, StageRequest};
use crate::identity;
use crate::protocol::{self, fnv1a_tokens, Conn, ForwardReq, ForwardRes, Msg, Registration, HANDSHAKE_MAX_FRAME};
use bytes::Bytes;
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use ds4_gguf::GgufFile;
use ds4_model::{Config, LayerRange, Options, Stage, Weights};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone)]
pub struct WorkerOptions {
    pub ctx: usize,
    pub threads: Option<usize>,
    pub token: Option<String>,
    /// The coordinator is gone after this long without a frame; also the connect timeout.
    pub timeout: Duration,
    /// Reconnect after the coordinator goes away (false: return).
    pub reconnect: bool,
    pub options: Options,
    /// Set to end the worker (tests): the connection is dropped at once.
    pub stop: Arc<AtomicBool>,
    pub debug: bool,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            ctx: 32768,
            threads: None,
            token: None,
            timeout: Duration::from_secs(10),
            reconnect: true,
            options: Options::default(),
            stop: Arc::new(AtomicBool::new(false)),
            debug: false,
        }
    }
}

/// The worker's stage and what it registers with.
pub fn load_stage(model: &Path, layers: &str, ctx: usize, options: Options) -> Result<(LocalStage, Registration)> {
    let file = Arc::new(GgufFile::open(model).map_err(|e| DistError::Model(format!("{}: {e}", model.display())))?);
    let cfg = Config::from_gguf(&file)?;
    let range = LayerRange::parse(layers, cfg.n_layer).map_err(|e| DistError::Usage(e.to_string()))?;
    let table_id = identity::table_id(&file, range)
        .ok_or_else(|| DistError::Model(format!("{} lacks tensors of layers {}", model.display(), range.label())))?;
    let reg = Registration {
        model_id: identity::model_id(&file),
        table_id,
        model_name: file.get("general.name").and_then(|v| v.as_str()).unwrap_or("").to_string(),
        n_layer: cfg.n_layer as u32,
        first: range.first as u32,
        last: range.last as u32,
        head: range.head,
        ctx: ctx as u64,
        activation_bits: vec![32, 16, 8],
    };
    let weights = Weights::bind(file, &cfg, range)?;
    Ok((LocalStage::new(Stage::new(cfg, weights, options), ctx), reg))
}

struct Out {
    sink: tokio::sync::Mutex<SplitSink<Conn, Bytes>>,
    timeout: Duration,
}

impl Out {
    async fn send(&self, m: &Msg) -> Result<()> {
        let f = protocol::encode_ref(m)?;
        match tokio::time::timeout(self.timeout, async { self.sink.lock().await.send(f).await }).await {
            Ok(r) => r.map_err(|e| DistError::Io(e.to_string())),
            Err(_) => Err(DistError::Io("send timed out".into())),
        }
    }
}

enum Job {
    Forward(ForwardReq, Arc<Out>),
    Reset(Option<u64>),
}

/// Runs the worker until `stop` is set, or the coordinator refuses it.
pub fn run_worker(model: &Path, layers: &str, coordinator: &str, opts: &WorkerOptions) -> Result<()> {
    if let Some(t) = opts.threads {
        let _ = rayon::ThreadPoolBuilder::new().num_threads(t.max(1)).build_global();
    }
    let (stage, reg) = load_stage(model, layers, opts.ctx, opts.options)?;
    serve(stage, reg, coordinator, opts)
}

/// Serves an already loaded stage (tests load once and restart the network side).
pub fn serve(mut stage: LocalStage, reg: Registration, coordinator: &str, opts: &WorkerOptions) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("ds4-dist-worker")
        .enable_all()
        .build()
        .map_err(|e| DistError::Io(format!("cannot start the network runtime: {e}")))?;
    let handle = rt.handle().clone();
    let (job_tx, job_rx) = mpsc::channel::<Job>();
    let debug = opts.debug;
    let compute = std::thread::Builder::new()
        .name("ds4-dist-compute".into())
        .spawn(move || {
            for job in job_rx {
                match job {
                    Job::Reset(s) => stage.drop_sessions(s),
                    Job::Forward(req, out) => {
                        let input = (!req.activations.is_empty()).then(|| Activations { bits: req.bits, data: req.activations });
                        let sreq = StageRequest {
                            session: req.session,
                            pos: req.pos as usize,
                            prefix_hash: req.prefix_hash,
                            tokens: &req.tokens,
                            input: input.as_ref(),
                            want: req.want,
                            bits: req.bits,
                        };
                        let msg = match stage.run(&sreq) {
                            Ok((payload, eval)) => {
                                if debug {
                                    eprintln!(
                                        "ds4: distributed worker: request={} layers={} pos={} tokens={} eval={:.3}ms",
                                        req.request,
                                        stage.stage.w.range.label(),
                                        req.pos,
                                        req.tokens.len(),
                                        eval.as_secs_f64() * 1e3
                                    );
                                }
                                Msg::Result(ForwardRes {
                                    request: req.request,
                                    eval_us: eval.as_micros() as u64,
                                    hash_after: fnv1a_tokens(req.prefix_hash, &req.tokens),
                                    payload,
                                })
                            }
                            Err((kind, message)) => Msg::Error { request: req.request, kind, message },
                        };
                        // A dead connection just drops the reply; the coordinator replays.
                        let _ = handle.block_on(out.send(&msg));
                    }
                }
            }
        })
        .map_err(|e| DistError::Io(format!("cannot start the compute thread: {e}")))?;
    let range = format!("{}:{}", reg.first, if reg.head { "output".to_string() } else { reg.last.to_string() });
    eprintln!("ds4: distributed worker: layers {range} model_id={} connecting to coordinator {coordinator}", identity::short(&reg.model_id));
    let mut backoff = Duration::from_millis(100);
    let result = loop {
        if opts.stop.load(Ordering::SeqCst) {
            break Ok(());
        }
        let t0 = Instant::now();
        match rt.block_on(session(&reg, coordinator, opts, &job_tx)) {
            Ok(why) => eprintln!("ds4: distributed worker: coordinator session ended: {why}"),
            Err(e @ (DistError::Rejected(_) | DistError::Auth(_))) => break Err(e),
            Err(e) => {
                if opts.debug || t0.elapsed() > Duration::from_secs(1) {
                    eprintln!("ds4: distributed worker: {e}");
                }
            }
        }
        // Sessions belong to the coordinator connection that built them.
        let _ = job_tx.send(Job::Reset(None));
        if !opts.reconnect || opts.stop.load(Ordering::SeqCst) {
            break Ok(());
        }
        if t0.elapsed() > Duration::from_secs(2) {
            backoff = Duration::from_millis(100);
        }
        let until = Instant::now() + backoff;
        while Instant::now() < until && !opts.stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        backoff = (backoff * 2).min(Duration::from_secs(1));
    };
    drop(job_tx);
    let _ = compute.join();
    result
}

/// One connection to the coordinator. Ok(reason) when it ended without a fatal refusal.
async fn session(reg: &Registration, coordinator: &str, opts: &WorkerOptions, jobs: &mpsc::Sender<Job>) -> Result<String> {
    let sock = tokio::time::timeout(opts.timeout, tokio::net::TcpStream::connect(coordinator))
        .await
        .map_err(|_| DistError::Io(format!("connect to {coordinator} timed out")))?
        .map_err(|e| DistError::Io(format!("connect to {coordinator}: {e}")))?;
    let mut conn = protocol::framed(sock, HANDSHAKE_MAX_FRAME);
    let max_frame = tokio::time::timeout(opts.timeout, handshake(&mut conn, reg, opts))
        .await
        .map_err(|_| DistError::Io("handshake timed out".into()))??;
    conn.codec_mut().set_max_frame_length(max_frame);
    eprintln!("ds4: distributed worker: registered with coordinator {coordinator} layers {}:{}", reg.first, if reg.head { "output".into() } else { reg.last.to_string() });
    let (sink, mut stream) = conn.split();
    let out = Arc::new(Out { sink: tokio::sync::Mutex::new(sink), timeout: opts.timeout });
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    let mut last = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if opts.stop.load(Ordering::SeqCst) {
                    return Ok("stopped".into());
                }
                if last.elapsed() > opts.timeout {
                    return Ok(format!("no frame from the coordinator for {:.1}s", opts.timeout.as_secs_f64()));
                }
            }
            f = stream.next() => {
                last = Instant::now();
                let frame = match f {
                    None => return Ok("connection closed by the coordinator".into()),
                    Some(Err(e)) => return Ok(format!("receive: {e}")),
                    Some(Ok(b)) => b,
                };
                match protocol::decode(&frame) {
                    Err(e) => return Ok(e.to_string()),
                    Ok(Msg::Forward(req)) => {
                        if jobs.send(Job::Forward(req, out.clone())).is_err() {
                            return Err(DistError::Other("compute thread ended".into()));
                        }
                    }
                    Ok(Msg::Reset { session }) => {
                        let _ = jobs.send(Job::Reset(session));
                    }
                    Ok(Msg::Heartbeat { seq }) => {
                        let out = out.clone();
                        tokio::spawn(async move { let _ = out.send(&Msg::Heartbeat { seq }).await; });
                    }
                    Ok(m) => return Ok(format!("unexpected {} from the coordinator", m.name())),
                }
            }
        }
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
