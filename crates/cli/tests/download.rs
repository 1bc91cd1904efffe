//! `ds4-gguf download` against a local stand-in for the Hugging Face hub (`HF_ENDPOINT`): the hub's `resolve`
//! endpoint answers LFS files with a 302 to a second server (the CDN) carrying `X-Linked-Etag` (sha256),
//! `X-Linked-Size` and `X-Repo-Commit`; the CDN serves byte ranges. No traffic leaves 127.0.0.1.
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const REPO: &str = "antirez/deepseek-v4-gguf";
const Q2I: &str = "DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2-imatrix.gguf";
const Q4: &str = "DeepSeek-V4-Flash-Q4KExperts-F16HC-F16Compressor-F16Indexer-Q8Attn-Q8Shared-Q8Out-chat-v2.gguf";
const MTP: &str = "DeepSeek-V4-Flash-MTP-Q4K-Q8_0-F32.gguf";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

#[derive(Clone)]
struct HubEntry {
    name: &'static str,
    body: Vec<u8>,
    /// What the hub declares (X-Linked-Size / Content-Length); more than `body` makes a truncated file.
    declared_size: u64,
    /// What the hub declares as X-Linked-Etag.
    sha256: String,
    /// LFS files redirect to the CDN; others are served by the hub itself with a git (sha1) ETag.
    lfs: bool,
}

impl HubEntry {
    fn lfs(name: &'static str, body: Vec<u8>) -> Self {
        let sha256 = Sha256::digest(&body).iter().map(|b| format!("{b:02x}")).collect();
        HubEntry { name, declared_size: body.len() as u64, body, sha256, lfs: true }
    }
}

#[derive(Debug, Clone)]
struct Seen {
    server: &'static str,
    method: String,
    path: String,
    range: Option<String>,
    auth: Option<String>,
}

struct State {
    files: Vec<HubEntry>,
    cdn: String,
    /// The next CDN GET sends only this many body bytes, then drops the connection.
    cut_next_get_after: Mutex<Option<usize>>,
    token: Option<String>,
    /// Answer every GET with the whole file, as a server without range support does.
    ignore_range: std::sync::atomic::AtomicBool,
    seen: Mutex<Vec<Seen>>,
}

struct Hub {
    endpoint: String,
    state: Arc<State>,
}

impl Hub {
    fn start(files: Vec<HubEntry>, cut: Option<usize>, token: Option<&str>) -> Hub {
        let hub = TcpListener::bind("127.0.0.1:0").unwrap();
        let cdn = TcpListener::bind("127.0.0.1:0").unwrap();
        let state = Arc::new(State {
            files,
            cdn: format!("http://{}", cdn.local_addr().unwrap()),
            cut_next_get_after: Mutex::new(cut),
            token: token.map(str::to_string),
            ignore_range: false.into(),
            seen: Mutex::new(Vec::new()),
        });
        let endpoint = format!("http://{}", hub.local_addr().unwrap());
        for (listener, name) in [(hub, "hub"), (cdn, "cdn")] {
            let st = state.clone();
            // The thread lives until the test process exits; each connection is handled in turn.
            std::thread::spawn(move || {
                for conn in listener.incoming().flatten() {
                    serve(conn, name, &st);
                }
            });
        }
        Hub { endpoint, state }
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }
}

fn serve(mut conn: TcpStream, server: &'static str, st: &State) {
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 65536 {
        match conn.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let mut lines = head.lines();
    let mut first = lines.next().unwrap_or("").split(' ');
    let (method, path) = (first.next().unwrap_or("").to_string(), first.next().unwrap_or("").to_string());
    let hdr = |name: &str| {
        head.lines().skip(1).find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim().to_string()))
    };
    let range = hdr("range");
    st.seen.lock().unwrap().push(Seen { server, method: method.clone(), path: path.clone(), range: range.clone(), auth: hdr("authorization") });
    let head_only = method == "HEAD";

    if server == "hub" {
        // Small (non-LFS) files: the hub sends resolve requests on to a cache path on itself (relative Location).
        if let Some(f) = path.strip_prefix(&format!("/api/resolve-cache/models/{REPO}/{COMMIT}/")).and_then(|n| st.files.iter().find(|f| f.name == n && !f.lfs)) {
            return serve_bytes(conn, f, range, head_only, &[("X-Repo-Commit", COMMIT.into()), ("ETag", "\"da39a3ee5e6b4b0d3255bfef95601890afd80709\"".into())], st);
        }
        let Some(name) = path.strip_prefix(&format!("/{REPO}/resolve/main/")) else {
            return reply(conn, "404 Not Found", &[("X-Error-Code", "RepoNotFound".into())], b"Repository not found", head_only);
        };
        if let Some(t) = &st.token {
            if hdr("authorization").as_deref() != Some(&format!("Bearer {t}")) {
                return reply(conn, "401 Unauthorized", &[("X-Error-Code", "GatedRepo".into())], b"Access restricted", head_only);
            }
        }
        let Some(f) = st.files.iter().find(|f| f.name == name) else {
            return reply(conn, "404 Not Found", &[("X-Error-Code", "EntryNotFound".into())], b"Entry not found", head_only);
        };
        if f.lfs {
            let headers = [
                ("Location", format!("{}/lfs/{}", st.cdn, f.name)),
                ("X-Repo-Commit", COMMIT.into()),
                ("X-Linked-Etag", format!("\"{}\"", f.sha256)),
                ("X-Linked-Size", f.declared_size.to_string()),
                ("ETag", "W/\"3f-redirect\"".into()),
            ];
            return reply(conn, "302 Found", &headers, b"", head_only);
        }
        let location = format!("/api/resolve-cache/models/{REPO}/{COMMIT}/{}", f.name);
        return reply(conn, "307 Temporary Redirect", &[("Location", location), ("X-Repo-Commit", COMMIT.into())], b"", head_only);
    }
    let Some(f) = path.strip_prefix("/lfs/").and_then(|n| st.files.iter().find(|f| f.name == n)) else {
        return reply(conn, "404 Not Found", &[], b"no such object", head_only);
    };
    serve_bytes(conn, f, range, head_only, &[("ETag", format!("\"{}\"", f.sha256))], st)
}

/// The body of `f` from the requested offset; the first GET may be cut short on request.
fn serve_bytes(conn: TcpStream, f: &HubEntry, range: Option<String>, head_only: bool, extra: &[(&str, String)], st: &State) {
    let len = f.body.len();
    let range = range.filter(|_| !st.ignore_range.load(std::sync::atomic::Ordering::SeqCst));
    let start = range.as_deref().and_then(|r| r.strip_prefix("bytes=")).and_then(|r| r.strip_suffix('-')).and_then(|n| n.parse::<usize>().ok());
    let mut headers = extra.to_vec();
    let (status, body) = match start {
        Some(s) if s >= len => return reply(conn, "416 Range Not Satisfiable", &[("Content-Range", format!("bytes */{len}"))], b"", head_only),
        Some(s) => {
            headers.push(("Content-Range", format!("bytes {s}-{}/{len}", len - 1)));
            ("206 Partial Content", &f.body[s..])
        }
        None => ("200 OK", &f.body[..]),
    };
    let cut = if head_only { None } else { st.cut_next_get_after.lock().unwrap().take() };
    match cut {
        Some(n) => {
            let mut conn = conn;
            write_head(&mut conn, status, &headers, body.len());
            let _ = conn.write_all(&body[..n.min(body.len())]);
            let _ = conn.flush();
            let _ = conn.shutdown(Shutdown::Both);
        }
        None => reply(conn, status, &headers, body, head_only),
    }
}

fn write_head(conn: &mut TcpStream, status: &str, headers: &[(&str, String)], content_length: usize) {
    let mut h = format!("HTTP/1.1 {status}\r\nContent-Length: {content_length}\r\nConnection: close\r\n");
    for (k, v) in headers {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    h.push_str("\r\n");
    let _ = conn.write_all(h.as_bytes());
}

fn reply(mut conn: TcpStream, status: &str, headers: &[(&str, String)], body: &[u8], head_only: bool) {
    write_head(&mut conn, status, headers, body.len());
    if !head_only {
        let _ = conn.write_all(body);
    }
    let _ = conn.flush();
    let _ = conn.shutdown(Shutdown::Write);
}

/// Deterministic incompressible bytes (xorshift), so a wrong offset shows up as wrong content.
fn content(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A fresh folder for one test, removed when the test passes (kept after a failure, for a look).
struct WorkDir(PathBuf);

impl std::ops::Deref for WorkDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn workdir(name: &str) -> WorkDir {
    let d = std::env::temp_dir().join(format!("ds4-download-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    WorkDir(d)
}

fn download(dir: &Path, hub: &Hub, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ds4-gguf"));
    c.arg("download").args(args).current_dir(dir).env("HF_ENDPOINT", &hub.endpoint).env("HOME", dir);
    for k in ["HF_TOKEN", "HF_HOME", "HF_TOKEN_PATH", "XDG_CACHE_HOME", "DS4_GGUF_DIR"] {
        c.env_remove(k);
    }
    for k in ["http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        c.env_remove(k);
    }
    c.output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn gets(hub: &Hub) -> Vec<Seen> {
    hub.seen().into_iter().filter(|s| s.server == "cdn" && s.method == "GET").collect()
}

#[test]
fn full_download_verifies_sha256_and_links_ds4flash() {
    let body = content(3 << 20, 1);
    let hub = Hub::start(vec![HubEntry::lfs(Q2I, body.clone())], None, None);
    let dir = workdir("full");
    let out = download(&dir, &hub, &["q2-imatrix"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let dest = dir.join("gguf").join(Q2I);
    assert_eq!(std::fs::read(&dest).unwrap(), body);
    assert!(!dir.join("gguf").join(format!("{Q2I}.part")).exists(), "the .part file is renamed");
    assert!(t.contains("verified") && t.contains(&HubEntry::lfs(Q2I, body).sha256), "{t}");
    let link = dir.join("ds4flash.gguf");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read_link(&link).unwrap(), std::fs::canonicalize(&dest).unwrap(), "absolute link, as ds4's ln -sfn");
    let seen = hub.seen();
    assert!(seen.iter().any(|s| s.server == "hub" && s.path == format!("/{REPO}/resolve/main/{Q2I}")), "{seen:?}");
    let g = gets(&hub);
    assert_eq!(g.len(), 1, "{seen:?}");
    assert_eq!(g[0].range, None, "a fresh download asks for the whole file");
    assert!(seen.iter().all(|s| s.auth.is_none()), "no token was given: {seen:?}");

    // A second run finds the file and asks the network nothing; the link is re-made.
    let n = hub.seen().len();
    std::fs::remove_file(&link).unwrap();
    let again = download(&dir, &hub, &["q2-imatrix"]);
    assert!(again.status.success() && text(&again).contains("Already downloaded"), "{}", text(&again));
    assert_eq!(hub.seen().len(), n);
    assert!(std::fs::symlink_metadata(&link).is_ok());
}

#[test]
fn cut_connection_then_second_run_resumes_with_range() {
    let body = content(2 << 20, 2);
    let cut = 700_000;
    let hub = Hub::start(vec![HubEntry::lfs(Q2I, body.clone())], Some(cut), None);
    let dir = workdir("resume");
    let first = download(&dir, &hub, &["q2-imatrix", "--retries", "0"]);
    let t = text(&first);
    assert_eq!(first.status.code(), Some(1), "{t}");
    let part = dir.join("gguf").join(format!("{Q2I}.part"));
    let kept = std::fs::metadata(&part).expect("the partial file is kept").len();
    assert!(kept > 0 && kept <= cut as u64, "kept {kept} bytes");
    assert!(t.contains(&format!("broke after {kept} of {} bytes", body.len())), "{t}");
    assert!(t.contains("run the same command again to resume"), "{t}");
    assert_eq!(std::fs::read(&part).unwrap(), body[..kept as usize], "the partial file holds the start of the file");
    assert!(!dir.join("ds4flash.gguf").exists(), "no link to an unfinished model");

    let second = download(&dir, &hub, &["q2-imatrix"]);
    assert!(second.status.success(), "{}", text(&second));
    assert_eq!(std::fs::read(dir.join("gguf").join(Q2I)).unwrap(), body);
    let g = gets(&hub);
    assert_eq!(g.len(), 2, "{g:?}");
    assert_eq!(g[1].range.as_deref(), Some(format!("bytes={kept}-").as_str()), "continues from the partial file");
    assert!(text(&second).contains("verified"), "the resumed file's sha256 is checked over the whole file");
}

#[test]
fn cut_connection_is_retried_within_one_run() {
    let body = content(1 << 20, 3);
    let hub = Hub::start(vec![HubEntry::lfs(Q2I, body.clone())], Some(300_000), None);
    let dir = workdir("retry");
    let out = download(&dir, &hub, &["q2-imatrix", "--retries", "1"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("retrying"), "{t}");
    assert_eq!(std::fs::read(dir.join("gguf").join(Q2I)).unwrap(), body);
    let g = gets(&hub);
    assert_eq!(g.len(), 2, "{g:?}");
    assert!(g[1].range.as_deref().is_some_and(|r| r.starts_with("bytes=") && r != "bytes=0-"), "{g:?}");
}

#[test]
fn missing_file_is_a_clear_404() {
    let hub = Hub::start(vec![HubEntry::lfs(Q2I, content(1000, 4))], None, None);
    let dir = workdir("404");
    let out = download(&dir, &hub, &["q4"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(Q4) && err.contains(REPO) && err.contains("404") && err.contains("EntryNotFound"), "{err}");
    assert!(!dir.join("gguf").join(format!("{Q4}.part")).exists() && !dir.join("ds4flash.gguf").exists());
}

#[test]
fn truncated_file_is_reported_and_kept_for_resume() {
    let body = content(500_000, 5);
    let mut entry = HubEntry::lfs(Q2I, body.clone());
    entry.declared_size = 600_000;
    let hub = Hub::start(vec![entry], None, None);
    let dir = workdir("truncated");
    let out = download(&dir, &hub, &["q2-imatrix"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("truncated") && err.contains("500000 of the 600000 bytes") && err.contains("kept"), "{err}");
    assert_eq!(std::fs::read(dir.join("gguf").join(format!("{Q2I}.part"))).unwrap(), body);
    assert!(!dir.join("gguf").join(Q2I).exists() && !dir.join("ds4flash.gguf").exists());
}

#[test]
fn checksum_mismatch_deletes_the_partial_file() {
    let mut entry = HubEntry::lfs(Q2I, content(200_000, 6));
    let want = HubEntry::lfs(Q2I, content(200_000, 8)).sha256;
    entry.sha256 = want.clone();
    let hub = Hub::start(vec![entry], None, None);
    let dir = workdir("sha");
    let out = download(&dir, &hub, &["q2-imatrix"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("checksum mismatch") && err.contains(&want) && err.contains("deleted"), "{err}");
    assert!(!dir.join("gguf").join(format!("{Q2I}.part")).exists() && !dir.join("gguf").join(Q2I).exists());
    assert!(!dir.join("ds4flash.gguf").exists());
}

#[test]
fn full_disk_is_reported() {
    if !Path::new("/dev/full").exists() {
        eprintln!("no /dev/full here: skipped");
        return;
    }
    let hub = Hub::start(vec![HubEntry::lfs(Q2I, content(300_000, 8))], None, None);
    let dir = workdir("full-disk");
    std::fs::create_dir_all(dir.join("gguf")).unwrap();
    // Every write to /dev/full fails with ENOSPC, as on a full disk.
    std::os::unix::fs::symlink("/dev/full", dir.join("gguf").join(format!("{Q2I}.part"))).unwrap();
    let out = download(&dir, &hub, &["q2-imatrix"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("disk full") && err.contains("free space"), "{err}");
}

#[test]
fn too_little_free_space_is_refused_before_writing() {
    let mut entry = HubEntry::lfs(Q2I, content(1000, 9));
    entry.declared_size = 1 << 60; // an exabyte: more than any test disk
    let hub = Hub::start(vec![entry], None, None);
    let dir = workdir("space");
    let out = download(&dir, &hub, &["q2-imatrix"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("not enough free space"), "{err}");
    assert!(gets(&hub).is_empty(), "nothing was fetched");
}

#[test]
fn token_goes_to_the_hub_only_and_its_absence_is_explained() {
    let body = content(100_000, 10);
    let hub = Hub::start(vec![HubEntry::lfs(Q2I, body.clone())], None, Some("hf_secret"));
    let dir = workdir("token");
    let denied = download(&dir, &hub, &["q2-imatrix"]);
    let err = String::from_utf8_lossy(&denied.stderr).to_string();
    assert_eq!(denied.status.code(), Some(1), "{err}");
    assert!(err.contains("401") && err.contains("--token"), "{err}");

    let ok = download(&dir, &hub, &["q2-imatrix", "--token", "hf_secret"]);
    assert!(ok.status.success(), "{}", text(&ok));
    assert_eq!(std::fs::read(dir.join("gguf").join(Q2I)).unwrap(), body);
    let seen = hub.seen();
    assert!(seen.iter().any(|s| s.server == "hub" && s.auth.as_deref() == Some("Bearer hf_secret")), "{seen:?}");
    assert!(seen.iter().filter(|s| s.server == "cdn").all(|s| s.auth.is_none()), "the token is not sent to the CDN: {seen:?}");

    // The token file the hub's own tools write at login is used when no token is given.
    std::fs::remove_file(dir.join("gguf").join(Q2I)).unwrap();
    std::fs::create_dir_all(dir.join(".cache/huggingface")).unwrap();
    std::fs::write(dir.join(".cache/huggingface/token"), "hf_secret\n").unwrap();
    let from_file = download(&dir, &hub, &["q2-imatrix"]);
    assert!(from_file.status.success(), "{}", text(&from_file));
}

#[test]
fn mtp_is_not_linked_and_a_non_lfs_file_is_size_checked() {
    let body = content(50_000, 11);
    let mut entry = HubEntry::lfs(MTP, body.clone());
    entry.lfs = false;
    let hub = Hub::start(vec![entry], None, None);
    let dir = workdir("mtp");
    let out = download(&dir, &hub, &["mtp", "--dir", "models"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert_eq!(std::fs::read(dir.join("models").join(MTP)).unwrap(), body);
    assert!(t.contains("only the size was checked") && t.contains("--mtp"), "{t}");
    assert!(std::fs::symlink_metadata(dir.join("ds4flash.gguf")).is_err(), "mtp does not move ./ds4flash.gguf");
    let seen = hub.seen();
    let cache = format!("/api/resolve-cache/models/{REPO}/{COMMIT}/{MTP}");
    assert!(seen.iter().any(|s| s.method == "HEAD" && s.path == cache), "the relative redirect is followed: {seen:?}");
    assert!(seen.iter().any(|s| s.method == "GET" && s.path == cache), "{seen:?}");
}

#[test]
fn a_real_ds4flash_file_is_not_replaced_and_bad_targets_are_usage_errors() {
    let hub = Hub::start(vec![HubEntry::lfs(Q2I, content(10_000, 12))], None, None);
    let dir = workdir("link");
    std::fs::write(dir.join("ds4flash.gguf"), b"my own model").unwrap();
    let out = download(&dir, &hub, &["q2-imatrix"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("not a link") && err.contains(Q2I), "{err}");
    assert_eq!(std::fs::read(dir.join("ds4flash.gguf")).unwrap(), b"my own model");

    let bad = download(&dir, &hub, &["q3"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("q2-imatrix"), "lists the targets");
}

#[test]
fn a_server_that_ignores_range_restarts_the_file() {
    let body = content(1 << 20, 13);
    let hub = Hub::start(vec![HubEntry::lfs(Q2I, body.clone())], Some(400_000), None);
    let dir = workdir("norange");
    let first = download(&dir, &hub, &["q2-imatrix", "--retries", "0"]);
    assert_eq!(first.status.code(), Some(1), "{}", text(&first));
    hub.state.ignore_range.store(true, std::sync::atomic::Ordering::SeqCst);
    let second = download(&dir, &hub, &["q2-imatrix"]);
    let t = text(&second);
    assert!(second.status.success(), "{t}");
    assert!(t.contains("does not resume"), "{t}");
    assert_eq!(std::fs::read(dir.join("gguf").join(Q2I)).unwrap(), body, "the whole answer replaced the partial file");
}

#[test]
fn a_complete_or_oversized_partial_file_is_checked_or_restarted() {
    let body = content(300_000, 14);
    let hub = Hub::start(vec![HubEntry::lfs(Q2I, body.clone())], None, None);
    let dir = workdir("whole-part");
    let gguf = dir.join("gguf");
    std::fs::create_dir_all(&gguf).unwrap();
    let part = gguf.join(format!("{Q2I}.part"));

    // Finished earlier but never renamed: verified and renamed without fetching a byte.
    std::fs::write(&part, &body).unwrap();
    let out = download(&dir, &hub, &["q2-imatrix"]);
    assert!(out.status.success() && text(&out).contains("verified"), "{}", text(&out));
    assert!(gets(&hub).is_empty(), "{:?}", hub.seen());
    assert_eq!(std::fs::read(gguf.join(Q2I)).unwrap(), body);

    // Longer than the hub's file: it cannot be a prefix of it, so the download starts over.
    std::fs::remove_file(gguf.join(Q2I)).unwrap();
    std::fs::write(&part, content(400_000, 15)).unwrap();
    let out = download(&dir, &hub, &["q2-imatrix"]);
    assert!(out.status.success() && text(&out).contains("starting over"), "{}", text(&out));
    assert_eq!(gets(&hub).len(), 1);
    assert_eq!(gets(&hub)[0].range, None);
    assert_eq!(std::fs::read(gguf.join(Q2I)).unwrap(), body);
}
