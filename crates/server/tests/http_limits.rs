//! HTTP hardening of the real binary: declared sizes, slow clients, stalled connections, huge prompts,
//! startup checks before loading, and 503 while the model loads.
mod common;

use common::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

fn chat_body(content: &str) -> Vec<u8> {
    let c = content.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
    format!(r#"{{"messages":[{{"role":"user","content":"{c}"}}],"max_tokens":2,"temperature":0}}"#).into_bytes()
}

/// Sends only the head of a POST declaring `len` body bytes; returns the status and how long it took.
fn declared_only(port: u16, len: &str) -> (u16, String, Duration) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t0 = Instant::now();
    let head = format!("POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let (st, body) = read_response(&mut s).unwrap();
    (st, body, t0.elapsed())
}

#[test]
fn declared_content_length_over_the_limit_is_413_before_the_body() {
    let srv = Server::start(&[], true);
    for len in ["1000000000000", &((64u64 << 20) + 1).to_string()] {
        let (st, body, took) = declared_only(srv.port, len);
        assert_eq!(st, 413, "{body}");
        assert!(took < Duration::from_secs(1), "{took:?}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(v["error"]["message"].as_str().unwrap().contains("--max-body-bytes"), "{body}");
    }
    // A configured smaller limit, and the Anthropic error shape on /v1/messages.
    let srv = Server::start(&["--max-body-bytes", "4096"], true);
    let (st, body) = request(srv.port, "POST", "/v1/messages", &vec![b' '; 5000]);
    assert_eq!(st, 413, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "request_too_large");
    // A client that writes its whole (oversized) body before reading still gets the answer: the server
    // drains what it sends after the 413 instead of resetting the connection.
    let srv = Server::start(&["--max-body-bytes", "1048576"], true);
    for _ in 0..3 {
        let (st, body) = request(srv.port, "POST", "/v1/chat/completions", &vec![b' '; 8 << 20]);
        assert_eq!(st, 413, "{body}");
    }
}

#[test]
fn a_body_not_sent_in_time_is_408() {
    let srv = Server::start(&["--body-timeout-secs", "1"], true);
    let mut s = TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t0 = Instant::now();
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"messages\"").unwrap();
    let (st, body) = read_response(&mut s).unwrap();
    let took = t0.elapsed();
    assert_eq!(st, 408, "{body}");
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(4), "{took:?}");
}

#[test]
fn unfinished_headers_are_dropped_after_the_header_timeout() {
    let srv = Server::start(&["--header-timeout-secs", "1"], true);
    let mut s = TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t0 = Instant::now();
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-le").unwrap();
    let mut buf = [0u8; 64];
    // The server closes the connection: end of stream (or a reset) well before the read timeout.
    let r = s.read(&mut buf);
    assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(4), "{took:?}");
    // The server still answers.
    assert_eq!(request(srv.port, "GET", "/health", b"").0, 200);
}

#[test]
fn stalled_connections_do_not_lock_out_health_or_chat() {
    let srv = Server::start(&["--max-connections", "64"], true);
    // Five times the cap: half open with nothing sent, half with part of a request head.
    let mut stalled = Vec::new();
    for i in 0..320 {
        let mut s = TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
        if i % 2 == 1 {
            s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost:").unwrap();
        }
        stalled.push(s);
    }
    let t0 = Instant::now();
    let (st, body) = request(srv.port, "GET", "/health", b"");
    assert_eq!(st, 200, "{body}");
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    let (st, body) = request(srv.port, "POST", "/v1/chat/completions", &chat_body("Hello"));
    assert_eq!(st, 200, "{body}");
    let (_, m) = request(srv.port, "GET", "/metrics", b"");
    let metric = |name: &str| -> f64 {
        m.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok())).unwrap_or_else(|| panic!("{name} in {m}"))
    };
    assert!(metric("ds4_http_connections_open ") <= 64.0);
    assert!(metric("ds4_http_connections_evicted_total ") >= 256.0);
    drop(stalled);
}

/// RSS growth (VmHWM after the request minus VmRSS before, peak reset through clear_refs).
#[test]
fn a_50_mb_prompt_is_refused_fast_with_bounded_memory() {
    let srv = Server::start(&[], true);
    let pid = srv.pid();
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
    let before = proc_kib(pid, "VmRSS:");
    let words = "lorem ipsum dolor sit amet, consectetur adipiscing elit\n";
    let text = words.repeat(50_000_000 / words.len() + 1);
    let body = chat_body(&text[..50_000_000]);
    let t0 = Instant::now();
    let (st, resp) = request(srv.port, "POST", "/v1/chat/completions", &body);
    let took = t0.elapsed();
    let peak = proc_kib(pid, "VmHWM:");
    assert_eq!(st, 400, "{}", &resp[..resp.len().min(300)]);
    assert!(resp.contains("context_length_exceeded"), "{resp}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    let growth_mb = peak.saturating_sub(before) / 1024;
    eprintln!("50 MB prompt: {took:?}, RSS {} MB -> peak {} MB (+{growth_mb} MB)", before / 1024, peak / 1024);
    assert!(growth_mb < 500, "RSS grew by {growth_mb} MB");
}

/// A prompt just over the context, of many short tokens: its byte length alone does not prove it too
/// long, so it is tokenized (in pieces) and refused with the count.
#[test]
fn a_prompt_over_the_context_is_refused_after_bounded_tokenizing() {
    let srv = Server::start(&["--ctx", "256"], true);
    let (st, body) = request(srv.port, "POST", "/v1/chat/completions", &chat_body(&"a b ".repeat(300)));
    assert_eq!(st, 400, "{body}");
    assert!(body.contains("context_length_exceeded"), "{body}");
    let (st, body) = request(srv.port, "POST", "/v1/chat/completions", &chat_body("a b c"));
    assert_eq!(st, 200, "{body}");
}

fn exits_fast(args: &[&str]) -> (i32, String, Duration) {
    let t0 = Instant::now();
    let out = Command::new(BIN).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).to_string(), t0.elapsed())
}

#[test]
fn a_taken_port_fails_before_loading() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let (code, err, took) = exits_fast(&["--port", &port]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cannot listen") && err.contains("--port"), "{err}");
    // Refused before the memory plan is even printed (that comes with loading).
    assert!(!err.contains("memory:"), "{err}");
    assert!(took < Duration::from_secs(3), "{took:?}");
}

#[test]
fn a_bad_kv_disk_dir_fails_before_loading() {
    let dir = std::env::temp_dir().join(format!("ds4-bad-kv-{}", std::process::id()));
    std::fs::write(&dir, b"a file, not a directory").unwrap();
    let port = free_port().to_string();
    for bad in [dir.clone(), dir.join("below")] {
        let (code, err, took) = exits_fast(&["--port", &port, "--kv-disk-dir", bad.to_str().unwrap()]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("--kv-disk-dir"), "{err}");
        assert!(!err.contains("memory:"), "{err}");
        assert!(took < Duration::from_secs(3), "{took:?}");
    }
    let _ = std::fs::remove_file(&dir);
}

/// A model file that is a FIFO blocks the loader in `open` until a writer appears: the server is up and
/// says it is loading; then the writer closes at once, the load fails and the server exits non-zero.
#[cfg(unix)]
#[test]
fn health_is_503_while_loading_and_a_failed_load_exits() {
    let fifo = std::env::temp_dir().join(format!("ds4-fifo-{}.gguf", std::process::id()));
    let _ = std::fs::remove_file(&fifo);
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let mut srv = Server::start(&["-m", fifo.to_str().unwrap()], false);
    let t0 = Instant::now();
    let (st, body) = loop {
        if let Ok(r) = try_request(srv.port, "GET", "/health", b"", &[]) {
            break r;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{}", srv.log_text());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(st, 503, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "loading");
    assert!(v["reason"].as_str().unwrap().contains("loading"), "{body}");
    let (st, body) = request(srv.port, "POST", "/v1/chat/completions", &chat_body("Hi"));
    assert_eq!(st, 503, "{body}");
    assert!(body.contains("model_loading"), "{body}");
    assert_eq!(request(srv.port, "GET", "/v1/models", b"").0, 503);
    // Unblock the loader with an empty file: the load fails and the process exits with 1.
    drop(std::fs::OpenOptions::new().write(true).open(&fifo).unwrap());
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = srv.child.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "still running: {}", srv.log_text());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(st.code(), Some(1), "{}", srv.log_text());
    let _ = std::fs::remove_file(&fifo);
}

#[test]
fn options_is_204_without_cors() {
    let srv = Server::start(&[], true);
    for path in ["/v1/chat/completions", "/v1/messages", "/v1/models"] {
        assert_eq!(request(srv.port, "OPTIONS", path, b"").0, 204, "{path}");
    }
}

/// Tiny JSON values cost far more parsed than written (`0,` is two bytes): a body of millions of them is
/// refused before parsing.
#[test]
fn a_body_of_millions_of_tiny_values_is_refused_with_bounded_memory() {
    let srv = Server::start(&[], true);
    let pid = srv.pid();
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
    let before = proc_kib(pid, "VmRSS:");
    let mut body = br#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"x":["#.to_vec();
    for _ in 0..30_000_000 {
        body.extend_from_slice(b"0,");
    }
    body.extend_from_slice(b"0]}");
    let (st, resp) = request(srv.port, "POST", "/v1/chat/completions", &body);
    let peak = proc_kib(pid, "VmHWM:");
    assert_eq!(st, 413, "{resp}");
    let growth_mb = peak.saturating_sub(before) / 1024;
    eprintln!("60 MB of tiny JSON values: RSS +{growth_mb} MB");
    assert!(growth_mb < 200, "RSS grew by {growth_mb} MB");
}

/// A metric of `/metrics` (0 when absent).
fn metric(port: u16, name: &str) -> f64 {
    let (_, m) = request(port, "GET", "/metrics", b"");
    m.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok())).unwrap_or(0.0)
}

/// A client that sends a streaming request and then never reads: once the socket buffers are full and
/// a write has waited `--send-timeout-secs`, the connection is closed and the generation stopped
/// (before: the worker generated every token for nobody and the connection stayed busy for ever, so
/// such clients could take every connection slot).
#[test]
fn a_client_that_stops_reading_is_dropped_and_its_generation_stopped() {
    let dir = std::env::temp_dir().join(format!("ds4-stall-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("script.json");
    let long = "tick tock ".repeat(6000);
    std::fs::write(&script, format!(r#"[{{"when":"[[huge]]","output":"{long}"}}]"#)).unwrap();
    let srv = Server::start(&["--ctx", "16384", "--send-timeout-secs", "1", "--test-script", script.to_str().unwrap()], true);
    let body = br#"{"messages":[{"role":"user","content":"[[huge]]"}],"max_tokens":12000,"stream":true,"reasoning_effort":"none","logprobs":true,"top_logprobs":20}"#;
    let mut s = TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    let head = format!("POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len());
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    // Never read `s`. Its generation would take well over a minute to finish.
    let t0 = Instant::now();
    while metric(srv.port, "ds4_jobs_cancelled_total") < 1.0 {
        assert_eq!(metric(srv.port, "ds4_jobs_completed_total"), 0.0, "the generation ran to its end for a client that does not read");
        assert!(t0.elapsed() < Duration::from_secs(60), "the stalled client was not dropped: {}", srv.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(metric(srv.port, "ds4_generated_tokens_total") < 12000.0);
    // Its connection is gone: only the one asking for the metrics is open.
    assert_eq!(metric(srv.port, "ds4_http_connections_open"), 1.0);
    assert!(srv.log_text().contains("finish=cancelled"), "{}", srv.log_text());
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
