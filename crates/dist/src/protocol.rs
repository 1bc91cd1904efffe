//! Wire protocol: versioned messages carried in length-delimited frames (tokio-util's
//! `LengthDelimitedCodec`, 4-byte big-endian length, maximum frame size enforced by the codec).
//!
//! Every frame holds one [`Envelope`] serialized with bincode (fixed-int encoding, size limit =
//! the frame length), so a malformed or oversized frame is an error on that connection only.
//!
//! Handshake (worker dials the coordinator):
//! ```text
//! worker -> Hello{nonce_w}            coordinator -> Challenge{nonce_c, auth_required}
//! worker -> Auth{mac_w}               (HMAC-SHA256(secret, "worker" | nonce_c | nonce_w), or empty)
//! worker -> Register{...}             coordinator -> Accept{mac_c} | Reject{reason}
//! ```
//! Before `Accept` the frame limit is [`HANDSHAKE_MAX_FRAME`]; afterwards it grows to what the
//! registered context and chunk size need.
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use crate::error::DistError;

/// Bumped on any incompatible change of the messages below.
/// 2: 16-bit activations carry a power-of-two exponent per block of 64 (see `codec`).
/// 3: a worker's heartbeat carries its compute progress ([`Busy`]).
/// 4: a registration carries a fingerprint of the range's weights ([`Registration::weights_id`]).
pub const PROTOCOL_VERSION: u16 = 4;
/// Frame limit while the peer is not yet authenticated and registered.
pub const HANDSHAKE_MAX_FRAME: usize = 64 * 1024;
/// Upper bound of the frame limit after registration, whatever the shapes say.
pub const ABSOLUTE_MAX_FRAME: usize = 1 << 30;

pub type Nonce = [u8; 32];
pub type Digest32 = [u8; 32];

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Envelope {
    pub version: u16,
    pub msg: Msg,
}

/// What the final stage sends back for a forward request.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum Want {
    /// Intermediate stage: the HC streams for the next stage.
    Hidden,
    /// Nothing but an acknowledgement (non-final prefill chunks at the last stage).
    Ack,
    /// Logits of the last token.
    LastLogits,
    /// Logits of every token.
    AllLogits,
    /// Greedy token id of the last position (plus its log-probability and the top `top_logprobs`).
    Greedy { top_logprobs: u8 },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Registration {
    /// sha256 of the model metadata (without `ds4.shard.*` keys): the same for every shard of a model.
    pub model_id: Digest32,
    /// sha256 of the tensor table (name, type, dims) of the tensors this range owns.
    pub table_id: Digest32,
    /// Sampled fingerprint of those tensors' bytes (`identity::weights_id`): other weights with the
    /// same metadata and table (another fine-tune or quantization run) differ.
    pub weights_id: Digest32,
    pub model_name: String,
    pub n_layer: u32,
    pub first: u32,
    pub last: u32,
    pub head: bool,
    pub ctx: u64,
    /// Activation formats the worker decodes (subset of 32, 16, 8).
    pub activation_bits: Vec<u8>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ForwardReq {
    pub request: u64,
    pub session: u64,
    pub pos: u64,
    /// FNV-1a 64 over the little-endian token ids before `pos` (the worker's KV must match).
    pub prefix_hash: u64,
    pub tokens: Vec<u32>,
    pub bits: u8,
    #[serde(with = "crate::wire::bytes_serde")]
    pub activations: Bytes,
    pub want: Want,
}

/// A borrowed [`ForwardReq`] (same fields, same order, same encoding): the coordinator sends
/// activations and tokens from where they are, without copying them into a message first.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ForwardRef<'a> {
    pub request: u64,
    pub session: u64,
    pub pos: u64,
    pub prefix_hash: u64,
    pub tokens: &'a [u32],
    pub bits: u8,
    #[serde(with = "serde_bytes")]
    pub activations: &'a [u8],
    pub want: Want,
}

impl ForwardReq {
    pub fn as_ref(&self) -> ForwardRef<'_> {
        ForwardRef {
            request: self.request,
            session: self.session,
            pos: self.pos,
            prefix_hash: self.prefix_hash,
            tokens: &self.tokens,
            bits: self.bits,
            activations: &self.activations,
            want: self.want,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum Payload {
    Ack,
    Hidden {
        bits: u8,
        #[serde(with = "crate::wire::bytes_serde")]
        data: Bytes,
    },
    Logits(Vec<f32>),
    Token { id: u32, logprob: f32, top: Vec<(u32, f32)> },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ForwardRes {
    pub request: u64,
    /// Worker compute time of this request in microseconds.
    pub eval_us: u64,
    /// Prefix hash after the span (what the next request must carry).
    pub hash_after: u64,
    pub payload: Payload,
}

/// What a worker's compute thread is doing, sent in its heartbeats (the heartbeat comes from another
/// thread, so a live connection alone does not prove the computation moves).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Busy {
    /// The forward request being served (read, computed, replied).
    pub request: u64,
    /// Layers of it completed so far (the output head counts as one more).
    pub layers_done: u32,
    /// Milliseconds since the last progress: the request's start or its last completed layer.
    pub stalled_ms: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum ErrorKind {
    /// The worker's KV is not at the requested position/prefix: the coordinator replays.
    KvMismatch,
    /// Anything else (bad input, model error).
    Failed,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum Msg {
    Hello { nonce: Nonce },
    Challenge { nonce: Nonce, auth_required: bool },
    Auth { mac: Option<Digest32> },
    Register(Registration),
    Accept { mac: Option<Digest32>, max_frame: u64 },
    Reject { reason: String },
    Forward(ForwardReq),
    Result(ForwardRes),
    /// Liveness; from a worker also its compute progress (None: idle; always None from the coordinator).
    Heartbeat { seq: u64, busy: Option<Busy> },
    /// Drop a session's KV (all sessions when `session` is None).
    Reset { session: Option<u64> },
    Error { request: u64, kind: ErrorKind, message: String },
}

impl Msg {
    pub fn name(&self) -> &'static str {
        match self {
            Msg::Hello { .. } => "Hello",
            Msg::Challenge { .. } => "Challenge",
            Msg::Auth { .. } => "Auth",
            Msg::Register(_) => "Register",
            Msg::Accept { .. } => "Accept",
            Msg::Reject { .. } => "Reject",
            Msg::Forward(_) => "Forward",
            Msg::Result(_) => "Result",
            Msg::Heartbeat { .. } => "Heartbeat",
            Msg::Reset { .. } => "Reset",
            Msg::Error { .. } => "Error",
        }
    }
}

fn opts() -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new().with_fixint_encoding().with_little_endian().reject_trailing_bytes()
}

/// Serializes a message into one frame body.
pub fn encode(msg: &Msg) -> Result<Bytes, DistError> {
    use bincode::Options;
    let env = Envelope { version: PROTOCOL_VERSION, msg: msg.clone() };
    opts().serialize(&env).map(Bytes::from).map_err(|e| DistError::Protocol(format!("encode {}: {e}", msg.name())))
}

/// Serializes without cloning the message (hot path).
pub fn encode_ref(msg: &Msg) -> Result<Bytes, DistError> {
    use bincode::Options;
    #[derive(Serialize)]
    struct EnvRef<'a> {
        version: u16,
        msg: &'a Msg,
    }
    opts()
        .serialize(&EnvRef { version: PROTOCOL_VERSION, msg })
        .map(Bytes::from)
        .map_err(|e| DistError::Protocol(format!("encode {}: {e}", msg.name())))
}

/// Serializes `Msg::Forward` from a borrowed request: the same bytes as [`encode`] of the owned
/// message (serde encodes a newtype variant as its index and content; `Forward` is variant 6).
pub fn encode_forward(req: &ForwardRef) -> Result<Bytes, DistError> {
    use bincode::Options;
    #[derive(Serialize)]
    #[allow(dead_code)]
    enum MsgRef<'a> {
        Hello,
        Challenge,
        Auth,
        Register,
        Accept,
        Reject,
        Forward(&'a ForwardRef<'a>),
    }
    #[derive(Serialize)]
    struct EnvRef<'a> {
        version: u16,
        msg: MsgRef<'a>,
    }
    opts()
        .serialize(&EnvRef { version: PROTOCOL_VERSION, msg: MsgRef::Forward(req) })
        .map(Bytes::from)
        .map_err(|e| DistError::Protocol(format!("encode Forward: {e}")))
}

/// Parses one frame body; checks the protocol version. Never panics on hostile input: bincode's
/// size limit is the frame length, so no allocation exceeds what was received.
pub fn decode(frame: &[u8]) -> Result<Msg, DistError> {
    use bincode::Options;
    if frame.len() < 2 {
        return Err(DistError::Protocol(format!("frame of {} bytes is too short", frame.len())));
    }
    let version = u16::from_le_bytes([frame[0], frame[1]]);
    if version != PROTOCOL_VERSION {
        return Err(DistError::Protocol(format!("peer speaks protocol version {version}, this build speaks {PROTOCOL_VERSION}")));
    }
    let env: Envelope = opts()
        .with_limit(frame.len() as u64)
        .deserialize(frame)
        .map_err(|e| DistError::Protocol(format!("malformed frame ({} bytes): {e}", frame.len())))?;
    Ok(env.msg)
}

pub type Conn = Framed<TcpStream, LengthDelimitedCodec>;

pub fn codec(max_frame: usize) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder().length_field_length(4).max_frame_length(max_frame).new_codec()
}

/// Wraps a socket in the frame codec (TCP_NODELAY on: decode is latency-bound).
pub fn framed(sock: TcpStream, max_frame: usize) -> Conn {
    let _ = sock.set_nodelay(true);
    Framed::new(sock, codec(max_frame))
}

pub async fn send(conn: &mut Conn, msg: &Msg) -> Result<(), DistError> {
    let b = encode_ref(msg)?;
    conn.send(b).await.map_err(|e| DistError::Io(format!("send {}: {e}", msg.name())))
}

/// Next message, or an error for EOF, I/O failure, an oversized or malformed frame.
pub async fn recv(conn: &mut Conn) -> Result<Msg, DistError> {
    match conn.next().await {
        None => Err(DistError::Io("connection closed by peer".into())),
        // The codec's refusal of a length prefix over the limit: the peer does not speak this protocol.
        Some(Err(e)) if e.kind() == std::io::ErrorKind::InvalidData => Err(DistError::Protocol(format!("receive: {e} (a length prefix over the frame limit)"))),
        Some(Err(e)) => Err(DistError::Io(format!("receive: {e}"))),
        Some(Ok(b)) => decode(&b),
    }
}

/// Frame limit after registration: a full prefill chunk of activations or of logits, plus slack.
pub fn data_max_frame(hc_dim: usize, n_vocab: usize, max_chunk: usize) -> usize {
    let per_tok = (hc_dim * 4 + 4).max(n_vocab * 4);
    (max_chunk.saturating_mul(per_tok).saturating_add(1 << 16)).min(ABSOLUTE_MAX_FRAME)
}

/// 64-bit FNV-1a over little-endian token ids, continuing from `h` (start with [`FNV_OFFSET`]).
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
pub fn fnv1a_tokens(mut h: u64, tokens: &[u32]) -> u64 {
    for t in tokens {
        for b in t.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_hostile_frames() {
        let m = Msg::Forward(ForwardReq {
            request: 7,
            session: 1,
            pos: 3,
            prefix_hash: 9,
            tokens: vec![1, 2, 3],
            bits: 16,
            activations: Bytes::from_static(&[1, 2, 3, 4]),
            want: Want::Greedy { top_logprobs: 2 },
        });
        let b = encode(&m).unwrap();
        assert_eq!(decode(&b).unwrap(), m);
        let Msg::Forward(req) = &m else { unreachable!() };
        assert_eq!(encode_forward(&req.as_ref()).unwrap(), b, "borrowed and owned Forward encode alike");
        // Truncations, garbage and a wrong version are errors, never panics.
        for n in 0..b.len() {
            assert!(decode(&b[..n]).is_err());
        }
        let mut v = b.to_vec();
        v[0] = 99;
        assert!(decode(&v).unwrap_err().to_string().contains("version"));
        // A length prefix claiming 4 GiB of tokens inside a small frame is refused without allocating.
        let mut evil = encode(&Msg::Reset { session: None }).unwrap().to_vec();
        evil.truncate(2);
        evil.extend_from_slice(&6u32.to_le_bytes()); // variant Forward
        evil.extend_from_slice(&[0u8; 32]);
        evil.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode(&evil).is_err());
        let mut x = 0x1234_5678u64;
        for len in 0..200 {
            let f: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = decode(&f);
        }
    }

    #[test]
    fn heartbeat_carries_progress() {
        for busy in [None, Some(Busy { request: u64::MAX, layers_done: 3, stalled_ms: 1234 })] {
            let m = Msg::Heartbeat { seq: 9, busy };
            let b = encode(&m).unwrap();
            assert_eq!(decode(&b).unwrap(), m);
            for n in 0..b.len() {
                assert!(decode(&b[..n]).is_err());
            }
        }
        // A version-2 heartbeat (no progress) is refused by version.
        let mut old = encode(&Msg::Heartbeat { seq: 1, busy: None }).unwrap().to_vec();
        old[..2].copy_from_slice(&2u16.to_le_bytes());
        assert!(decode(&old).unwrap_err().to_string().contains("version 2"));
    }

    #[test]
    fn fnv_is_incremental() {
        let a = fnv1a_tokens(FNV_OFFSET, &[1, 2, 3, 4]);
        let b = fnv1a_tokens(fnv1a_tokens(FNV_OFFSET, &[1, 2]), &[3, 4]);
        assert_eq!(a, b);
    }
}
