//! Directional steering on the device (`DeviceOps::set_steering`): the directions of the stage's
//! layers and a control buffer (each slot's FFN and attention scale, then one flag per row) are
//! uploaded once; each layer gets a steering op before its attention and FFN exits. Each step writes
//! its rows' flags from the gate and the row mask (a few words, like its token ids).
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ds4_model::steering::Steering;

use super::WgpuOps;
use crate::buffer::GpuBuffer;
use crate::error::WgpuError;
use crate::ops::{Steer, SteerSite, SteerTables};

pub(crate) struct SteerState {
    _dirs: GpuBuffer,
    ctl: GpuBuffer,
    /// Per resident layer: (attention, FFN).
    ops: Vec<(Steer, Steer)>,
    slots: usize,
    gate: Arc<AtomicBool>,
    rows: Vec<bool>,
    /// Scratch of the flag words (sized once).
    flags: Vec<u32>,
}

impl SteerState {
    pub fn op(&self, li: usize, site: SteerSite) -> Option<&Steer> {
        self.ops.get(li).map(|(a, f)| if site == SteerSite::Attn { a } else { f })
    }
}

impl WgpuOps {
    /// Installs `st` (None removes it); `gate` turns it on or off for later steps.
    pub(crate) fn install_steering(&mut self, st: Option<&Steering>, gate: Arc<AtomicBool>) -> Result<(), WgpuError> {
        self.steer = None;
        // Steps recorded ahead hold the previous steering's bindings: record them again.
        self.prepared.iter_mut().for_each(|p| *p = None);
        let Some(st) = st else { return Ok(()) };
        let (e, k, m) = (self.cfg.n_embd, self.cfg.n_expert_used, self.work.tokens.len());
        let (first, n_layers) = (self.range.first, self.layers.len());
        let mut dirs = Vec::with_capacity(st.slots() * n_layers * e);
        for s in 0..st.slots() {
            (first..first + n_layers).for_each(|il| dirs.extend_from_slice(st.direction(s, il)));
        }
        let dirs = GpuBuffer::from_slice(&self.gpu, "steering directions", &dirs)?;
        let ctl = GpuBuffer::new(&self.gpu, "steering control", 2 * st.slots() + m)?;
        let scales: Vec<u32> = st.scales().iter().flat_map(|&(f, a)| [f.to_bits(), a.to_bits()]).collect();
        ctl.write_u32(&self.gpu, &scales)?;
        let t = SteerTables { dirs: &dirs, ctl: &ctl, slots: st.slots(), n_layers };
        let (wk, nmax) = (&self.work, m as u32);
        let ops = (0..n_layers)
            .map(|li| {
                let attn = Steer::new(&self.gpu, &wk.y, 1, None, e, &t, li, SteerSite::Attn, nmax)?;
                let ffn = Steer::new(&self.gpu, &wk.moe.out, k, self.layers[li].info.shared_expert.then_some(&wk.moe.sh_out), e, &t, li, SteerSite::Ffn, nmax)?;
                Ok((attn, ffn))
            })
            .collect::<Result<Vec<_>, WgpuError>>()?;
        self.steer = Some(SteerState { _dirs: dirs, ctl, ops, slots: st.slots(), gate, rows: Vec::new(), flags: Vec::with_capacity(m) });
        Ok(())
    }

    /// The rows of later batched steps that are steered (empty: all).
    pub(crate) fn set_steer_rows(&mut self, rows: &[bool]) {
        if let Some(s) = &mut self.steer {
            s.rows.clear();
            s.rows.extend_from_slice(rows);
        }
    }

    /// Writes the flags of a step of `n` rows (nothing without steering).
    pub(crate) fn write_steer_flags(&mut self, n: usize) -> Result<(), WgpuError> {
        let Some(s) = &mut self.steer else { return Ok(()) };
        let on = s.gate.load(Ordering::Relaxed);
        s.flags.clear();
        s.flags.extend((0..n).map(|r| (on && s.rows.get(r).is_none_or(|&x| x)) as u32));
        let words: &[u32] = &s.flags;
        self.gpu.queue.write_buffer(&s.ctl.buffer, 4 * 2 * s.slots as u64, bytemuck::cast_slice(words));
        Ok(())
    }
}
