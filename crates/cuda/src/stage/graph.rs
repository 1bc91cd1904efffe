//! Decode as a CUDA graph: the single-token forward reads its position from device memory, so one
//! captured launch sequence (per input/output kind) is replayed for every token.
use super::*;

/// An instantiated CUDA graph of one decode step.
pub(super) struct DecodeGraph {
    graph: cudarc::driver::sys::CUgraph,
    exec: cudarc::driver::sys::CUgraphExec,
}

impl Drop for DecodeGraph {
    fn drop(&mut self) {
        // SAFETY: both handles were created by capture/instantiate and are destroyed once.
        unsafe {
            let _ = cudarc::driver::result::graph::exec_destroy(self.exec);
            let _ = cudarc::driver::result::graph::destroy(self.graph);
        }
    }
}

impl CudaStage {
    pub(super) fn dpos_arg(&self) -> u64 {
        if self.decode_mode {
            self.dpos.ptr
        } else {
            0
        }
    }

    /// One decode step through the captured graph (captured on first use for this input/output kind).
    pub(super) fn decode_graph(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits) -> Result<usize> {
        let hd = self.cfg.hc_dim();
        if let (None, Some(em)) = (hidden_in, &self.embed) {
            if tokens[0] as usize >= em.rows {
                return Err(format!("token id {} is outside the vocabulary ({})", tokens[0], em.rows));
            }
        }
        if let Some(h) = hidden_in {
            if h.len() != hd {
                return Err(format!("hidden input has {} floats, expected {hd}", h.len()));
            }
            let xp = self.wk.x.ptr;
            self.g.htod(xp, h)?;
        } else if self.embed.is_none() {
            return Err("stage without embedding needs a hidden-state input".into());
        }
        let head = want != Logits::None && self.head.is_some();
        // Kinds: hidden input or token, then no head / logits / logits and their argmax.
        let top1 = head && self.want_top1;
        let key = 3 * hidden_in.is_some() as usize + head as usize + top1 as usize;
        if self.graphs[key].is_none() {
            self.graphs[key] = Some(self.capture_decode(hidden_in.is_none(), head, top1)?);
        }
        // The argmax is in the graph: forward_argmax launches none after it.
        self.want_top1 = false;
        let exec = self.graphs[key].as_ref().unwrap().exec;
        let t = self.host_time.now();
        // SAFETY: exec is a live instantiated graph whose nodes use this stage's device buffers.
        unsafe { cudarc::driver::result::graph::launch(exec, self.g.stream) }.map_err(|e| format!("cuGraphLaunch: {e:?}"))?;
        self.host_time.add_launch(t);
        kv.pos += 1;
        self.dev_pos = kv.pos;
        Ok(head as usize)
    }

    /// Records the launches of one decode step (embedding, layers, head) into a CUDA graph.
    pub(super) fn capture_decode(&mut self, embed: bool, head: bool, top1: bool) -> Result<DecodeGraph> {
        use cudarc::driver::{result as drv, sys as dsys};
        // SAFETY: our stream; thread-local capture mode (other threads' CUDA calls are unaffected).
        unsafe { drv::stream::begin_capture(self.g.stream, dsys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) }
            .map_err(|e| format!("cuStreamBeginCapture: {e:?}"))?;
        self.pend = None;
        let body = (|| -> Result<()> {
            if embed {
                let em = self.embed.unwrap();
                let args = [A::P(em.ptr), A::I(ty_code(em.ty)), A::P(self.wk.tokens.ptr), A::P(self.wk.x.ptr), A::I(self.cfg.n_embd as i32), A::I(self.cfg.n_hc as i32)];
                self.g.launch("embed", (1, cdiv(self.cfg.n_embd, 256), 1), 256, 0, &args)?;
            }
            for li in 0..self.layers.len() {
                self.attention(li, 1, 0)?;
                self.ffn(li, 1)?;
            }
            self.flush_exit()?;
            if head {
                self.head_fwd(0, 1)?;
            }
            if top1 {
                let (lp, tp, v) = (self.wk.logits.ptr, self.wk.top1.ptr, self.cfg.n_vocab);
                self.g.launch("argmax_row", (ARGMAX_BLOCKS, 1, 1), 256, 0, &[A::P(lp), A::I(v as i32), A::P(tp)])?;
            }
            Ok(())
        })();
        // SAFETY: ends the capture begun above (also after an error, which invalidates the graph).
        let graph = unsafe { drv::stream::end_capture(self.g.stream) }.map_err(|e| format!("cuStreamEndCapture: {e:?}"));
        body?;
        let graph = graph?;
        // SAFETY: graph is the complete capture above.
        let exec = unsafe { drv::graph::instantiate(graph, dsys::CUgraphInstantiate_flags(0)) }.map_err(|e| {
            // SAFETY: destroying the graph we own after a failed instantiation.
            unsafe {
                let _ = drv::graph::destroy(graph);
            }
            format!("cuGraphInstantiate: {e:?}")
        })?;
        Ok(DecodeGraph { graph, exec })
    }

}
