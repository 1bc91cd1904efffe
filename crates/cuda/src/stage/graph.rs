//! Decode as a CUDA graph: a decode step reads its position from device memory, so one captured launch
//! sequence (per input/output kind) is replayed for every token.
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
            return Ok(());
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
        self.graphs[self.slot][key] = Some(DecodeGraph { graph, exec });
        Ok(())
    }

    /// Launches the decode graph `key`.
    pub(super) fn launch_graph(&mut self, key: usize) -> Result<()> {
        let exec = self.graphs[self.slot][key].as_ref().ok_or("no decode graph was captured for this step kind")?.exec;
        let t = self.host_time.now();
        // SAFETY: exec is a live instantiated graph whose nodes use this backend's device buffers.
        unsafe { cudarc::driver::result::graph::launch(exec, self.g.stream) }.map_err(|e| format!("cuGraphLaunch: {e:?}"))?;
        self.host_time.add_launch(t);
        Ok(())
    }
}
