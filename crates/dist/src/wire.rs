//! The data path of a hop without copies or per-frame allocations: a hop used to serialize the
//! activations into a fresh frame (copy 1), let the frame codec copy that into its write buffer
//! (copy 2), read the frame in 64 KiB pieces appended to a growing buffer (copy 3) and deserialize
//! them into a fresh vector (copy 4) — four passes over, and two or three fresh allocations of, a
//! prefill chunk's activations (256 MiB for 4096 tokens of Flash) per hop and direction.
//!
//! Here the bytes are the same as [`protocol::encode`]'s (a frame is still one bincode
//! `Envelope`), but:
//! - a frame is written gathered: the small bincode head, the activations where they lie, the tail
//!   ([`Gathered`]: `write_vectored` on the socket, no frame built in memory);
//! - a data frame (`Forward`, `Result`) is decoded borrowing its activations from the frame
//!   ([`decode_data`]: a `Bytes` slice of the received buffer on the coordinator, a slice of the
//!   worker's reused read buffer on the worker);
//! - the worker reads frames into one buffer that grows to the largest frame and is reused
//!   ([`FrameReader`]), and encoded activations go into vectors taken from and returned to a small
//!   pool ([`take_buf`], [`give_back`]).
use crate::error::{DistError, Result};
use crate::protocol::{self, ForwardRef, ForwardReq, ForwardRes, Msg, Payload, Want, PROTOCOL_VERSION};
use bytes::Bytes;
use serde::Deserialize;
use std::io::{IoSlice, Read, Write};
use std::sync::Mutex;

fn opts() -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new().with_fixint_encoding().with_little_endian().reject_trailing_bytes()
}

/// `Msg` variant indices of the data messages (serde numbers variants in declaration order).
const FORWARD: u32 = 6;
const RESULT: u32 = 7;

/// A frame as three pieces: `head` (length prefix, envelope and fields up to the activations'
/// length), `data` (the activations, borrowed), `tail` (fields after them).
pub struct Gathered<'a> {
    pub head: Vec<u8>,
    pub data: &'a [u8],
    pub tail: Vec<u8>,
}

impl Gathered<'_> {
    pub fn len(&self) -> usize { self.head.len() + self.data.len() + self.tail.len() }
    pub fn is_empty(&self) -> bool { self.len() == 0 }

    /// The contiguous frame (tests; the hot path writes the pieces).
    pub fn to_vec(&self) -> Vec<u8> { [&self.head[..], self.data, &self.tail[..]].concat() }

    fn slices(&self) -> [IoSlice<'_>; 3] { [IoSlice::new(&self.head), IoSlice::new(self.data), IoSlice::new(&self.tail)] }

    /// Writes the frame to a blocking socket.
    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        let mut bufs = self.slices();
        let mut bufs = &mut bufs[..];
        IoSlice::advance_slices(&mut bufs, 0);
        while !bufs.is_empty() {
            match w.write_vectored(bufs) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes the frame to an async socket.
    pub async fn write_async<W: tokio::io::AsyncWrite + Unpin>(&self, w: &mut W) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        let mut bufs = self.slices();
        let mut bufs = &mut bufs[..];
        IoSlice::advance_slices(&mut bufs, 0);
        while !bufs.is_empty() {
            match w.write_vectored(bufs).await {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Splits the bincode of a message whose byte field (`data`) was serialized empty: the field is an
/// 8-byte length followed by the bytes, and `tail_len` bytes of later fields follow it.
fn split<'a>(body: Vec<u8>, tail_len: usize, data: &'a [u8], max_frame: usize) -> Result<Gathered<'a>> {
    let at = body.len() - tail_len - 8;
    let total = body.len() + data.len();
    if total > max_frame {
        return Err(DistError::Protocol(format!("frame of {total} bytes exceeds the limit {max_frame}")));
    }
    let frame_len = u32::try_from(total).map_err(|_| DistError::Protocol(format!("frame of {total} bytes is too large")))?;
    let mut head = Vec::with_capacity(4 + at + 8);
    // LengthDelimitedCodec's default: a 4-byte big-endian length.
    head.extend_from_slice(&frame_len.to_be_bytes());
    head.extend_from_slice(&body[..at]);
    head.extend_from_slice(&(data.len() as u64).to_le_bytes());
    Ok(Gathered { head, data, tail: body[at + 8..].to_vec() })
}

/// A `Forward` frame with its activations borrowed.
pub fn forward_frame<'a>(req: &ForwardRef<'a>, max_frame: usize) -> Result<Gathered<'a>> {
    let empty = ForwardRef { activations: &[], ..*req };
    let body = protocol::encode_forward(&empty)?.to_vec();
    let tail_len = bincode_len(&req.want)?;
    split(body, tail_len, req.activations, max_frame)
}

/// Any message as a frame (replies, heartbeats, resets); a `Result`'s `Hidden` bytes are borrowed.
pub fn msg_frame(m: &Msg, max_frame: usize) -> Result<Gathered<'_>> {
    if let Msg::Result(ForwardRes { request, eval_us, hash_after, payload: Payload::Hidden { bits, data } }) = m {
        let empty = Msg::Result(ForwardRes { request: *request, eval_us: *eval_us, hash_after: *hash_after, payload: Payload::Hidden { bits: *bits, data: Bytes::new() } });
        let body = protocol::encode_ref(&empty)?.to_vec();
        return split(body, 0, data, max_frame);
    }
    let body = protocol::encode_ref(m)?;
    if body.len() > max_frame {
        return Err(DistError::Protocol(format!("frame of {} bytes exceeds the limit {max_frame}", body.len())));
    }
    let mut head = Vec::with_capacity(4 + body.len());
    head.extend_from_slice(&(body.len() as u32).to_be_bytes());
    head.extend_from_slice(&body);
    Ok(Gathered { head, data: &[], tail: Vec::new() })
}

fn bincode_len<T: serde::Serialize>(v: &T) -> Result<usize> {
    use bincode::Options;
    opts().serialized_size(v).map(|n| n as usize).map_err(|e| DistError::Protocol(format!("encode: {e}")))
}

/// `ForwardReq` with the activations borrowed from the frame (same fields, same order).
#[derive(Deserialize)]
struct ForwardIn<'a> {
    request: u64,
    session: u64,
    pos: u64,
    prefix_hash: u64,
    tokens: Vec<u32>,
    bits: u8,
    #[serde(borrow)]
    activations: &'a [u8],
    want: Want,
}

/// `ForwardRes` with a `Hidden` payload borrowed from the frame.
#[derive(Deserialize)]
struct ResultIn<'a> {
    request: u64,
    eval_us: u64,
    hash_after: u64,
    #[serde(borrow)]
    payload: PayloadIn<'a>,
}

#[derive(Deserialize)]
enum PayloadIn<'a> {
    Ack,
    Hidden {
        bits: u8,
        #[serde(borrow)]
        data: &'a [u8],
    },
    Logits(Vec<f32>),
    Token { id: u32, logprob: f32, top: Vec<(u32, f32)> },
}

/// A forward request whose activations are a slice of the frame it came in.
pub struct ForwardView<'a> {
    pub request: u64,
    pub session: u64,
    pub pos: u64,
    pub prefix_hash: u64,
    pub tokens: Vec<u32>,
    pub bits: u8,
    pub activations: &'a [u8],
    pub want: Want,
}

/// A frame decoded with its activations borrowed.
pub enum Incoming<'a> {
    Forward(ForwardView<'a>),
    /// A result (its `Hidden` bytes are `Bytes` slices of the frame when it was a `Bytes`).
    Result(ForwardRes),
    Other(Msg),
}

fn variant(frame: &[u8]) -> Result<Option<u32>> {
    if frame.len() < 2 {
        return Err(DistError::Protocol(format!("frame of {} bytes is too short", frame.len())));
    }
    let version = u16::from_le_bytes([frame[0], frame[1]]);
    if version != PROTOCOL_VERSION {
        return Err(DistError::Protocol(format!("peer speaks protocol version {version}, this build speaks {PROTOCOL_VERSION}")));
    }
    Ok((frame.len() >= 6).then(|| u32::from_le_bytes([frame[2], frame[3], frame[4], frame[5]])))
}

fn malformed(frame: &[u8], e: bincode::Error) -> DistError { DistError::Protocol(format!("malformed frame ({} bytes): {e}", frame.len())) }

fn result_in(frame: &[u8], own: impl Fn(&[u8]) -> Bytes) -> Result<ForwardRes> {
    use bincode::Options;
    let r: ResultIn = opts().with_limit(frame.len() as u64).deserialize(&frame[6..]).map_err(|e| malformed(frame, e))?;
    let payload = match r.payload {
        PayloadIn::Ack => Payload::Ack,
        PayloadIn::Hidden { bits, data } => Payload::Hidden { bits, data: own(data) },
        PayloadIn::Logits(l) => Payload::Logits(l),
        PayloadIn::Token { id, logprob, top } => Payload::Token { id, logprob, top },
    };
    Ok(ForwardRes { request: r.request, eval_us: r.eval_us, hash_after: r.hash_after, payload })
}

/// Decodes a frame body; a `Forward`'s activations borrow from it. Same checks as
/// [`protocol::decode`] (version, size limit = frame length, no trailing bytes).
pub fn decode_data(frame: &[u8]) -> Result<Incoming<'_>> {
    use bincode::Options;
    match variant(frame)? {
        Some(FORWARD) => {
            let f: ForwardIn = opts().with_limit(frame.len() as u64).deserialize(&frame[6..]).map_err(|e| malformed(frame, e))?;
            Ok(Incoming::Forward(ForwardView {
                request: f.request,
                session: f.session,
                pos: f.pos,
                prefix_hash: f.prefix_hash,
                tokens: f.tokens,
                bits: f.bits,
                activations: f.activations,
                want: f.want,
            }))
        }
        Some(RESULT) => Ok(Incoming::Result(result_in(frame, Bytes::copy_from_slice)?)),
        _ => Ok(Incoming::Other(protocol::decode(frame)?)),
    }
}

/// [`decode_data`] of a received `Bytes` frame: a `Hidden` result's data is a slice of it (no copy).
pub fn decode_shared(frame: &Bytes) -> Result<Msg> {
    match variant(frame)? {
        Some(RESULT) => Ok(Msg::Result(result_in(frame, |d| frame.slice_ref(d))?)),
        Some(FORWARD) => {
            use bincode::Options;
            let f: ForwardIn = opts().with_limit(frame.len() as u64).deserialize(&frame[6..]).map_err(|e| malformed(frame, e))?;
            let activations = frame.slice_ref(f.activations);
            Ok(Msg::Forward(ForwardReq { request: f.request, session: f.session, pos: f.pos, prefix_hash: f.prefix_hash, tokens: f.tokens, bits: f.bits, activations, want: f.want }))
        }
        _ => protocol::decode(frame),
    }
}

/// Reads length-delimited frames from a blocking socket into one reused buffer. A read that times
/// out (the socket's read timeout) keeps what it has; the caller looks at its clocks and calls again.
pub struct FrameReader {
    /// u32 words: 4-byte aligned; the body starts at byte [`BODY_AT`].
    buf: Vec<u32>,
    hdr: [u8; 4],
    hdr_got: usize,
    body_len: Option<usize>,
    got: usize,
    /// Bytes read past the handshake by its frame codec, consumed first.
    pending: Vec<u8>,
    pending_at: usize,
    max_frame: usize,
}

/// Where a frame body starts in the reader's buffer: a `Forward`'s activations start at body offset
/// 55 + 4 * tokens (version 2, variant 4, four u64, the tokens' u64 length and u32s, bits 1, the
/// activations' u64 length), so at byte 1 of a 4-byte aligned buffer they are 4-byte aligned and
/// 32-bit ones are used as f32 in place ([`crate::codec::as_f32`]).
pub const BODY_AT: usize = 1;

/// The first size a frame buffer grows to when a body does not fit (then it doubles).
const FIRST_GROW: usize = 64 * 1024;

/// What one [`FrameReader::read`] did.
pub enum ReadStep {
    /// A whole frame is in [`FrameReader::frame`].
    Frame,
    /// Some bytes came, not a whole frame yet.
    Partial,
    /// The peer closed the connection.
    Closed,
}

impl FrameReader {
    pub fn new(max_frame: usize, pending: &[u8]) -> Self {
        Self { buf: Vec::new(), hdr: [0; 4], hdr_got: 0, body_len: None, got: 0, pending: pending.to_vec(), pending_at: 0, max_frame }
    }

    /// The frame completed by the last read (valid until the next read).
    pub fn frame(&self) -> &[u8] { &bytemuck::cast_slice::<u32, u8>(&self.buf)[BODY_AT..BODY_AT + self.body_len.unwrap_or(0)] }

    /// Grows the buffer, written once, to hold frames of `len` bytes (a full prefill chunk's): the first
    /// such frame then lands in memory already mapped.
    pub fn reserve(&mut self, len: usize) {
        let words = (BODY_AT + len.min(self.max_frame)).div_ceil(4);
        if self.buf.len() < words {
            self.buf.resize(words, 0);
        }
    }

    /// Capacity of the reused buffer in bytes (tests: it does not grow per frame).
    pub fn capacity(&self) -> usize { self.buf.capacity() * 4 }

    /// Where the next bytes go: the length prefix, or the body up to the end of the buffer (which
    /// [`Self::grow`] keeps ahead of what was received, up to the frame's length).
    fn dest(&mut self) -> &mut [u8] {
        match self.body_len {
            None => &mut self.hdr[self.hdr_got..],
            Some(n) => {
                let end = (BODY_AT + n).min(self.buf.len() * 4);
                &mut bytemuck::cast_slice_mut::<u32, u8>(&mut self.buf)[BODY_AT + self.got..end]
            }
        }
    }

    /// Grows the buffer when the body received so far fills it: doubling, from [`FIRST_GROW`], to at
    /// most the frame's length. Memory follows the bytes that arrived, not the length a peer claims
    /// (a length prefix of 1 GiB followed by silence or a close allocated 1 GiB at once).
    fn grow(&mut self) {
        if let Some(n) = self.body_len {
            let have = self.buf.len() * 4;
            if self.got < n && BODY_AT + self.got >= have {
                let target = (BODY_AT + n).min((have * 2).max(FIRST_GROW));
                self.buf.resize(target.div_ceil(4), 0);
            }
        }
    }

    /// Reads once (from the handshake's leftover bytes first); errors are the socket's (timeouts
    /// included) or a frame above the limit.
    pub fn read(&mut self, src: &mut impl Read) -> std::io::Result<ReadStep> {
        if self.body_len.is_some_and(|n| self.got == n) {
            // The previous frame was handed out: start the next one.
            self.body_len = None;
            self.hdr_got = 0;
            self.got = 0;
        }
        self.grow();
        let n = if self.pending_at < self.pending.len() {
            let d = self.dest_len().min(self.pending.len() - self.pending_at);
            let from = std::mem::take(&mut self.pending);
            let at = self.pending_at;
            self.dest()[..d].copy_from_slice(&from[at..at + d]);
            self.pending = from;
            self.pending_at += d;
            d
        } else {
            let n = src.read(self.dest())?;
            if n == 0 {
                return Ok(ReadStep::Closed);
            }
            n
        };
        match self.body_len {
            None => {
                self.hdr_got += n;
                if self.hdr_got == 4 {
                    let len = u32::from_be_bytes(self.hdr) as usize;
                    if len > self.max_frame {
                        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("frame of {len} bytes exceeds the limit {}", self.max_frame)));
                    }
                    // The buffer grows as the body arrives ([`Self::grow`]) to the largest frame
                    // seen; it never shrinks.
                    self.body_len = Some(len);
                    if len == 0 {
                        return Ok(ReadStep::Frame);
                    }
                }
                Ok(ReadStep::Partial)
            }
            Some(len) => {
                self.got += n;
                Ok(if self.got == len { ReadStep::Frame } else { ReadStep::Partial })
            }
        }
    }

    fn dest_len(&self) -> usize {
        match self.body_len {
            None => 4 - self.hdr_got,
            Some(n) => (BODY_AT + n).min(self.buf.len() * 4) - BODY_AT - self.got,
        }
    }
}

/// Encoded-activation buffers kept for reuse: as many as were in flight at once (a pipelined
/// prefill's window), at most `POOL_MAX` of them and `POOL_MAX_BYTES` in all, so the memory kept is
/// what the peak needed anyway (Flash, 4096-token chunks, window 3: 768 MiB).
static POOL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
const POOL_MAX: usize = 8;
const POOL_MAX_BYTES: usize = 1 << 30;

/// A vector to be overwritten (its length and contents are a previous frame's when one was given
/// back: [`crate::codec::encode`] resizes and overwrites every byte, so nothing is zeroed again).
pub fn take_buf() -> Vec<u8> { POOL.lock().map(|mut p| p.pop()).ok().flatten().unwrap_or_default() }

/// Puts a buffer of `bytes` bytes, every page written once, into the pool (a stage's first full
/// chunk then encodes into memory already mapped).
pub fn warm_pool(bytes: usize) {
    let v = vec![1u8; bytes];
    give_back(Bytes::from(v));
}

/// Returns the activations of a frame that was sent (or consumed) to the pool, when nothing else
/// holds them.
pub fn give_back(b: Bytes) {
    if b.len() < 4096 {
        return;
    }
    if let Ok(m) = b.try_into_mut() {
        let v: Vec<u8> = m.into();
        if let Ok(mut p) = POOL.lock() {
            let held: usize = p.iter().map(|b| b.capacity()).sum();
            if p.len() < POOL_MAX && held + v.capacity() <= POOL_MAX_BYTES {
                p.push(v);
            }
        }
    }
}

/// Serde for `Bytes` fields: the same encoding as `serde_bytes` of a `Vec<u8>`.
pub mod bytes_serde {
    use bytes::Bytes;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &Bytes, s: S) -> Result<S::Ok, S::Error> { s.serialize_bytes(b) }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        let v: serde_bytes::ByteBuf = serde::Deserialize::deserialize(d)?;
        Ok(Bytes::from(v.into_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(acts: Vec<u8>, want: Want) -> ForwardReq {
        ForwardReq { request: 7, session: 3, pos: 11, prefix_hash: 0xdead_beef, tokens: vec![5, 6, 7], bits: 16, activations: Bytes::from(acts), want }
    }

    #[test]
    fn gathered_frames_are_the_codec_frames_and_decode_borrowed() {
        for want in [Want::Hidden, Want::Ack, Want::LastLogits, Want::Greedy { top_logprobs: 3 }] {
            for n in [0usize, 1, 1000] {
                let r = req((0..n).map(|i| (i * 7) as u8).collect(), want);
                let m = Msg::Forward(r.clone());
                let body = protocol::encode(&m).unwrap();
                let g = forward_frame(&r.as_ref(), 1 << 20).unwrap();
                let v = g.to_vec();
                assert_eq!(u32::from_be_bytes(v[..4].try_into().unwrap()) as usize, body.len());
                assert_eq!(&v[4..], &body[..], "want {want:?} n {n}");
                let Incoming::Forward(f) = decode_data(&body).unwrap() else { panic!() };
                assert_eq!((f.request, f.session, f.pos, f.prefix_hash, &f.tokens[..], f.bits, f.want), (7, 3, 11, 0xdead_beef, &[5u32, 6, 7][..], 16, want));
                assert_eq!(f.activations, &r.activations[..]);
                // Borrowed: the slice lies inside the frame.
                let range = body.as_ptr_range();
                assert!(n == 0 || range.contains(&f.activations.as_ptr()));
                assert_eq!(decode_shared(&body).unwrap(), m);
            }
        }
        let res = Msg::Result(ForwardRes { request: 9, eval_us: 5, hash_after: 1, payload: Payload::Hidden { bits: 32, data: Bytes::from(vec![1u8; 300]) } });
        let body = protocol::encode(&res).unwrap();
        let g = msg_frame(&res, 1 << 20).unwrap();
        assert_eq!(&g.to_vec()[4..], &body[..]);
        let Msg::Result(r) = decode_shared(&body).unwrap() else { panic!() };
        let Payload::Hidden { data, .. } = &r.payload else { panic!() };
        assert!(body.as_ptr_range().contains(&data.as_ptr()), "hidden bytes are a slice of the frame");
        for m in [Msg::Result(ForwardRes { request: 1, eval_us: 2, hash_after: 3, payload: Payload::Logits(vec![1.0, 2.0]) }), Msg::Heartbeat { seq: 4, busy: None }] {
            let body = protocol::encode(&m).unwrap();
            assert_eq!(&msg_frame(&m, 1 << 20).unwrap().to_vec()[4..], &body[..]);
            assert_eq!(decode_shared(&body).unwrap(), m);
        }
        // Over the limit: refused before anything is written.
        assert!(forward_frame(&req(vec![0; 100], Want::Hidden).as_ref(), 64).is_err());
    }

    #[test]
    fn hostile_data_frames_are_errors() {
        let body = protocol::encode(&Msg::Forward(req(vec![1; 64], Want::Hidden))).unwrap();
        for n in 0..body.len() {
            assert!(decode_data(&body[..n]).is_err(), "truncated at {n}");
            assert!(decode_shared(&body.slice(..n)).is_err());
        }
        let mut v = body.to_vec();
        v.push(0);
        assert!(decode_data(&v).is_err(), "trailing byte");
        // An activations length far beyond the frame.
        let mut v = body.to_vec();
        let at = 2 + 4 + 32 + 8 + 12 + 1;
        v[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode_data(&v).is_err());
    }

    #[test]
    fn frame_reader_reuses_its_buffer_and_keeps_partial_reads() {
        let frames: Vec<Vec<u8>> = (0..5).map(|i| protocol::encode(&Msg::Forward(req(vec![i as u8; 5000 - i * 100], Want::Hidden))).unwrap().to_vec()).collect();
        let mut wire = Vec::new();
        for f in &frames {
            wire.extend_from_slice(&(f.len() as u32).to_be_bytes());
            wire.extend_from_slice(f);
        }
        // The first 10 bytes arrive as handshake leftovers; the rest in reads of at most 777 bytes.
        struct Trickle<'a>(&'a [u8]);
        impl Read for Trickle<'_> {
            fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
                let n = b.len().min(777).min(self.0.len());
                b[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut r = FrameReader::new(1 << 20, &wire[..10]);
        let mut src = Trickle(&wire[10..]);
        let mut got = Vec::new();
        let mut cap = 0;
        loop {
            match r.read(&mut src).unwrap() {
                ReadStep::Frame => {
                    got.push(r.frame().to_vec());
                    cap = cap.max(r.capacity());
                }
                ReadStep::Partial => {}
                ReadStep::Closed => break,
            }
        }
        assert_eq!(got, frames);
        // Each frame's 32-bit-sized activations were 4-byte aligned in the reader's buffer.
        let mut r2 = FrameReader::new(1 << 20, &[]);
        let one = protocol::encode(&Msg::Forward(ForwardReq { tokens: vec![1; 3], bits: 32, ..req(vec![7; 400], Want::Hidden) })).unwrap();
        let mut w2 = (one.len() as u32).to_be_bytes().to_vec();
        w2.extend_from_slice(&one);
        let mut src2 = Trickle(&w2);
        while !matches!(r2.read(&mut src2).unwrap(), ReadStep::Frame) {}
        let Incoming::Forward(f) = decode_data(r2.frame()).unwrap() else { panic!() };
        assert_eq!(f.activations.as_ptr() as usize % 4, 0);
        assert!(crate::codec::as_f32(f.activations, 100, 32).is_some());
        assert_eq!(r.capacity(), cap);
        assert!(cap < 2 * frames[0].len(), "one buffer of the largest frame");
        // Reserved up front for the largest frame: reading the frames then grows nothing.
        let mut pre = FrameReader::new(1 << 20, &wire[..10]);
        pre.reserve(frames[0].len());
        let reserved = pre.capacity();
        assert!(reserved >= frames[0].len());
        let mut src3 = Trickle(&wire[10..]);
        let mut n = 0;
        loop {
            match pre.read(&mut src3).unwrap() {
                ReadStep::Frame => n += 1,
                ReadStep::Partial => {}
                ReadStep::Closed => break,
            }
        }
        assert_eq!(n, frames.len());
        assert_eq!(pre.capacity(), reserved);
        // A length prefix claiming the whole limit, then a few bytes and a close: the buffer follows
        // what arrived, not the claim.
        let mut big = FrameReader::new(1 << 30, &[]);
        let mut claim = (1u32 << 30).to_be_bytes().to_vec();
        claim.extend_from_slice(&[7u8; 100]);
        let mut src4 = Trickle(&claim);
        loop {
            match big.read(&mut src4).unwrap() {
                ReadStep::Partial => {}
                ReadStep::Closed => break,
                ReadStep::Frame => panic!("no whole frame was sent"),
            }
        }
        assert!(big.capacity() <= 2 * FIRST_GROW, "a claimed 1 GiB frame allocated {} bytes", big.capacity());
        // A frame larger than the first growth still arrives whole, across reads and growths.
        let large = protocol::encode(&Msg::Forward(req(vec![3u8; 5 * FIRST_GROW + 17], Want::Hidden))).unwrap().to_vec();
        let mut w5 = (large.len() as u32).to_be_bytes().to_vec();
        w5.extend_from_slice(&large);
        let mut grown = FrameReader::new(1 << 30, &w5[..3]);
        let mut src5 = Trickle(&w5[3..]);
        while !matches!(grown.read(&mut src5).unwrap(), ReadStep::Frame) {}
        assert_eq!(grown.frame(), &large[..]);
        let mut small = FrameReader::new(100, &[]);
        // Refused at its length prefix, before anything is allocated for it.
        assert!(small.read(&mut Trickle(&wire)).is_err(), "over the limit");
        assert_eq!(small.capacity(), 0);
    }

    #[test]
    fn pool_returns_unshared_buffers() {
        let mut v = take_buf();
        v.resize(1 << 16, 1);
        let b = Bytes::from(v);
        let other = b.clone();
        give_back(b);
        drop(other);
        let v = vec![0u8; 1 << 16];
        let p = v.as_ptr();
        give_back(Bytes::from(v));
        let again = take_buf();
        assert!(again.capacity() >= 1 << 16);
        let _ = p;
    }
}
