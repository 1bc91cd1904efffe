//! Open-connection accounting: at most `--max-connections` at once. A new connection past the cap takes
//! the place of the connection that has been idle longest (no request in flight: a stalled client, or a
//! keep-alive connection between requests), so stalled clients cannot lock out `/health` or real
//! requests; only when every connection is busy with a request is the new one refused.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// One open connection.
pub struct Conn {
    id: u64,
    in_flight: AtomicUsize,
    idle_since: Mutex<Instant>,
    /// Since when a write to the client has been waiting for the socket (a client that does not read),
    /// None while writes go through.
    write_blocked_since: Mutex<Option<Instant>>,
    /// Notified when the connection must be dropped (it was evicted for a new one).
    pub evicted: Notify,
}

impl Conn {
    /// When the connection's idle time runs out, or None while a request is in flight.
    pub fn idle_deadline(&self, timeout: Duration) -> Option<Instant> {
        if self.in_flight.load(SeqCst) > 0 {
            return None;
        }
        let since = *self.idle_since.lock().unwrap_or_else(|e| e.into_inner());
        // A timeout too large to add never expires (it used to panic the connection's task).
        since.checked_add(timeout)
    }

    /// Notes the outcome of a write to the socket: blocked (the client's window is full) or through.
    pub fn note_write(&self, blocked: bool) {
        let mut since = self.write_blocked_since.lock().unwrap_or_else(|e| e.into_inner());
        match (blocked, *since) {
            (true, None) => *since = Some(Instant::now()),
            (false, Some(_)) => *since = None,
            _ => {}
        }
    }

    /// When the write blocked now has waited `timeout`; None while no write is blocked.
    pub fn write_deadline(&self, timeout: Duration) -> Option<Instant> {
        self.write_blocked_since.lock().unwrap_or_else(|e| e.into_inner()).and_then(|t| t.checked_add(timeout))
    }

    fn idle_for(&self) -> Option<Instant> {
        self.idle_deadline(Duration::ZERO)
    }

    /// Marks a request in flight until the guard is dropped (after its response body is sent).
    pub fn busy(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, SeqCst);
        Busy(self.clone())
    }
}

/// A request in flight on a connection.
pub struct Busy(Arc<Conn>);

impl Drop for Busy {
    fn drop(&mut self) {
        *self.0.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.0.in_flight.fetch_sub(1, SeqCst);
    }
}

/// The set of open connections.
pub struct Registry {
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next: AtomicU64,
    max: usize,
    pub evictions: AtomicU64,
    pub refused: AtomicU64,
}

impl Registry {
    pub fn new(max: usize) -> Self {
        Self { conns: Mutex::new(HashMap::new()), next: AtomicU64::new(1), max: max.max(1), evictions: AtomicU64::new(0), refused: AtomicU64::new(0) }
    }

    /// Registers a new connection, evicting the longest-idle one when at the cap; None when every open
    /// connection has a request in flight.
    pub fn admit(&self) -> Option<Arc<Conn>> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if conns.len() >= self.max {
            let victim = conns.values().filter_map(|c| c.idle_for().map(|t| (t, c.id))).min().map(|(_, id)| id);
            match victim.and_then(|id| conns.remove(&id)) {
                Some(v) => {
                    v.evicted.notify_one();
                    self.evictions.fetch_add(1, SeqCst);
                }
                None => {
                    self.refused.fetch_add(1, SeqCst);
                    return None;
                }
            }
        }
        let id = self.next.fetch_add(1, SeqCst);
        let c = Arc::new(Conn { id, in_flight: AtomicUsize::new(0), idle_since: Mutex::new(Instant::now()), write_blocked_since: Mutex::new(None), evicted: Notify::new() });
        conns.insert(id, c.clone());
        Some(c)
    }

    /// Forgets a closed connection (no-op when it was evicted already).
    pub fn remove(&self, c: &Conn) {
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).remove(&c.id);
    }

    pub fn open(&self) -> usize {
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_longest_idle_and_refuses_when_all_busy() {
        let r = Registry::new(2);
        let a = r.admit().unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let b = r.admit().unwrap();
        // At the cap: `a` has been idle longest and makes room.
        let c = r.admit().unwrap();
        assert_eq!(r.open(), 2);
        assert_eq!(r.evictions.load(SeqCst), 1);
        assert!(a.idle_deadline(Duration::ZERO).is_some());
        // Both remaining connections busy: the next one is refused.
        let _gb = b.busy();
        let _gc = c.busy();
        assert!(r.admit().is_none());
        assert_eq!(r.refused.load(SeqCst), 1);
        drop(_gb);
        // `b` is idle again and can be evicted.
        assert!(r.admit().is_some());
        r.remove(&c);
        assert_eq!(r.open(), 1);
    }

    #[test]
    fn a_blocked_write_has_a_deadline_until_a_write_goes_through() {
        let r = Registry::new(1);
        let c = r.admit().unwrap();
        let t = Duration::from_secs(10);
        assert!(c.write_deadline(t).is_none());
        c.note_write(true);
        let d = c.write_deadline(t).unwrap();
        // Still blocked: the deadline counts from the first blocked write.
        c.note_write(true);
        assert_eq!(c.write_deadline(t), Some(d));
        c.note_write(false);
        assert!(c.write_deadline(t).is_none());
    }

    #[test]
    fn a_timeout_too_large_for_the_clock_never_expires_instead_of_panicking() {
        // `--header-timeout-secs 18446744073709551615` panicked every connection's task ("overflow
        // when adding duration to instant"): /health got no answer at all.
        let r = Registry::new(1);
        let c = r.admit().unwrap();
        assert!(c.idle_deadline(Duration::MAX).is_none());
        c.note_write(true);
        assert!(c.write_deadline(Duration::MAX).is_none());
    }
}
