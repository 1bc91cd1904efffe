//! The device KV state's lifecycle: a fresh start (compressor frontiers reset), and the snapshot of its
//! mutable parts (window ring, frontiers) a session rewinds to. (A verify step is undone in place:
//! undo.rs.)
use super::*;

impl CudaOps {
    pub(super) fn reset_state(&mut self) -> Result<()> {
        for k in 0..self.kv.len() {
            let (a, b, n) = match (&self.kv[k].st_kv, &self.kv[k].st_sc) {
                (Some(a), Some(b)) => (a.ptr, b.ptr, self.kv[k].st_len),
                _ => continue,
            };
            self.g.launch("comp_reset", (cdiv(n, 256), 1, 1), 256, 0, &[A::P(a), A::P(b), A::I(n as i32)])?;
            if let (Some(a), Some(b)) = (&self.kv[k].ist_kv, &self.kv[k].ist_sc) {
                let (a, b, n) = (a.ptr, b.ptr, self.kv[k].ist_len);
                self.g.launch("comp_reset", (cdiv(n, 256), 1, 1), 256, 0, &[A::P(a), A::P(b), A::I(n as i32)])?;
            }
        }
        Ok(())
    }

    /// Copies the mutable parts (ring, frontiers) to (or, restoring, from) the snapshot.
    pub(super) fn snapshot(&mut self, restore: bool) -> Result<()> {
        let d = self.cfg.head_dim;
        for l in &self.kv {
            let store = l.snap.ptr;
            let mut off = 0u64;
            let mut parts: Vec<(u64, usize)> = vec![(l.ring.ptr, self.cfg.swa * d)];
            for (b, n) in [(&l.st_kv, l.st_len), (&l.st_sc, l.st_len), (&l.ist_kv, l.ist_len), (&l.ist_sc, l.ist_len)] {
                if let Some(b) = b {
                    parts.push((b.ptr, n));
                }
            }
            for (p, n) in parts {
                if restore {
                    self.g.dtod(p, store + off, n * 4)?;
                } else {
                    self.g.dtod(store + off, p, n * 4)?;
                }
                off += 4 * n as u64;
            }
        }
        Ok(())
    }
}
