//! The coordinator's network side: listens for workers, authenticates and validates their
//! registrations, keeps the registry and plans routes, and gives each registered worker a
//! connection handle ([`WorkerConn`]) that the route calls. Heartbeats detect dead or hung workers.
use crate::auth;
use crate::error::{DistError, Result};
use crate::exec::{payload_bytes, HopTiming, StageExec, StageInfo, StageOutput, StageRequest};
use crate::identity;
use crate::protocol::{self, data_max_frame, Busy, Conn, Digest32, ErrorKind, ForwardRef, ForwardRes, Msg, Registration, HANDSHAKE_MAX_FRAME};
use crate::wire;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};
use ds4_gguf::GgufFile;
use ds4_model::{Config, LayerRange};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// Connections a coordinator keeps in their handshake at once; more are closed on arrival (a route
/// has a few workers, which retry).
pub const MAX_PENDING_HANDSHAKES: usize = 32;

/// What the coordinator accepts.
#[derive(Clone)]
pub struct CoordConfig {
    pub listen: String,
    pub file: Arc<GgufFile>,
    pub cfg: Config,
    pub local: LayerRange,
    pub ctx: usize,
    pub bits: u8,
    pub token: Option<String>,
    /// A worker silent for this long is dead.
    pub timeout: Duration,
    /// Largest prefill chunk (sizes the frame limit).
    pub max_chunk: usize,
    pub debug: bool,
}

type Reply = std::result::Result<ForwardRes, (ErrorKind, String)>;

/// One registered worker.
pub struct WorkerConn {
    pub id: u64,
    pub peer: SocketAddr,
    pub range: LayerRange,
    pub reg: Registration,
    /// Frames are written gathered straight to the socket (no frame assembled in memory).
    sink: tokio::sync::Mutex<OwnedWriteHalf>,
    max_frame: usize,
    pending: Mutex<Pending>,
    cancel: CancellationToken,
    handle: tokio::runtime::Handle,
}

struct Pending {
    dead: Option<String>,
    waiting: HashMap<u64, oneshot::Sender<Reply>>,
}

impl WorkerConn {
    pub fn label(&self) -> String { format!("{} {}", self.peer, self.range.label()) }

    pub fn dead_reason(&self) -> Option<String> { self.pending.lock().unwrap().dead.clone() }

    fn kill(&self, reason: String) -> bool {
        let mut p = self.pending.lock().unwrap();
        if p.dead.is_some() {
            return false;
        }
        p.dead = Some(reason.clone());
        for (_, tx) in p.waiting.drain() {
            let _ = tx.send(Err((ErrorKind::Failed, reason.clone())));
        }
        drop(p);
        self.cancel.cancel();
        true
    }

    /// Registers the reply slot, then writes the request. Call order = wire order.
    pub async fn call_async(&self, req: &ForwardRef<'_>) -> std::result::Result<(oneshot::Receiver<Reply>, Duration), String> {
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.pending.lock().unwrap();
            if let Some(d) = &p.dead {
                return Err(d.clone());
            }
            p.waiting.insert(req.request, tx);
        }
        let frame = wire::forward_frame(req, self.max_frame).map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        let r = tokio::select! {
            r = async { frame.write_async(&mut *self.sink.lock().await).await } => r.map_err(|e| format!("send: {e}")),
            _ = self.cancel.cancelled() => Err(self.dead_reason().unwrap_or_else(|| "connection closed".into())),
        };
        if let Err(e) = r {
            self.kill(e.clone());
            return Err(e);
        }
        Ok((rx, t0.elapsed()))
    }

    async fn send_msg(&self, m: &Msg) -> std::result::Result<(), String> {
        let frame = wire::msg_frame(m, self.max_frame).map_err(|e| e.to_string())?;
        tokio::select! {
            r = async { frame.write_async(&mut *self.sink.lock().await).await } => r.map_err(|e| format!("send: {e}")),
            _ = self.cancel.cancelled() => Err("connection closed".into()),
        }
    }

    /// Blocking call (not from a runtime thread).
    pub fn call(&self, req: &ForwardRef<'_>) -> std::result::Result<(ForwardRes, Duration, Duration), (ErrorKind, String)> {
        let t0 = Instant::now();
        let (rx, send) = self.handle.block_on(self.call_async(req)).map_err(|e| (ErrorKind::Failed, e))?;
        let t1 = Instant::now();
        let mut rx = rx;
        let r = match crate::spin::poll(|| match rx.try_recv() {
            Err(oneshot::error::TryRecvError::Empty) => None,
            r => Some(r.map_err(|_| ())),
        }) {
            Some(r) => r,
            None => rx.blocking_recv().map_err(|_| ()),
        };
        let r = r.map_err(|_| (ErrorKind::Failed, "connection closed".to_string()))??;
        let _ = t0;
        Ok((r, send, t1.elapsed()))
    }

    pub fn reset(&self, session: Option<u64>) -> std::result::Result<(), String> {
        self.handle.block_on(self.send_msg(&Msg::Reset { session }))
    }
}

/// A remote stage of a route: forwards to a worker connection.
pub struct RemoteStage {
    pub conn: Arc<WorkerConn>,
    pub index: usize,
    next_request: Arc<AtomicU64>,
}

impl RemoteStage {
    pub fn new(conn: Arc<WorkerConn>, index: usize, next_request: Arc<AtomicU64>) -> Self { Self { conn, index, next_request } }
}

pub fn stage_error(info: &StageInfo, index: usize, kind: ErrorKind, msg: &str) -> DistError {
    match kind {
        ErrorKind::KvMismatch => DistError::Stage(format!("{} KV mismatch: {msg}", info.describe(index))),
        ErrorKind::Failed => DistError::Stage(format!("{} failed: {msg}", info.describe(index))),
    }
}

impl StageExec for RemoteStage {
    fn info(&self) -> StageInfo { StageInfo { range: self.conn.range, location: self.conn.peer.to_string() } }

    fn forward(&mut self, req: &StageRequest) -> Result<StageOutput> {
        let (bits, activations): (u8, &[u8]) = match req.input {
            Some(a) => (a.bits, a.data),
            None => (req.bits, &[]),
        };
        let input_bytes = activations.len();
        let fr = ForwardRef {
            request: self.next_request.fetch_add(1, Ordering::Relaxed),
            session: req.session,
            pos: req.pos as u64,
            prefix_hash: req.prefix_hash,
            tokens: req.tokens,
            bits,
            activations,
            want: req.want,
        };
        match self.conn.call(&fr) {
            Ok((res, send, wait)) => {
                let eval = Duration::from_micros(res.eval_us);
                let timing = HopTiming {
                    eval,
                    forward_send: send,
                    downstream_wait: wait.saturating_sub(eval),
                    input_bytes,
                    output_bytes: payload_bytes(&res.payload),
                };
                Ok(StageOutput { payload: res.payload, timing })
            }
            Err((kind, m)) => Err(stage_error(&self.info(), self.index, kind, &m)),
        }
    }

    fn reset(&mut self, session: Option<u64>) -> Result<()> {
        self.conn.reset(session).map_err(|m| stage_error(&self.info(), self.index, ErrorKind::Failed, &m))
    }

    fn remote(&self) -> Option<Arc<WorkerConn>> { Some(self.conn.clone()) }
}

struct Registry {
    workers: Vec<Arc<WorkerConn>>,
    generation: u64,
    /// Why the worker that owned a range (by first layer) went away, until it is replaced.
    lost: HashMap<usize, String>,
}

/// (table_id, weights_id) of a layer range.
type Ids = (Digest32, Digest32);

struct Inner {
    cfg: CoordConfig,
    model_id: Digest32,
    reg: Mutex<Registry>,
    changed: Condvar,
    next_id: AtomicU64,
    /// (table_id, weights_id) of the coordinator's file per worker range (None: the file lacks them).
    ids: Mutex<HashMap<(usize, usize, bool), Option<Ids>>>,
}

/// A planned route: the workers after the local layers, in layer order.
#[derive(Clone)]
pub struct RoutePlan {
    pub workers: Vec<Arc<WorkerConn>>,
    pub generation: u64,
}

pub struct Coordinator {
    inner: Arc<Inner>,
    rt: tokio::runtime::Runtime,
    pub addr: SocketAddr,
    pub next_request: Arc<AtomicU64>,
}

impl Coordinator {
    pub fn start(cfg: CoordConfig) -> Result<Self> {
        protocol_check_local(&cfg)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("ds4-dist-coord")
            .enable_all()
            .build()
            .map_err(|e| DistError::Io(format!("cannot start the network runtime: {e}")))?;
        let listener = rt
            .block_on(TcpListener::bind(&cfg.listen))
            .map_err(|e| DistError::Io(format!("--listen {}: {e}", cfg.listen)))?;
        let addr = listener.local_addr()?;
        let model_id = identity::model_id(&cfg.file);
        let inner = Arc::new(Inner { cfg, model_id, reg: Mutex::new(Registry { workers: Vec::new(), generation: 0, lost: HashMap::new() }), changed: Condvar::new(), next_id: AtomicU64::new(1), ids: Mutex::new(HashMap::new()) });
        eprintln!(
            "ds4: distributed coordinator: listening on {addr} model_id={} local layers {} ctx={} activation_bits={}{}",
            identity::short(&model_id),
            inner.cfg.local.label(),
            inner.cfg.ctx,
            inner.cfg.bits,
            if inner.cfg.token.is_some() { " (authentication required)" } else { "" }
        );
        inner.log_route(&inner.reg.lock().unwrap());
        let i2 = inner.clone();
        // Connections still in their handshake (not yet authenticated): a bounded number, so a flood of
        // connections that never finish cannot hold unbounded sockets and tasks for the timeout each.
        let pending = Arc::new(tokio::sync::Semaphore::new(MAX_PENDING_HANDSHAKES));
        rt.spawn(async move {
            let mut refused = 0u64;
            loop {
                match listener.accept().await {
                    Ok((sock, peer)) => {
                        let Ok(permit) = pending.clone().try_acquire_owned() else {
                            // Closed at once; logged for the first and then every 1000th.
                            if refused % 1000 == 0 {
                                eprintln!("ds4: distributed coordinator: {MAX_PENDING_HANDSHAKES} handshakes in progress: connection from {peer} closed ({} so far)", refused + 1);
                            }
                            refused += 1;
                            continue;
                        };
                        let i3 = i2.clone();
                        tokio::spawn(async move {
                            if let Err(e) = i3.clone().serve(sock, peer, permit).await {
                                eprintln!("ds4: distributed coordinator: worker {peer}: {e}");
                            }
                        });
                    }
                    Err(e) => {
                        eprintln!("ds4: distributed coordinator: accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
        Ok(Self { inner, rt, addr, next_request: Arc::new(AtomicU64::new(1)) })
    }

    pub fn config(&self) -> &CoordConfig { &self.inner.cfg }
    pub fn handle(&self) -> tokio::runtime::Handle { self.rt.handle().clone() }

    /// The current route, or why it is incomplete.
    pub fn plan(&self) -> Result<RoutePlan> {
        let r = self.inner.reg.lock().unwrap();
        self.inner.plan(&r).map(|workers| RoutePlan { workers, generation: r.generation })
    }

    pub fn generation(&self) -> u64 { self.inner.reg.lock().unwrap().generation }

    /// Waits until the route is complete (or the timeout passes).
    pub fn wait_complete(&self, timeout: Duration) -> Result<RoutePlan> {
        let deadline = Instant::now() + timeout;
        let mut r = self.inner.reg.lock().unwrap();
        loop {
            if let Ok(w) = self.inner.plan(&r) {
                return Ok(RoutePlan { workers: w, generation: r.generation });
            }
            let now = Instant::now();
            if now >= deadline {
                return self.inner.plan(&r).map(|w| RoutePlan { workers: w, generation: r.generation });
            }
            r = self.inner.changed.wait_timeout(r, deadline - now).unwrap().0;
        }
    }

    /// Waits until the registry generation moves past `gen` (a worker came or went).
    pub fn wait_change(&self, gen: u64, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        let mut r = self.inner.reg.lock().unwrap();
        while r.generation == gen {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            r = self.inner.changed.wait_timeout(r, deadline - now).unwrap().0;
        }
        r.generation
    }

    /// Registered workers (address, range), in layer order.
    pub fn workers(&self) -> Vec<(SocketAddr, LayerRange)> {
        let mut v: Vec<_> = self.inner.reg.lock().unwrap().workers.iter().map(|w| (w.peer, w.range)).collect();
        v.sort_by_key(|w| w.1.first);
        v
    }
}

fn protocol_check_local(cfg: &CoordConfig) -> Result<()> {
    crate::codec::check_bits(cfg.bits)?;
    if cfg.local.first != 0 {
        return Err(DistError::Usage(format!("--role coordinator needs --layers starting at 0 (got {})", cfg.local.label())));
    }
    Ok(())
}

impl Inner {
    fn plan(&self, r: &Registry) -> Result<Vec<Arc<WorkerConn>>> {
        let n_layer = self.cfg.cfg.n_layer;
        let mut next = self.cfg.local.last + 1;
        let mut route = Vec::new();
        let mut have_head = self.cfg.local.head;
        while next < n_layer {
            match r.workers.iter().find(|w| w.range.first == next) {
                Some(w) => {
                    route.push(w.clone());
                    next = w.range.last + 1;
                    have_head = w.range.head;
                }
                None => {
                    let why = match r.lost.get(&next) {
                        Some(l) => format!("next needed layer {next}; stage {} {l}", route.len() + 1),
                        None => format!("next needed layer {next}"),
                    };
                    return Err(DistError::Incomplete(why));
                }
            }
        }
        if !have_head {
            return Err(DistError::Incomplete("no stage owns the output head (the last worker must use A:output)".into()));
        }
        Ok(route)
    }

    fn log_route(&self, r: &Registry) {
        match self.plan(r) {
            Ok(w) => {
                let mut s = format!("local {}", self.cfg.local.label());
                for x in &w {
                    s.push_str(&format!(" -> {} {}", x.peer, x.range.label()));
                }
                eprintln!("ds4: distributed coordinator: complete route ready: {s}");
            }
            Err(DistError::Incomplete(why)) => eprintln!("ds4: distributed coordinator: route incomplete; {why}"),
            Err(e) => eprintln!("ds4: distributed coordinator: route: {e}"),
        }
    }

    /// Why a registration is refused, if it is.
    fn validate(&self, reg: &Registration, r: &Registry) -> std::result::Result<LayerRange, String> {
        let c = &self.cfg;
        if reg.model_id != self.model_id {
            return Err(format!(
                "wrong model: worker model_id {} ({}) differs from the coordinator's {} ({})",
                identity::short(&reg.model_id),
                reg.model_name,
                identity::short(&self.model_id),
                c.file.get("general.name").and_then(|v| v.as_str()).unwrap_or("?")
            ));
        }
        if reg.n_layer as usize != c.cfg.n_layer {
            return Err(format!("wrong model: worker has {} layers, coordinator {}", reg.n_layer, c.cfg.n_layer));
        }
        let (first, last) = (reg.first as usize, reg.last as usize);
        if first > last || last >= c.cfg.n_layer {
            return Err(format!("invalid layer range {first}:{last} (the model has layers 0..{})", c.cfg.n_layer - 1));
        }
        if reg.head && last != c.cfg.n_layer - 1 {
            return Err(format!("range {first}:{last} claims the output head without the last layer"));
        }
        if !reg.head && last == c.cfg.n_layer - 1 {
            return Err(format!("range {first}:{last} ends at the last layer without the output head; use {first}:output"));
        }
        let range = LayerRange { first, last, embed: first == 0, head: reg.head };
        if first <= c.local.last {
            return Err(format!("layers {} overlap the coordinator's local layers {}", range.label(), c.local.label()));
        }
        for w in &r.workers {
            let same = w.range == range;
            if !same && first <= w.range.last && w.range.first <= last {
                return Err(format!("layers {} overlap worker {} layers {}", range.label(), w.peer, w.range.label()));
            }
        }
        if (reg.ctx as usize) < c.ctx {
            return Err(format!("worker ctx {} is below the coordinator's --ctx {}", reg.ctx, c.ctx));
        }
        if !reg.activation_bits.contains(&c.bits) {
            return Err(format!("worker does not accept {}-bit activations (accepts {:?})", c.bits, reg.activation_bits));
        }
        Ok(range)
    }

    /// Refuses a worker whose tensors of `range` differ from the coordinator's file, when that file
    /// holds them: the tensor table (quantization, shapes), then a sampled fingerprint of the bytes
    /// (the same metadata and table with other weights). Computed off the runtime's thread and
    /// cached per range (a restarted worker of a large model does not read the samples again).
    async fn check_identity(&self, reg: &Registration, range: LayerRange) -> std::result::Result<(), String> {
        let key = (range.first, range.last, range.head);
        let cached = self.ids.lock().unwrap().get(&key).copied();
        let ids = match cached {
            Some(ids) => ids,
            None => {
                let file = self.cfg.file.clone();
                let ids = tokio::task::spawn_blocking(move || identity::table_id(&file, range).zip(identity::weights_id(&file, range)))
                    .await
                    .map_err(|e| format!("cannot check the worker's tensors: {e}"))?;
                self.ids.lock().unwrap().insert(key, ids);
                ids
            }
        };
        let Some((table, weights)) = ids else { return Ok(()) };
        if table != reg.table_id {
            return Err(format!("wrong model: tensor table of layers {} differs from the coordinator's file (different quantization or shapes)", range.label()));
        }
        if weights != reg.weights_id {
            return Err(format!(
                "wrong model: the weights of layers {} differ from the coordinator's file (same metadata and tensor types: another fine-tune or quantization run, or a damaged file)",
                range.label()
            ));
        }
        Ok(())
    }

    /// One connection: the handshake (holding `pending`, a place among the handshakes in progress),
    /// then the registered worker's session.
    async fn serve(self: Arc<Self>, sock: tokio::net::TcpStream, peer: SocketAddr, pending: tokio::sync::OwnedSemaphorePermit) -> Result<()> {
        let mut conn = protocol::framed(sock, HANDSHAKE_MAX_FRAME);
        let hs = tokio::time::timeout(self.cfg.timeout, self.handshake(&mut conn, peer)).await;
        drop(pending);
        let (reg, range, coord_mac) = match hs {
            Err(_) => return Err(DistError::Protocol("handshake timed out".into())),
            Ok(Err(DistError::Rejected(reason))) => {
                eprintln!("ds4: distributed coordinator: rejected worker {peer}: {reason}");
                let _ = protocol::send(&mut conn, &Msg::Reject { reason }).await;
                return Ok(());
            }
            Ok(Err(e)) => return Err(e),
            Ok(Ok(x)) => x,
        };
        let c = &self.cfg;
        let max_frame = data_max_frame(c.cfg.hc_dim(), c.cfg.n_vocab, c.max_chunk.max(1));
        conn.codec_mut().set_max_frame_length(max_frame);
        protocol::send(&mut conn, &Msg::Accept { mac: coord_mac, max_frame: max_frame as u64 }).await?;
        // Split into a gathered writer and a frame reader (bytes already read stay first).
        let parts = conn.into_parts();
        let (rh, wh) = parts.io.into_split();
        let mut stream = FramedRead::new(rh, parts.codec);
        stream.read_buffer_mut().extend_from_slice(&parts.read_buf);
        let sink = wh;
        let w = Arc::new(WorkerConn {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            peer,
            range,
            reg: reg.clone(),
            sink: tokio::sync::Mutex::new(sink),
            max_frame,
            pending: Mutex::new(Pending { dead: None, waiting: HashMap::new() }),
            cancel: CancellationToken::new(),
            handle: tokio::runtime::Handle::current(),
        });
        {
            let mut r = self.reg.lock().unwrap();
            // A stale registration of the same range (e.g. a restarted worker) is replaced.
            let mut stale = Vec::new();
            r.workers.retain(|x| {
                if x.range == range {
                    stale.push(x.clone());
                    false
                } else {
                    true
                }
            });
            for s in stale {
                s.kill(format!("replaced by a new registration of layers {} from {peer}", range.label()));
            }
            r.workers.push(w.clone());
            r.lost.remove(&range.first);
            r.generation += 1;
            eprintln!(
                "ds4: distributed coordinator: registered worker {peer} model_id={} layers={} ctx={} activation_bits={}",
                identity::short(&reg.model_id),
                range.label(),
                reg.ctx,
                c.bits
            );
            self.log_route(&r);
        }
        self.changed.notify_all();
        // Heartbeats out; replies and results in.
        let hb = w.clone();
        let interval = (self.cfg.timeout / 4).max(Duration::from_millis(20));
        tokio::spawn(async move {
            let mut seq = 0u64;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = hb.cancel.cancelled() => break,
                }
                seq += 1;
                if let Err(e) = hb.send_msg(&Msg::Heartbeat { seq, busy: None }).await {
                    hb.kill(format!("heartbeat: {e}"));
                    break;
                }
            }
        });
        let reason = self.read_loop(&w, stream).await;
        w.kill(reason.clone());
        // Close our side, so a worker that wakes up later sees the session ended.
        let _ = tokio::time::timeout(Duration::from_secs(1), async { w.sink.lock().await.shutdown().await }).await;
        {
            let mut r = self.reg.lock().unwrap();
            let before = r.workers.len();
            r.workers.retain(|x| x.id != w.id);
            if r.workers.len() != before {
                r.generation += 1;
                r.lost.insert(range.first, format!("(layers {} at worker {peer}) failed: {reason}", range.label()));
                eprintln!("ds4: distributed coordinator: forgot failed route worker {} layers {}: {reason}", peer, range.label());
                self.log_route(&r);
            }
        }
        self.changed.notify_all();
        Ok(())
    }

    /// Reads the worker's frames until it fails: closed, silent for the timeout (no frame at all), or
    /// hung (its heartbeats say it is computing a request, and no layer of it completed for the
    /// timeout: the deadline is the worker's last progress + timeout, whatever the heartbeat period).
    async fn read_loop(&self, w: &WorkerConn, mut stream: FramedRead<OwnedReadHalf, LengthDelimitedCodec>) -> String {
        use tokio::time::Instant;
        let timeout = self.cfg.timeout;
        let mut silent_at = Instant::now() + timeout;
        // While the worker reports itself busy: when its computation counts as hung, and its report.
        let mut stall: Option<(Instant, Busy)> = None;
        loop {
            let deadline = stall.map_or(silent_at, |(at, _)| at.min(silent_at));
            let next = tokio::select! {
                n = tokio::time::timeout_at(deadline, stream.next()) => n,
                _ = w.cancel.cancelled() => return w.dead_reason().unwrap_or_else(|| "closed".into()),
            };
            let frame = match next {
                Err(_) => {
                    return match stall {
                        Some((at, b)) if at <= silent_at => format!(
                            "compute hung: request {} made no progress for {:.1}s ({} of {} layers{} done; the worker still sends heartbeats)",
                            b.request,
                            timeout.as_secs_f64(),
                            b.layers_done,
                            w.range.last + 1 - w.range.first,
                            if w.range.head { " + head" } else { "" }
                        ),
                        _ => format!("no heartbeat or reply for {:.1}s (worker hung or unreachable)", timeout.as_secs_f64()),
                    }
                }
                Ok(None) => return "connection closed by the worker".into(),
                Ok(Some(Err(e))) => return format!("receive: {e}"),
                Ok(Some(Ok(b))) => b,
            };
            let now = Instant::now();
            silent_at = now + timeout;
            // A hidden result's bytes stay a slice of the frame (relayed to the next hop as they are).
            let msg = match wire::decode_shared(&frame.freeze()) {
                Ok(m) => m,
                Err(e) => return e.to_string(),
            };
            match msg {
                Msg::Heartbeat { busy, .. } => {
                    // Hung at (last progress + timeout) = now + (timeout - stalled), or now already.
                    stall = busy.map(|b| (now + timeout.saturating_sub(Duration::from_millis(b.stalled_ms)), b));
                }
                Msg::Result(res) => {
                    stall = None;
                    let tx = w.pending.lock().unwrap().waiting.remove(&res.request);
                    if let Some(tx) = tx {
                        let _ = tx.send(Ok(res));
                    }
                }
                Msg::Error { request, kind, message } => {
                    stall = None;
                    let tx = w.pending.lock().unwrap().waiting.remove(&request);
                    if let Some(tx) = tx {
                        let _ = tx.send(Err((kind, message)));
                    }
                }
                other => return format!("unexpected {} from a registered worker", other.name()),
            }
        }
    }

    async fn handshake(&self, conn: &mut Conn, _peer: SocketAddr) -> Result<(Registration, LayerRange, Option<Digest32>)> {
        let wn = match protocol::recv(conn).await? {
            Msg::Hello { nonce } => nonce,
            m => return Err(DistError::Protocol(format!("expected Hello, got {}", m.name()))),
        };
        let cn = auth::nonce()?;
        protocol::send(conn, &Msg::Challenge { nonce: cn, auth_required: self.cfg.token.is_some() }).await?;
        let mac = match protocol::recv(conn).await? {
            Msg::Auth { mac } => mac,
            m => return Err(DistError::Protocol(format!("expected Auth, got {}", m.name()))),
        };
        if let Some(secret) = &self.cfg.token {
            match mac {
                None => return Err(DistError::Rejected("authentication required: start the worker with the coordinator's --dist-token".into())),
                Some(m) if !auth::verify_worker(secret, &cn, &wn, &m) => {
                    return Err(DistError::Rejected("authentication failed: the worker's --dist-token does not match".into()))
                }
                Some(_) => {}
            }
        }
        let reg = match protocol::recv(conn).await? {
            Msg::Register(r) => r,
            m => return Err(DistError::Protocol(format!("expected Register, got {}", m.name()))),
        };
        let range = {
            let r = self.reg.lock().unwrap();
            self.validate(&reg, &r).map_err(DistError::Rejected)?
        };
        self.check_identity(&reg, range).await.map_err(DistError::Rejected)?;
        let coord_mac = self.cfg.token.as_ref().map(|s| auth::coordinator_proof(s, &wn, &cn));
        Ok((reg, range, coord_mac))
    }
}
