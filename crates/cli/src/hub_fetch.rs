//! Resumable download of one file from a Hugging Face hub (or a mirror set with `HF_ENDPOINT`) through its
//! `resolve` endpoint: a HEAD for the size, the content sha256 and the download location, then a GET with
//! `Range` that continues a `.part` file, and a size and checksum check before the rename.
//!
//! Plain HTTP through `ureq` (rustls, no OpenSSL) rather than the `hf-hub` crate: hf-hub writes into the hub
//! cache layout (blobs/snapshots) where ds4 keeps plain `gguf/<file>` files, and checks neither the size nor
//! the sha256 of what it wrote.
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

/// Where a file lives on the hub.
#[derive(Debug, Clone)]
pub struct HubFile {
    /// `https://huggingface.co` or the value of `HF_ENDPOINT`, without a trailing slash.
    pub endpoint: String,
    pub repo: String,
    pub revision: String,
    pub filename: String,
    pub token: Option<String>,
}

/// What the HEAD request told us.
#[derive(Debug, Clone)]
pub struct Remote {
    /// Where the bytes are served (the LFS/CDN location after the hub's redirect, or the resolve URL itself).
    pub url: String,
    pub size: u64,
    /// Lower-case hex sha256 of the content, when the hub's (linked) ETag is one (LFS files).
    pub sha256: Option<String>,
    pub commit: Option<String>,
}

#[derive(Debug, Error)]
pub enum FetchError {
    #[error("{file} was not found in {repo} (revision {revision}) at {endpoint} (HTTP 404{code})")]
    NotFound { endpoint: String, repo: String, revision: String, file: String, code: String },
    #[error("access to {repo}/{file} was refused (HTTP {status}): pass a valid token with --token or HF_TOKEN")]
    Denied { repo: String, file: String, status: u16 },
    #[error("{url} answered HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("the download link for {file} answered HTTP {status} (it may have expired); the partial file, if any, is kept: run the same command again")]
    LinkFailed { file: String, status: u16 },
    #[error("{file} changed on the hub during the download; delete {part} and run the same command again")]
    Changed { file: String, part: PathBuf },
    #[error("network error talking to {url}: {source}")]
    Network { url: String, source: ureq::Error },
    #[error("the hub's answer for {file} lacks {what}")]
    BadHeaders { file: String, what: &'static str },
    #[error("too many redirects from {url}")]
    Redirects { url: String },
    #[error("the download of {file} broke after {got} of {size} bytes ({source}); the partial file {part} is kept: run the same command again to resume")]
    Interrupted { file: String, got: u64, size: u64, part: PathBuf, source: std::io::Error },
    #[error("download truncated: the server sent {got} of the {size} bytes the hub declares for {file}; the partial file {part} is kept: run the same command again to resume")]
    Truncated { file: String, got: u64, size: u64, part: PathBuf },
    #[error("the server sent more than the {size} bytes the hub declares for {file}; the partial file {part} was deleted")]
    TooLong { file: String, size: u64, part: PathBuf },
    #[error("the server answered a request for bytes {start}- of {file} with {got}")]
    BadRange { file: String, start: u64, got: String },
    #[error("checksum mismatch for {file}: sha256 {got}, the hub says {want}; the partial file {part} was deleted: run the same command again to download it afresh")]
    Checksum { file: String, got: String, want: String, part: PathBuf },
    #[error("disk full writing {part} ({got} of {size} bytes written); the partial file is kept: free space and run the same command again to resume")]
    DiskFull { part: PathBuf, got: u64, size: u64 },
    #[error("not enough free space in {dir}: {file} needs {need} more, {free} free")]
    NoSpace { dir: PathBuf, file: String, need: String, free: String },
    #[error("another download of {part} is running")]
    Busy { part: PathBuf },
    #[error("{what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> FetchError + 'a {
    move |source| FetchError::Io { what, path: path.to_path_buf(), source }
}

/// Reports bytes as they arrive; the caller owns the display.
pub trait Progress {
    fn start(&mut self, what: &str, done: u64, total: u64);
    fn advance(&mut self, done: u64);
    fn finish(&mut self);
}

fn agent(follow_redirects: bool) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(if follow_redirects { 10 } else { 0 })
        .timeout_connect(Some(Duration::from_secs(30)))
        // A stalled connection becomes an error (and a resumable partial) instead of a hang.
        .timeout_per_read(Some(Duration::from_secs(60)))
        .user_agent(concat!("ds4-gguf/", env!("CARGO_PKG_VERSION")))
        // Model files are not compressible; byte ranges must count raw bytes.
        .accept_encoding("identity")
        .build()
        .new_agent()
}

/// `scheme://host:port` of a URL, to decide whether it is the hub itself (the token goes only there).
fn origin(url: &str) -> &str {
    let after = url.find("://").map_or(0, |i| i + 3);
    let end = url[after..].find('/').map_or(url.len(), |i| after + i);
    &url[..end]
}

fn header<'a>(r: &'a ureq::http::Response<ureq::Body>, name: &str) -> Option<&'a str> {
    r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::trim)
}

impl HubFile {
    pub fn resolve_url(&self) -> String {
        format!("{}/{}/resolve/{}/{}", self.endpoint, self.repo, self.revision, self.filename)
    }

    fn authorize(&self, url: &str, req: ureq::RequestBuilder<ureq::typestate::WithoutBody>) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        match &self.token {
            Some(t) if origin(url) == origin(&self.endpoint) => req.header("Authorization", format!("Bearer {t}")),
            _ => req,
        }
    }

    fn status_error(&self, url: &str, r: &ureq::http::Response<ureq::Body>) -> FetchError {
        let status = r.status().as_u16();
        match status {
            404 => FetchError::NotFound {
                endpoint: self.endpoint.clone(),
                repo: self.repo.clone(),
                revision: self.revision.clone(),
                file: self.filename.clone(),
                code: header(r, "x-error-code").map(|c| format!(", {c}")).unwrap_or_default(),
            },
            _ if origin(url) != origin(&self.endpoint) => FetchError::LinkFailed { file: self.filename.clone(), status },
            401 | 403 => FetchError::Denied { repo: self.repo.clone(), file: self.filename.clone(), status },
            _ => FetchError::Status { url: url.to_string(), status },
        }
    }

    /// HEAD on the resolve URL without following the hub's LFS redirect, whose headers carry the file's sha256
    /// and size (`X-Linked-Etag`, `X-Linked-Size`); other redirects (a renamed repo, the hub's cache path for
    /// small files) are followed.
    pub fn probe(&self) -> Result<Remote, FetchError> {
        let agent = agent(false);
        let mut url = self.resolve_url();
        for _ in 0..10 {
            let req = self.authorize(&url, agent.head(&url));
            let r = req.call().map_err(|source| FetchError::Network { url: url.clone(), source })?;
            let status = r.status().as_u16();
            if !(200..400).contains(&status) {
                return Err(self.status_error(&url, &r));
            }
            let location = header(&r, "location").map(str::to_string);
            if (300..400).contains(&status) {
                let loc = location.ok_or(FetchError::BadHeaders { file: self.filename.clone(), what: "a Location for its redirect" })?;
                let next = if loc.starts_with('/') { format!("{}{loc}", origin(&url)) } else { loc };
                // An LFS redirect carries the file's size and sha256 itself; any other is followed.
                if header(&r, "x-linked-size").is_some() {
                    return self.remote_from(&r, next);
                }
                url = next;
                continue;
            }
            return self.remote_from(&r, url);
        }
        Err(FetchError::Redirects { url: self.resolve_url() })
    }

    fn remote_from(&self, r: &ureq::http::Response<ureq::Body>, url: String) -> Result<Remote, FetchError> {
        let etag = header(r, "x-linked-etag").or_else(|| header(r, "etag"));
        let sha256 = etag.map(|e| e.trim_start_matches("W/").trim_matches('"').to_ascii_lowercase()).filter(|e| e.len() == 64 && e.bytes().all(|b| b.is_ascii_hexdigit()));
        let size = header(r, "x-linked-size")
            .or_else(|| if r.status().is_success() { header(r, "content-length") } else { None })
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or(FetchError::BadHeaders { file: self.filename.clone(), what: "the file size (X-Linked-Size or Content-Length)" })?;
        Ok(Remote { url, size, sha256, commit: header(r, "x-repo-commit").map(str::to_string) })
    }

    /// Download `remote` into `part` (continuing what is already there), check its size and sha256, and rename
    /// it to `dest`. `retries` more attempts follow a broken connection, each resuming where the last stopped.
    pub fn fetch(&self, remote: &Remote, part: &Path, dest: &Path, retries: u32, progress: &mut dyn Progress) -> Result<(), FetchError> {
        let mut p = Partial::open(part, remote.size)?;
        check_space(part, &self.filename, remote.size - p.have)?;
        if p.have > 0 && remote.sha256.is_some() {
            p.hash_existing(progress)?;
        }
        let mut attempt = 0;
        let mut url = remote.url.clone();
        loop {
            match self.fetch_range(&url, remote.size, &mut p, progress) {
                Ok(()) => break,
                Err(e @ FetchError::Interrupted { .. }) if attempt < retries => {
                    attempt += 1;
                    let wait = Duration::from_secs(1 << attempt.min(5));
                    eprintln!("{e}\nretrying in {} s (attempt {attempt} of {retries})", wait.as_secs());
                    std::thread::sleep(wait);
                    // The CDN's signed link may have expired meanwhile: ask the hub for a fresh one.
                    if let Ok(fresh) = self.probe() {
                        if fresh.size != remote.size || fresh.sha256 != remote.sha256 {
                            return Err(FetchError::Changed { file: self.filename.clone(), part: part.to_path_buf() });
                        }
                        url = fresh.url;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        if p.have < remote.size {
            return Err(FetchError::Truncated { file: self.filename.clone(), got: p.have, size: remote.size, part: part.to_path_buf() });
        }
        if let Some(want) = &remote.sha256 {
            let got = hex(&p.hasher.finalize_reset());
            if &got != want {
                drop(p);
                let _ = std::fs::remove_file(part);
                return Err(FetchError::Checksum { file: self.filename.clone(), got, want: want.clone(), part: part.to_path_buf() });
            }
        }
        p.file.sync_all().map_err(io_err("cannot sync", part))?;
        std::fs::rename(part, dest).map_err(io_err("cannot rename the finished download to", dest))
    }

    /// One GET from `p.have` to the end, appending to the partial file and hashing as it goes.
    fn fetch_range(&self, url: &str, size: u64, p: &mut Partial, progress: &mut dyn Progress) -> Result<(), FetchError> {
        if p.have == size {
            return Ok(());
        }
        let mut req = self.authorize(url, agent(true).get(url));
        if p.have > 0 {
            req = req.header("Range", format!("bytes={}-", p.have));
        }
        // Any failure to connect is worth a retry, like a connection that breaks mid-body.
        let r = req.call().map_err(|e| match e {
            ureq::Error::Io(source) => self.interrupted(p, size, source),
            other => self.interrupted(p, size, std::io::Error::other(other)),
        })?;
        match r.status().as_u16() {
            206 => {
                let range = header(&r, "content-range").unwrap_or("");
                let start = range.strip_prefix("bytes ").and_then(|s| s.split('-').next()).and_then(|s| s.parse::<u64>().ok());
                if start != Some(p.have) {
                    return Err(FetchError::BadRange { file: self.filename.clone(), start: p.have, got: format!("Content-Range '{range}'") });
                }
            }
            200 if p.have > 0 => {
                // The server ignored the Range: its body starts at byte 0.
                eprintln!("the server does not resume downloads: starting {} over", self.filename);
                p.restart()?;
            }
            200 => {}
            416 => return Err(FetchError::BadRange { file: self.filename.clone(), start: p.have, got: "HTTP 416 (range not satisfiable)".into() }),
            _ => return Err(self.status_error(url, &r)),
        }
        progress.start(&self.filename, p.have, size);
        let mut body = r.into_body().into_reader();
        let mut out = BufWriter::with_capacity(1 << 20, &p.file);
        let mut buf = vec![0u8; 1 << 20];
        let mut have = p.have;
        let result = loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => break Err(e),
            };
            if have + n as u64 > size {
                drop(out);
                let _ = std::fs::remove_file(&p.path);
                return Err(FetchError::TooLong { file: self.filename.clone(), size, part: p.path.clone() });
            }
            if let Err(e) = out.write_all(&buf[..n]) {
                drop(out);
                p.have = have;
                return Err(self.write_error(e, p, size));
            }
            p.hasher.update(&buf[..n]);
            have += n as u64;
            progress.advance(have);
        };
        // Keep every byte received so far, so that the next attempt resumes after it. A failed flush (disk
        // full) wins over a broken connection: retrying cannot fix it.
        let flushed = out.flush();
        drop(out);
        progress.finish();
        p.have = have;
        flushed.map_err(|e| self.write_error(e, p, size))?;
        result.map_err(|e| self.interrupted(p, size, e))
    }

    fn interrupted(&self, p: &Partial, size: u64, source: std::io::Error) -> FetchError {
        FetchError::Interrupted { file: self.filename.clone(), got: p.have, size, part: p.path.clone(), source }
    }

    fn write_error(&self, e: std::io::Error, p: &Partial, size: u64) -> FetchError {
        if e.kind() == std::io::ErrorKind::StorageFull {
            FetchError::DiskFull { part: p.path.clone(), got: p.have, size }
        } else {
            FetchError::Io { what: "cannot write", path: p.path.clone(), source: e }
        }
    }
}

/// The `.part` file: locked, appended to, and hashed over everything it holds.
struct Partial {
    file: File,
    path: PathBuf,
    have: u64,
    hasher: Sha256,
}

impl Partial {
    fn open(path: &Path, size: u64) -> Result<Partial, FetchError> {
        let file = OpenOptions::new().create(true).append(true).open(path).map_err(io_err("cannot open", path))?;
        // Two downloads appending to one partial file would interleave their bytes.
        if rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            return Err(FetchError::Busy { part: path.to_path_buf() });
        }
        let have = file.metadata().map_err(io_err("cannot stat", path))?.len();
        let mut p = Partial { file, path: path.to_path_buf(), have, hasher: Sha256::new() };
        if have > size {
            eprintln!("{} is larger than the hub's file ({have} > {size} bytes): starting over", path.display());
            p.restart()?;
        }
        Ok(p)
    }

    fn restart(&mut self) -> Result<(), FetchError> {
        self.file.set_len(0).map_err(io_err("cannot truncate", &self.path))?;
        self.have = 0;
        self.hasher = Sha256::new();
        Ok(())
    }

    /// Feed the bytes already in the file to the hasher, so the final check covers the whole file.
    fn hash_existing(&mut self, progress: &mut dyn Progress) -> Result<(), FetchError> {
        let mut f = File::open(&self.path).map_err(io_err("cannot read", &self.path))?.take(self.have);
        progress.start("checking the partial file", 0, self.have);
        let mut buf = vec![0u8; 1 << 20];
        let mut done = 0u64;
        loop {
            let n = f.read(&mut buf).map_err(io_err("cannot read", &self.path))?;
            if n == 0 {
                break;
            }
            self.hasher.update(&buf[..n]);
            done += n as u64;
            progress.advance(done);
        }
        progress.finish();
        if done != self.have {
            return Err(FetchError::Io { what: "the partial file shrank while reading", path: self.path.clone(), source: std::io::ErrorKind::UnexpectedEof.into() });
        }
        Ok(())
    }
}

/// Refuse to start a download that cannot fit, before writing anything.
fn check_space(part: &Path, file: &str, need: u64) -> Result<(), FetchError> {
    let dir = part.parent().unwrap_or(Path::new("."));
    let Ok(st) = rustix::fs::statvfs(dir) else { return Ok(()) }; // unknown: the write path still reports a full disk
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    if free < need {
        return Err(FetchError::NoSpace { dir: dir.to_path_buf(), file: file.to_string(), need: human(need), free: human(free) });
    }
    Ok(())
}

pub fn human(bytes: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / GIB)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_is_scheme_host_port() {
        assert_eq!(origin("https://huggingface.co/a/b/resolve/main/f"), "https://huggingface.co");
        assert_eq!(origin("http://127.0.0.1:8080"), "http://127.0.0.1:8080");
        assert_ne!(origin("http://127.0.0.1:8080/x"), origin("http://127.0.0.1:8081/x"));
    }

    #[test]
    fn sha256_hex_matches_the_known_digest_of_abc() {
        // FIPS 180-2 example: sha256("abc").
        assert_eq!(hex(&Sha256::digest(b"abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
