//! A real `ds4-server` process on 127.0.0.1 (the embedded tiny model) and raw-socket HTTP helpers.
#![allow(dead_code)]
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_ds4-server");

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub struct Server {
    pub child: Child,
    pub port: u16,
    pub log: std::path::PathBuf,
}

impl Server {
    /// Starts the server; with `wait` returns once /health answers 200.
    pub fn start(args: &[&str], wait: bool) -> Server {
        // Tests run in parallel: a port found free can be taken by another test's server before this
        // one binds it. Such a start is retried on a new port.
        for _ in 0..4 {
            let mut s = Self::spawn(args);
            if !wait || s.ready_or_bind_failure() {
                return s;
            }
        }
        panic!("ds4-server could not bind a free port in 4 tries");
    }

    /// Waits for /health; false when the server exited because its port was taken.
    fn ready_or_bind_failure(&mut self) -> bool {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                let log = self.log_text();
                if log.contains("cannot listen on") {
                    return false;
                }
                panic!("ds4-server exited with {st}: {log}");
            }
            if let Ok((200, _)) = try_request(self.port, "GET", "/health", b"", &[]) {
                return true;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "server not ready: {}", self.log_text());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn spawn(args: &[&str]) -> Server {
        static STARTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let port = free_port();
        let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = std::env::temp_dir().join(format!("ds4-server-test-{}-{port}-{n}.log", std::process::id()));
        let f = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.args(["--host", "127.0.0.1", "--port", &port.to_string(), "--threads", "1"]);
        if !args.contains(&"--ctx") {
            cmd.args(["--ctx", "4096"]);
        }
        let child = cmd
            .args(args)
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .expect("start ds4-server");
        Server { child, port, log }
    }

    pub fn wait_ready(&mut self) {
        assert!(self.ready_or_bind_failure(), "ds4-server could not bind port {}: {}", self.port, self.log_text());
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// One request on a fresh connection; returns (status, body).
pub fn try_request(port: u16, method: &str, path: &str, body: &[u8], headers: &[(&str, &str)]) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\ncontent-length: {}\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    read_response(&mut s)
}

/// Reads a whole `connection: close` response.
pub fn read_response(s: &mut TcpStream) -> std::io::Result<(u16, String)> {
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    parse_response(&buf)
}

pub fn parse_response(buf: &[u8]) -> std::io::Result<(u16, String)> {
    let text = String::from_utf8_lossy(buf).to_string();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| std::io::Error::other(format!("no status line in {text:?}")))?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((status, body))
}

pub fn request(port: u16, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    try_request(port, method, path, body, &[("content-type", "application/json")]).expect("request")
}

/// A `/proc/PID/status` field in KiB.
pub fn proc_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{field} not in /proc/{pid}/status"))
}

pub fn exists(p: &Path) -> bool {
    p.exists()
}
