//! Exact rows: a batched step whose every row is computed as a decode step of that row alone
//! computes it, bit for bit. A verify step (speculative decoding: the current token and its drafts
//! at consecutive positions of one sequence) runs this way, so accepting drafts never changes the
//! output; so do batches of sessions under `--deterministic`. The multi-token kernels read the
//! weights once for all tokens but sum in other orders; here each row keeps its decode arithmetic:
//! - products: each row an input of its own through the one-token kernels (int8 activations where
//!   decode takes them, quantized per row as the decode producers quantize), the rows as slots of
//!   one launch with the one-token K split (a slot's sums depend on the split only);
//! - sub-layer entries: the fused one-token entry (`hc_entry_dec`, with the previous sub-layer's
//!   exit folded in), a grid row per token; the router (`gate_route_dec`) likewise;
//! - the per-sequence ops (compressors, indexer, attention) row by row at each row's position
//!   through the decode kernels (batch.rs), in row order on one stream when rows share a slot.
use super::*;
use crate::matvec::{launch_mvq8_ks, launch_q80, mvq_ks, q80_ok};

impl CudaOps {
    /// Whether verify steps can run as exact rows here: rows attend through the decode kernels, the
    /// activation buffers hold a few rows, slot 0 holds the undo buffers.
    pub fn verify_capable(&self) -> bool { self.batch_cap >= 2 && self.dec_attn_rows() && self.undo_cap() >= 2 }

    /// Batches of distinct sessions as exact rows at every size (`--deterministic`), or only up to
    /// [`EXACT_BATCH_ROWS`] rows and with the multi-token kernels (weights read once per batch) above
    /// (the default).
    pub fn set_exact_batches(&mut self, on: bool) { self.set_exact_batch_rows(if on { usize::MAX } else { EXACT_BATCH_ROWS }) }

    /// Batches of distinct sessions of up to `rows` rows as exact rows, larger ones with the
    /// multi-token kernels (0: every batch with them; tests of those kernels); recorded batched steps
    /// are dropped.
    pub fn set_exact_batch_rows(&mut self, rows: usize) {
        if rows != self.exact_batch_rows {
            self.exact_batch_rows = rows;
            self.batch_graphs.clear();
        }
    }

    /// The sub-layer entry of `n` exact rows: `hc_entry_dec` over a grid row per token (each row's own
    /// parts and barrier), the previous sub-layer's exit folded in, as decode does for one, and each row's Q8_0 copy of xn when the
    /// products after it take one (`want.q80`) and its Q8_K copy for the routed experts (`want.q8k`);
    /// then the rows' Sinkhorn matrices. A launch takes as many rows as keep every block resident
    /// (one block an SM: the grid barriers).
    pub(super) fn hc_pre_rows(&mut self, hc_fn: DM, scale: u64, base: u64, norm: u64, n: usize, want: XnCopies) -> Result<XnCopies> {
        let (e, nh) = (self.cfg.n_embd, self.cfg.n_hc);
        let fits = n <= self.batch_cap;
        let (q80, q8k) = (want.q80 && self.fast_q8 && fits, want.q8k && self.fast_experts && fits);
        let (q, qd) = if q80 { self.wk.q8_xn.pair() } else { (0, 0) };
        let (k8, kd) = if q8k { self.wk.q8k_xn.pair() } else { (0, 0) };
        let en = Entry { hc_fn, scale, base, norm, copies: [q, qd, k8, kd], bar: self.wk.hcd_rows.ptr, exit: self.pend.take() };
        let (x, mix, mixes) = (self.wk.x.ptr, self.wk.mix.ptr, self.wk.mixes.ptr);
        let blocks = e / 256;
        let per = if self.g.sms > 0 { (self.g.sms as usize / blocks).max(1) } else { 1 };
        let mut r0 = 0;
        while r0 < n {
            let m = per.min(n - r0);
            let all = self.entry_args(&en, r0);
            self.g.launch("hc_entry_dec", (blocks as u32, m as u32, 1), 256, 0, &all)?;
            r0 += m;
        }
        // The rows' Sinkhorn matrices: beside the sub-layer on side stream 1 when the step takes the
        // decode step's lanes (a verify step: joined before the exit, as decode), else in order.
        let cfg = &self.cfg;
        let (it, he, re) = (cfg.sinkhorn_iters as i32, cfg.hc_eps, cfg.rms_eps);
        let cargs = [A::P(mix), A::P(scale), A::P(base), A::I(nh as i32), A::I(it), A::F(he), A::P(x), A::I(e as i32), A::P(mixes), A::F(re)];
        if self.same_slot {
            self.g.fork(1)?;
        }
        self.g.launch("hc_comb", (n as u32, 1, 1), 1024, 0, &cargs)?;
        if self.same_slot {
            self.g.to_main();
        }
        Ok(XnCopies { q80, q8k })
    }

    /// Gate logits and routing of `n` rows through `gate_route_dec`, a grid row per token (each row
    /// routed as a one-token launch routes it); row r's ticket is the third int of `hcd_rows` record r
    /// (the exact-rows entries' barriers use the first two).
    pub(super) fn route_rows(&mut self, li: usize, n: usize) -> Result<()> {
        let (e, k, ne) = (self.cfg.n_embd, self.cfg.n_expert_used, self.cfg.n_expert);
        let gate_inp = self.layers[li].gate_inp;
        let r = self.route_args(li);
        let wk = &self.wk;
        let (xn, tokens, eids, ew) = (wk.xn.ptr, wk.tokens.ptr, wk.eids.ptr, wk.ew.ptr);
        let (ticket, per) = (wk.hcd_rows.ptr + 8, wk.hcd_rows.bytes / 16);
        let rlog = wk.rlog.ptr;
        let mut r0 = 0;
        while r0 < n {
            let m = per.max(1).min(n - r0);
            let at = |p: u64, floats: usize| A::P(p + (r0 * floats * 4) as u64);
            let args = [A::P(gate_inp.ptr), at(xn, e), A::I(e as i32), at(rlog, ne), A::P(ticket), r[1], r[2], r[3], at(tokens, 1), r[5], r[6], r[7], at(eids, k), at(ew, k)];
            self.g.launch("gate_route_dec", ((ne / 4) as u32, m as u32, 1), 256, 0, &args)?;
            r0 += m;
        }
        Ok(())
    }

    /// The grouped output projection of `n` exact rows: slot (row r, group g) reads group g's
    /// matrix (`gids`) with row r's inputs, `n × groups` slots with the one-token K split.
    pub(super) fn out_a_rows(&mut self, out_a: DM, n: usize) -> Result<()> {
        let cfg = &self.cfg;
        let (qd, g, ol, d) = (cfg.q_dim(), cfg.o_groups, cfg.o_lora, cfg.head_dim);
        let gin = cfg.heads_per_group() * d;
        let (o, low, gids) = (self.wk.o.ptr, self.wk.low.ptr, self.wk.gids.ptr);
        let wmb = ol * out_a.row_bytes;
        if let Some((q, dq)) = self.ls.pre_o.take() {
            // The rows' Q8_0 copies the attention merges wrote, as decode takes its one.
            return launch_mvq8_ks(&mut self.g, &out_a, out_a.ptr, wmb, gids, q, dq, gin, low, ol, ol, n * g, mvq_ks(&out_a, ol, g));
        }
        if self.fast_q8 && q80_ok(&out_a) && d % 32 == 0 {
            // The same quantization per row as the merge's copy.
            if n * qd > self.wk.xq80_cap {
                return Err(format!("{n} exact rows of {qd} attention outputs exceed the Q8_0 scratch"));
            }
            let s = self.g.current();
            let q = self.wk.xq80.ptr + (s * self.wk.xq80_cap) as u64;
            let dq = self.wk.xq80d.ptr + (s * self.wk.xq80_cap / 32 * 4) as u64;
            launch_q80(&mut self.g, o, qd, qd, n, q, dq)?;
            return launch_mvq8_ks(&mut self.g, &out_a, out_a.ptr, wmb, gids, q, dq, gin, low, ol, ol, n * g, mvq_ks(&out_a, ol, g));
        }
        self.mv_split(out_a.ptr, &out_a, wmb, gids, o, qd, gin, low, g * ol, ol, ol, 1, n * g, g)
    }
}
