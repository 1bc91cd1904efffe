//! Distributed flags shared by `ds4`, `ds4-bench` (and later `ds4-server`), as in the C engine.
use crate::codec::check_bits;
use crate::error::{DistError, Result};
use std::time::Duration;

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Coordinator,
    Worker,
    None,
}

#[derive(clap::Args, Debug, Clone, Default)]
pub struct DistArgs {
    /// Distributed role: coordinator (owns 0:K, tokenizes, samples) or worker (serves a layer slice).
    #[arg(long = "role", value_enum)]
    pub role: Option<Role>,
    /// Inclusive layer slice `A:B`, or `A:output` (through the last layer, with the output head).
    #[arg(long = "layers", value_name = "A:B|A:output")]
    pub layers: Option<String>,
    /// Coordinator: where workers connect (port 0 = ephemeral).
    #[arg(long = "listen", num_args = 2, value_names = ["HOST", "PORT"])]
    pub listen: Vec<String>,
    /// Worker: the coordinator to register with.
    #[arg(long = "coordinator", num_args = 2, value_names = ["HOST", "PORT"])]
    pub coordinator: Vec<String>,
    /// Hidden-state wire format: 32 (f32, exact), 16 (f16, power-of-two scale per 64 values) or 8 (FP8 E4M3, f32 scale per 64 values).
    #[arg(long = "dist-activation-bits", env = "DS4_DIST_ACTIVATION_BITS")]
    pub dist_activation_bits: Option<u8>,
    /// Wire format of prefill chunks' hidden states (default: --dist-activation-bits, i.e. 32).
    #[arg(long = "dist-prefill-bits", env = "DS4_DIST_PREFILL_BITS")]
    pub dist_prefill_bits: Option<u8>,
    /// Tokens per pipelined prefill micro-chunk (default: picked per prompt from the measured
    /// compute and hop costs, at most --prefill-chunk).
    #[arg(long = "dist-prefill-chunk", env = "DS4_DIST_PREFILL_CHUNK")]
    pub dist_prefill_chunk: Option<usize>,
    /// Prefill chunks in flight (default: remote stages + 2, clamped to 2..8; max 64).
    #[arg(long = "dist-prefill-window", env = "DS4_DIST_PREFILL_WINDOW")]
    pub dist_prefill_window: Option<usize>,
    /// After a replay, require the replayed logits to equal the ones held before the failure.
    #[arg(long = "dist-replay-check")]
    pub dist_replay_check: bool,
    /// Shared secret: peers that cannot prove it (HMAC challenge-response) are refused.
    #[arg(long = "dist-token", env = "DS4_DIST_TOKEN", hide_env_values = true)]
    pub dist_token: Option<String>,
    /// Microseconds a waiting thread busy-polls for a hop's reply (coordinator) or the next request
    /// (worker) before it blocks: trades an otherwise idle CPU core for the kernel's wake-up
    /// latency per hop. Default: 5000 on a GPU backend (cuda, vulkan, metal: a stage's decode step takes
    /// a few ms and the host cores are idle meanwhile), 0 (block at once) on the CPU backend.
    #[arg(long = "dist-spin-us", env = "DS4_DIST_SPIN_US")]
    pub dist_spin_us: Option<u64>,
    /// Seconds without a heartbeat or reply after which a peer is dead.
    #[arg(long = "dist-timeout-s", default_value_t = 10.0)]
    pub dist_timeout_s: f64,
}

fn addr(v: &[String], flag: &str) -> Result<String> {
    match v {
        [h, p] => {
            let port: u16 = p.parse().map_err(|_| DistError::Usage(format!("{flag} {h} {p}: `{p}` is not a port number")))?;
            if h.is_empty() {
                return Err(DistError::Usage(format!("{flag}: empty host")));
            }
            Ok(if h.contains(':') { format!("[{h}]:{port}") } else { format!("{h}:{port}") })
        }
        _ => Err(DistError::Usage(format!("{flag} takes HOST PORT"))),
    }
}

/// Shortest `--dist-timeout-s` accepted.
pub const MIN_TIMEOUT_S: f64 = 0.5;

/// Resolves `HOST:PORT` of `flag` (a usage error naming the flag when the host does not resolve).
fn resolve(a: &str, flag: &str) -> Result<()> {
    use std::net::ToSocketAddrs;
    match a.to_socket_addrs().map(|mut it| it.next()) {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(DistError::Usage(format!("{flag} {a}: the host has no address"))),
        Err(e) => Err(DistError::Usage(format!("{flag} {a}: the host does not resolve ({e})"))),
    }
}

impl DistArgs {
    /// Resolves the `--listen` / `--coordinator` host (binaries call it after [`Self::validate`],
    /// before loading the model): a host that does not resolve is a usage error at start, not an
    /// error after the weights are loaded (coordinator) or a reconnect loop for good (worker).
    pub fn resolve_hosts(&self) -> Result<()> {
        if self.is_coordinator() {
            resolve(&self.listen_addr()?, "--listen")?;
        }
        if self.is_worker() {
            resolve(&self.coordinator_addr()?, "--coordinator")?;
        }
        Ok(())
    }

    /// The busy-poll budget per wait (`--dist-spin-us`, or the backend's default).
    pub fn spin(&self, backend: ds4_engine::Backend) -> std::time::Duration {
        let us = self.dist_spin_us.unwrap_or(if backend.is_gpu() { 5000 } else { 0 });
        std::time::Duration::from_micros(us)
    }

    pub fn is_worker(&self) -> bool { self.role == Some(Role::Worker) }
    pub fn is_coordinator(&self) -> bool { self.role == Some(Role::Coordinator) }
    pub fn active(&self) -> bool { self.is_worker() || self.is_coordinator() }
    pub fn timeout(&self) -> Duration { Duration::from_secs_f64(self.dist_timeout_s) }
    pub fn bits(&self) -> u8 { self.dist_activation_bits.unwrap_or(32) }
    /// Prefill's wire format: `--dist-prefill-bits`, else `--dist-activation-bits`, else 32.
    pub fn prefill_bits(&self) -> u8 { self.dist_prefill_bits.unwrap_or_else(|| self.bits()) }
    pub fn listen_addr(&self) -> Result<String> { addr(&self.listen, "--listen") }
    pub fn coordinator_addr(&self) -> Result<String> { addr(&self.coordinator, "--coordinator") }

    /// Usage errors (binaries exit 2), checked before any model is loaded.
    pub fn validate(&self) -> Result<()> {
        let u = |m: &str| Err(DistError::Usage(m.into()));
        let dist_flags = [
            (self.dist_activation_bits.is_some(), "--dist-activation-bits"),
            (self.dist_prefill_bits.is_some(), "--dist-prefill-bits"),
            (self.dist_prefill_chunk.is_some(), "--dist-prefill-chunk"),
            (self.dist_prefill_window.is_some(), "--dist-prefill-window"),
            (self.dist_replay_check, "--dist-replay-check"),
            (!self.listen.is_empty(), "--listen"),
            (!self.coordinator.is_empty(), "--coordinator"),
            (self.dist_token.is_some(), "--dist-token"),
            (self.dist_spin_us.is_some(), "--dist-spin-us"),
        ];
        if !self.active() {
            if let Some((_, f)) = dist_flags.iter().find(|(set, _)| *set) {
                return Err(DistError::Usage(format!("{f} requires --role coordinator or --role worker")));
            }
            if self.layers.is_some() {
                return u("--layers requires --role coordinator (layers 0:K here, the rest on workers) or --role worker; a single process serves all layers");
            }
            return Ok(());
        }
        if !(self.dist_timeout_s >= MIN_TIMEOUT_S && self.dist_timeout_s <= 3600.0) {
            return Err(DistError::Usage(format!(
                "--dist-timeout-s {}: must be within {MIN_TIMEOUT_S}..3600 seconds (heartbeats go every timeout/4; a shorter one takes scheduling jitter for a dead peer)",
                self.dist_timeout_s
            )));
        }
        if self.dist_spin_us.is_some_and(|v| v > 1_000_000) {
            return u("--dist-spin-us must be at most 1000000 (one second)");
        }
        if self.dist_token.as_deref() == Some("") {
            return u("--dist-token must not be empty");
        }
        let role = if self.is_worker() { "worker" } else { "coordinator" };
        if self.layers.is_none() {
            return Err(DistError::Usage(format!("--role {role} requires --layers")));
        }
        if self.is_coordinator() {
            if self.listen.is_empty() {
                return u("--role coordinator requires --listen HOST PORT");
            }
            self.listen_addr()?;
            if !self.coordinator.is_empty() {
                return u("--coordinator is for workers; the coordinator takes --listen");
            }
            if let Some(b) = self.dist_activation_bits {
                check_bits(b)?;
            }
            if let Some(b) = self.dist_prefill_bits {
                check_bits(b).map_err(|_| DistError::Usage(format!("--dist-prefill-bits {b}: expected 32, 16 or 8")))?;
            }
            if self.dist_prefill_chunk == Some(0) {
                return u("--dist-prefill-chunk must be at least 1");
            }
            if let Some(w) = self.dist_prefill_window {
                if !(1..=64).contains(&w) {
                    return u("--dist-prefill-window must be within 1..64");
                }
            }
            let l = self.layers.as_deref().unwrap_or("");
            if !l.trim_start().starts_with("0:") {
                return Err(DistError::Usage(format!("--role coordinator needs --layers 0:K (got `{l}`)")));
            }
        } else {
            if self.coordinator.is_empty() {
                return u("--role worker requires --coordinator HOST PORT");
            }
            if self.coordinator.get(1).is_some_and(|p| p.parse::<u16>() == Ok(0)) {
                return u("--coordinator HOST PORT: port 0 is not a port a coordinator listens on (give its --listen port)");
            }
            self.coordinator_addr()?;
            for (set, f) in &dist_flags[..5] {
                if *set {
                    return Err(DistError::Usage(format!("{f} is a coordinator flag; the worker takes the coordinator's settings")));
                }
            }
            if !self.listen.is_empty() {
                return u("--listen is for the coordinator; a worker takes --coordinator HOST PORT");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        d: DistArgs,
    }

    fn v(args: &[&str]) -> Result<()> {
        let mut a = vec!["t"];
        a.extend_from_slice(args);
        T::try_parse_from(a).map_err(|e| DistError::Usage(e.to_string()))?.d.validate()
    }

    #[test]
    fn validation_names_the_flag() {
        assert!(v(&[]).is_ok());
        let e = v(&["--role", "coordinator", "--listen", "127.0.0.1", "0"]).unwrap_err().to_string();
        assert!(e.contains("--role coordinator requires --layers"), "{e}");
        let e = v(&["--role", "worker", "--layers", "3:output"]).unwrap_err().to_string();
        assert!(e.contains("--role worker requires --coordinator"), "{e}");
        let e = v(&["--layers", "0:2"]).unwrap_err().to_string();
        assert!(e.contains("--layers requires --role"), "{e}");
        let e = v(&["--dist-activation-bits", "16"]).unwrap_err().to_string();
        assert!(e.contains("requires --role"), "{e}");
        let e = v(&["--role", "coordinator", "--layers", "0:2", "--listen", "h", "0", "--dist-activation-bits", "12"]).unwrap_err().to_string();
        assert!(e.contains("32, 16 or 8"), "{e}");
        let e = v(&["--role", "coordinator", "--layers", "3:5", "--listen", "h", "0"]).unwrap_err().to_string();
        assert!(e.contains("0:K"), "{e}");
        let e = v(&["--role", "worker", "--layers", "3:5", "--coordinator", "h", "x"]).unwrap_err().to_string();
        assert!(e.contains("not a port"), "{e}");
        let e = v(&["--role", "worker", "--layers", "3:5", "--coordinator", "h", "1", "--dist-prefill-chunk", "4"]).unwrap_err().to_string();
        assert!(e.contains("coordinator flag"), "{e}");
        let e = v(&["--role", "coordinator", "--layers", "0:2", "--listen", "h", "0", "--dist-prefill-bits", "4"]).unwrap_err().to_string();
        assert!(e.contains("--dist-prefill-bits 4"), "{e}");
        let e = v(&["--role", "worker", "--layers", "3:5", "--coordinator", "h", "1", "--dist-prefill-bits", "16"]).unwrap_err().to_string();
        assert!(e.contains("coordinator flag"), "{e}");
        assert!(v(&["--role", "coordinator", "--layers", "0:2", "--listen", "127.0.0.1", "0", "--dist-prefill-bits", "16"]).is_ok());
        assert!(v(&["--role", "coordinator", "--layers", "0:2", "--listen", "127.0.0.1", "0", "--dist-activation-bits", "8"]).is_ok());
        assert!(v(&["--role", "worker", "--layers", "3:output", "--coordinator", "127.0.0.1", "9000", "--dist-token", "x"]).is_ok());
        let e = v(&["--role", "worker", "--layers", "3:5", "--coordinator", "h", "1", "--dist-spin-us", "2000000"]).unwrap_err().to_string();
        assert!(e.contains("--dist-spin-us"), "{e}");
        let e = v(&["--dist-spin-us", "10"]).unwrap_err().to_string();
        assert!(e.contains("requires --role"), "{e}");
    }

    #[test]
    fn timeouts_below_the_floor_ports_0_and_hosts_that_do_not_resolve_are_usage_errors() {
        let w = ["--role", "worker", "--layers", "3:output", "--coordinator", "127.0.0.1", "9000"];
        let with = |extra: &[&str]| {
            let mut a = w.to_vec();
            a.extend_from_slice(extra);
            v(&a)
        };
        for t in ["0", "0.0001", "0.49", "nan", "inf", "3601"] {
            let e = with(&["--dist-timeout-s", t]).unwrap_err();
            assert!(matches!(e, DistError::Usage(_)) && e.to_string().contains("--dist-timeout-s"), "{t}: {e}");
        }
        assert!(with(&["--dist-timeout-s", "0.5"]).is_ok());
        let e = v(&["--role", "worker", "--layers", "3:output", "--coordinator", "127.0.0.1", "0"]).unwrap_err();
        assert!(matches!(e, DistError::Usage(_)) && e.to_string().contains("port 0"), "{e}");
        assert!(v(&["--role", "coordinator", "--layers", "0:2", "--listen", "127.0.0.1", "0"]).is_ok(), "an ephemeral --listen port is fine");
        let p = |a: &[&str]| T::try_parse_from(std::iter::once("x").chain(a.iter().copied())).unwrap().d;
        // `.invalid` never resolves (RFC 6761).
        for a in [
            &["--role", "worker", "--layers", "3:output", "--coordinator", "no-such-host.invalid", "9000"][..],
            &["--role", "coordinator", "--layers", "0:2", "--listen", "no-such-host.invalid", "9000"][..],
        ] {
            let d = p(a);
            d.validate().unwrap();
            let e = d.resolve_hosts().unwrap_err();
            assert!(matches!(e, DistError::Usage(_)) && e.to_string().contains("no-such-host.invalid:9000"), "{e}");
        }
        assert!(p(&w).resolve_hosts().is_ok());
        assert!(p(&["--role", "coordinator", "--layers", "0:2", "--listen", "::1", "0"]).resolve_hosts().is_ok());
    }

    #[test]
    fn spin_defaults_to_the_backend() {
        use ds4_engine::Backend;
        let p = |a: &[&str]| T::try_parse_from(std::iter::once("x").chain(a.iter().copied())).unwrap().d;
        let w = ["--role", "worker", "--layers", "3:5", "--coordinator", "h", "1"];
        assert_eq!(p(&w).spin(Backend::Cpu), std::time::Duration::ZERO);
        assert_eq!(p(&w).spin(Backend::Cuda), std::time::Duration::from_millis(5));
        assert_eq!(p(&w).spin(Backend::Vulkan), std::time::Duration::from_millis(5));
        let mut set = w.to_vec();
        set.extend(["--dist-spin-us", "0"]);
        assert_eq!(p(&set).spin(Backend::Cuda), std::time::Duration::ZERO);
    }
}
