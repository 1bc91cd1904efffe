//! `ds4-dist-hop-bench`: the transport of one hop with prefill-sized activations, on loopback TCP,
//! without a model: the coordinator side encodes a chunk's hidden states and sends a `Forward`; the
//! worker side receives it, decodes the activations to f32 (a stage's input), encodes as many back
//! (its output) and replies with a `Result`; the coordinator receives the reply. Two paths in the
//! same run, alternating:
//! - `copying`: the sequence of calls the hop used before `wire` (fresh buffers per frame:
//!   `protocol::encode_forward`, the frame codec's write buffer, 64 KiB reads appended to a growing
//!   buffer, `protocol::decode` into fresh vectors, a fresh encode buffer per reply);
//! - `zero-copy`: what the hop does now (`wire`: gathered writes, borrowed decode, the reused
//!   read buffer, pooled encode buffers).
//!
//! The compute is left out on purpose: what is measured is what a hop adds to a prefill chunk.
//! `ds4-dist-hop-bench --tokens 4096 --hc 16384` is Flash's 4096-token chunk (256 MiB at 32 bits).
use bytes::{Bytes, BytesMut};
use clap::Parser;
use ds4_dist::codec;
use ds4_dist::protocol::{self, ForwardReq, ForwardRes, Msg, Payload, Want};
use ds4_dist::wire::{self, FrameReader, Incoming, ReadStep};
use futures_util::{SinkExt, StreamExt};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;
use tokio_util::codec::{Decoder, Encoder, FramedRead};

#[derive(Parser, Debug, Clone)]
#[command(name = "ds4-dist-hop-bench", about = "one hop's transport with prefill-sized activations: copying vs zero-copy path")]
struct Args {
    /// Tokens per frame (a prefill micro-chunk).
    #[arg(long, default_value_t = 1024)]
    tokens: usize,
    /// Floats per token (hc_mult x n_embd; Flash: 4 x 4096).
    #[arg(long, default_value_t = 16384)]
    hc: usize,
    /// Row (n_embd) for the 16/8-bit block scales.
    #[arg(long, default_value_t = 4096)]
    row: usize,
    #[arg(long, default_value_t = 32)]
    bits: u8,
    /// Round trips per path (after one warm-up each).
    #[arg(long, default_value_t = 5)]
    reps: usize,
}

const MAX_FRAME: usize = 1 << 30;

fn hidden(n: usize) -> Vec<f32> { (0..n).map(|i| ((i % 1013) as f32 * 0.37).sin() * 3.0).collect() }

/// Worker side, old sequence: 64 KiB reads appended, codec decode, `protocol::decode`, fresh buffers.
fn worker_copying(mut s: TcpStream, a: &Args, frames: usize) {
    let mut codec = protocol::codec(MAX_FRAME);
    let mut rbuf = BytesMut::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut scratch = Vec::new();
    let out_f = hidden(a.tokens * a.hc);
    let mut done = 0;
    while done < frames {
        while let Some(f) = codec.decode(&mut rbuf).unwrap() {
            let Msg::Forward(req) = protocol::decode(&f).unwrap() else { panic!("expected Forward") };
            codec::decode(&req.activations, req.tokens.len() * a.hc, a.row, req.bits, &mut scratch).unwrap();
            let mut data = Vec::new();
            codec::encode(&out_f, a.row, a.bits, &mut data).unwrap();
            let reply = Msg::Result(ForwardRes { request: req.request, eval_us: 0, hash_after: 0, payload: Payload::Hidden { bits: a.bits, data: Bytes::from(data) } });
            let body = protocol::encode_ref(&reply).unwrap();
            let mut wb = BytesMut::new();
            codec.encode(body, &mut wb).unwrap();
            s.write_all(&wb).unwrap();
            done += 1;
        }
        if done == frames {
            break;
        }
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "closed");
        rbuf.extend_from_slice(&chunk[..n]);
    }
}

/// Worker side, `wire`: the reused frame buffer, borrowed decode, pooled encode buffer, gathered reply.
fn worker_zero_copy(mut s: TcpStream, a: &Args, frames: usize) {
    let mut reader = FrameReader::new(MAX_FRAME, &[]);
    let mut scratch = Vec::new();
    let out_f = hidden(a.tokens * a.hc);
    let mut done = 0;
    while done < frames {
        match reader.read(&mut s).unwrap() {
            ReadStep::Closed => panic!("closed"),
            ReadStep::Partial => {}
            ReadStep::Frame => {
                let Incoming::Forward(req) = wire::decode_data(reader.frame()).unwrap() else { panic!("expected Forward") };
                // As `LocalStage::run`: aligned 32-bit input is used in place, anything else decoded.
                let n = req.tokens.len() * a.hc;
                match codec::as_f32(req.activations, n, req.bits) {
                    Some(x) => {
                        std::hint::black_box(x);
                    }
                    None => codec::decode(req.activations, n, a.row, req.bits, &mut scratch).unwrap(),
                }
                let mut data = wire::take_buf();
                codec::encode(&out_f, a.row, a.bits, &mut data).unwrap();
                let reply = Msg::Result(ForwardRes { request: req.request, eval_us: 0, hash_after: 0, payload: Payload::Hidden { bits: a.bits, data: Bytes::from(data) } });
                wire::msg_frame(&reply, MAX_FRAME).unwrap().write_to(&mut s).unwrap();
                if let Msg::Result(ForwardRes { payload: Payload::Hidden { data, .. }, .. }) = reply {
                    wire::give_back(data);
                }
                done += 1;
            }
        }
    }
}

fn request(k: u64, a: &Args, data: Bytes) -> ForwardReq {
    ForwardReq { request: k, session: 1, pos: 0, prefix_hash: 0, tokens: vec![1; a.tokens], bits: a.bits, activations: data, want: Want::Hidden }
}

/// One path: a connected pair, `reps + 1` round trips; seconds of each timed one.
fn run(a: &Args, zero_copy: bool) -> Vec<f64> {
    let frames = a.reps + 1;
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let args = a.clone();
    let w = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        if zero_copy {
            worker_zero_copy(s, &args, frames)
        } else {
            worker_copying(s, &args, frames)
        }
    });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let x = hidden(a.tokens * a.hc);
    let times = rt.block_on(async {
        let sock = tokio::net::TcpStream::connect(addr).await.unwrap();
        sock.set_nodelay(true).unwrap();
        let mut times = Vec::new();
        if zero_copy {
            let (rh, mut wh) = sock.into_split();
            let mut rd = FramedRead::new(rh, protocol::codec(MAX_FRAME));
            for k in 0..frames {
                let t0 = Instant::now();
                let mut data = wire::take_buf();
                codec::encode(&x, a.row, a.bits, &mut data).unwrap();
                let req = request(k as u64, a, Bytes::from(data));
                wire::forward_frame(&req.as_ref(), MAX_FRAME).unwrap().write_async(&mut wh).await.unwrap();
                wire::give_back(req.activations);
                let f = rd.next().await.unwrap().unwrap().freeze();
                let Msg::Result(r) = wire::decode_shared(&f).unwrap() else { panic!("expected Result") };
                if let Payload::Hidden { data, .. } = r.payload {
                    // Relayed as it is to the next hop in a route; here just dropped.
                    drop(data);
                }
                drop(f);
                if k > 0 {
                    times.push(t0.elapsed().as_secs_f64());
                }
            }
        } else {
            let mut conn = protocol::framed(sock, MAX_FRAME);
            for k in 0..frames {
                let t0 = Instant::now();
                let mut data = Vec::new();
                codec::encode(&x, a.row, a.bits, &mut data).unwrap();
                let req = request(k as u64, a, Bytes::from(data));
                let frame = protocol::encode_forward(&req.as_ref()).unwrap();
                conn.send(frame).await.unwrap();
                let f = conn.next().await.unwrap().unwrap();
                let Msg::Result(_) = protocol::decode(&f).unwrap() else { panic!("expected Result") };
                if k > 0 {
                    times.push(t0.elapsed().as_secs_f64());
                }
            }
        }
        times
    });
    w.join().unwrap();
    times
}

fn main() {
    let a = Args::parse();
    if let Err(e) = codec::check_bits(a.bits) {
        eprintln!("ds4-dist-hop-bench: {e}");
        std::process::exit(2);
    }
    let mb = codec::encoded_len(a.tokens * a.hc, a.row, a.bits) as f64 / (1u64 << 20) as f64;
    println!("hop round trip: {} tokens x {} floats, {}-bit = {mb:.1} MiB each way, {} reps, {} rayon threads", a.tokens, a.hc, a.bits, a.reps, rayon::current_num_threads());
    let mut res = [Vec::new(), Vec::new()];
    // Alternate the paths so both see the same machine load.
    for _round in 0..2 {
        for (i, zc) in [false, true].into_iter().enumerate() {
            res[i].extend(run(&a, zc));
        }
    }
    let stat = |v: &[f64]| {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        (s[s.len() / 2], s[0])
    };
    let (cm, cb) = stat(&res[0]);
    let (zm, zb) = stat(&res[1]);
    for (name, m, b) in [("copying (before)", cm, cb), ("zero-copy (wire)", zm, zb)] {
        println!("{name:>17}: round trip median {:.3} ms, best {:.3} ms; {:.2} GiB/s of activations (both directions)", m * 1e3, b * 1e3, 2.0 * mb / 1024.0 / m);
    }
    println!("speedup (median): {:.2}x", cm / zm);
}
