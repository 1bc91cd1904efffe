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
        let port = free_port();
        let log = std::env::temp_dir().join(format!("ds4-server-test-{}-{port}.log", std::process::id()));
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
        let mut s = Server { child, port, log };
        if wait {
            s.wait_ready();
        }
        s
    }

    pub fn wait_ready(&mut self) {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                panic!("ds4-server exited with {st}: {}", self.log_text());
            }
            if let Ok((200, _)) = try_request(self.port, "GET", "/health", b"", &[]) {
                return;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "server not ready: {}", self.log_text());
            std::thread::sleep(Duration::from_millis(50));
        }
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
