//! Decode as a CUDA graph: a decode step reads its position from device memory, so one captured launch
//! sequence (per input/output kind) is replayed for every token.
use super::*;

/// Batched-step recordings kept (one per order of slots, the oldest dropped first).
const BATCH_GRAPHS: usize = 8;

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

impl CudaOps {
    pub(super) fn dpos_arg(&self) -> u64 {
        if self.decode_mode {
            self.dpos.ptr
        } else {
            0
        }
    }

    /// Whether decode steps are captured and replayed (not while every launch is being profiled).
    pub(super) fn graphs_usable(&self) -> bool { self.g.prof.is_none() }

    /// Starts recording the launches of one decode step.
    pub(super) fn begin_capture(&mut self) -> Result<()> {
        use cudarc::driver::{result as drv, sys as dsys};
        // SAFETY: our stream; thread-local capture mode (other threads' CUDA calls are unaffected).
        unsafe { drv::stream::begin_capture(self.g.stream, dsys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) }
            .map_err(|e| format!("cuStreamBeginCapture: {e:?}"))?;
        self.pend = None;
        self.capturing = true;
        Ok(())
    }

    /// Ends the capture; keeps the graph as `key` when the step's launches all succeeded.
    pub(super) fn end_capture(&mut self, key: usize, ok: bool) -> Result<()> {
        if let Some(g) = self.finish_capture(ok)? {
            self.graphs[self.slot][key] = Some(g);
        }
        Ok(())
    }

    /// Ends the capture begun by `begin_capture`: the instantiated graph when `ok`.
    pub(super) fn finish_capture(&mut self, ok: bool) -> Result<Option<DecodeGraph>> {
        use cudarc::driver::{result as drv, sys as dsys};
        self.capturing = false;
        // SAFETY: ends the capture begun above (also after an error, which invalidates the graph).
        let graph = unsafe { drv::stream::end_capture(self.g.stream) }.map_err(|e| format!("cuStreamEndCapture: {e:?}"));
        if !ok {
            if let Ok(g) = graph {
                // SAFETY: a graph we own and do not instantiate.
                unsafe {
                    let _ = drv::graph::destroy(g);
                }
            }
            return Ok(None);
        }
        let graph = graph?;
        // SAFETY: graph is the complete capture above.
        let exec = unsafe { drv::graph::instantiate(graph, dsys::CUgraphInstantiate_flags(0)) }.map_err(|e| {
            // SAFETY: destroying the graph we own after a failed instantiation.
            unsafe {
                let _ = drv::graph::destroy(graph);
            }
            format!("cuGraphInstantiate: {e:?}")
        })?;
        Ok(Some(DecodeGraph { graph, exec }))
    }

    /// Launches the decode graph `key`.
    pub(super) fn launch_graph(&mut self, key: usize) -> Result<()> {
        let exec = self.graphs[self.slot][key].as_ref().ok_or("no decode graph was captured for this step kind")?.exec;
        self.launch_exec(exec)
    }

    /// Whether the batched step begun can be recorded and replayed: its per-row ops read the rows'
    /// positions on the device (the decode attention shapes), and its products stay on the mat-vec
    /// kernels (fewer rows than the GEMM threshold).
    pub(super) fn batch_replayable(&self) -> bool { self.graphs_usable() && self.dec_attn_rows() && self.batch.len() < self.gemm_min.min(GEMM_MIN) }

    /// The recorded batched step for the rows' slots (in order), if any.
    fn batch_graph_index(&self) -> Option<usize> { self.batch_graphs.iter().position(|(slots, _)| slots.len() == self.batch.len() && slots.iter().zip(&self.batch).all(|(s, r)| *s == r.0)) }

    pub(super) fn has_batch_graph(&self) -> bool { self.batch_graph_index().is_some() }

    /// Keeps the capture as the batched step of the current rows' slots (the oldest of
    /// [`BATCH_GRAPHS`] recordings makes room).
    pub(super) fn end_batch_capture(&mut self, ok: bool) -> Result<()> {
        if let Some(g) = self.finish_capture(ok)? {
            if self.batch_graphs.len() >= BATCH_GRAPHS {
                self.batch_graphs.remove(0);
            }
            let slots = self.batch.iter().map(|r| r.0).collect();
            self.batch_graphs.push((slots, g));
        }
        Ok(())
    }

    /// Launches the recorded batched step of the current rows' slots.
    pub(super) fn launch_batch_graph(&mut self) -> Result<()> {
        let i = self.batch_graph_index().ok_or("no batched step was recorded for these slots")?;
        let exec = self.batch_graphs[i].1.exec;
        self.launch_exec(exec)
    }

    fn launch_exec(&mut self, exec: cudarc::driver::sys::CUgraphExec) -> Result<()> {
        let t = self.host_time.now();
        // SAFETY: exec is a live instantiated graph whose nodes use this backend's device buffers.
        unsafe { cudarc::driver::result::graph::launch(exec, self.g.stream) }.map_err(|e| format!("cuGraphLaunch: {e:?}"))?;
        self.host_time.add_launch(t);
        Ok(())
    }
}
