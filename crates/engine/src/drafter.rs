//! The MTP drafter a session drafts with, whatever the backend: the CPU block (`ds4_model::mtp::Mtp`)
//! on the CPU backend, the device drafter (`ds4_gpu::GpuMtp`: the block, its inputs and its head on the
//! GPU that runs the main model) on a GPU backend. `speculative.rs` drives either through [`Drafter`],
//! so the session's speculative loop is written once.
use crate::error::EngineError;
use ds4_model::mtp::Mtp;
use ds4_model::{KvState, Stage, Weights};

type Result<T, E = ds4_model::ModelError> = std::result::Result<T, E>;

/// The drafter on the device that runs the main model (an object-safe view of `ds4_gpu::GpuMtp`): the
/// `Mtp::forward` contract with the cache on the device (`kv` carries its position), recursive drafts
/// from the block's own output row kept on the device, and an undo journal for them.
pub(crate) trait DeviceDrafter: Send {
    fn forward(&mut self, main: &Weights, kv: &mut KvState, hidden: &[f32], tokens: &[u32], logits: bool) -> Result<&[f32]>;
    /// The pair (the block's output row of the last pair run, `token`): logits of the token after it.
    fn forward_own(&mut self, main: &Weights, kv: &mut KvState, token: u32) -> Result<&[f32]>;
    fn begin_journal(&mut self, kv: &KvState) -> Result<()>;
    /// Back to the journal's start.
    fn rollback(&mut self, kv: &mut KvState) -> Result<()>;
    fn end_journal(&mut self);
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn de(e: ds4_gpu::GpuError) -> ds4_model::ModelError { ds4_model::ModelError::Invalid(format!("MTP drafter: {e}")) }

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl<M: ds4_gpu::MtpOps + Send> DeviceDrafter for ds4_gpu::GpuMtp<M> {
    fn forward(&mut self, main: &Weights, kv: &mut KvState, hidden: &[f32], tokens: &[u32], logits: bool) -> Result<&[f32]> {
        ds4_gpu::GpuMtp::forward(self, main, kv, hidden, tokens, logits).map_err(de)
    }
    fn forward_own(&mut self, main: &Weights, kv: &mut KvState, token: u32) -> Result<&[f32]> { ds4_gpu::GpuMtp::forward_own(self, main, kv, token).map_err(de) }
    fn begin_journal(&mut self, kv: &KvState) -> Result<()> { ds4_gpu::GpuMtp::begin_journal(self, kv).map_err(de) }
    fn rollback(&mut self, kv: &mut KvState) -> Result<()> { ds4_gpu::GpuMtp::rollback(self, kv).map_err(de) }
    fn end_journal(&mut self) { ds4_gpu::GpuMtp::end_journal(self) }
}

/// An engine's device drafter, and whose cache it holds: the device keeps one drafter cache, the
/// sessions take turns with it.
pub(crate) struct DeviceMtp {
    pub dev: Box<dyn DeviceDrafter>,
    /// Device bytes of the drafter (weights, cache, buffers; the output matrix is the stage's).
    pub bytes: u64,
    /// (session drafter id, position) of the cache on the device; None: unknown.
    owner: Option<(u64, usize)>,
}

impl DeviceMtp {
    pub fn new(dev: Box<dyn DeviceDrafter>, bytes: u64) -> Self { Self { dev, bytes, owner: None } }

    /// Makes `kv` (drafter `id`'s cache) the device's: when the device holds another session's cache,
    /// or this one at another position (a restored snapshot), the cache starts over at position 0. Only
    /// draft quality depends on the cache, never the output.
    fn claim(&mut self, id: u64, kv: &mut KvState) {
        if self.owner != Some((id, kv.pos)) {
            kv.pos = 0;
        }
    }

    /// `DeviceDrafter::forward` in drafter `id`'s cache.
    pub fn forward(&mut self, main: &Stage, id: u64, kv: &mut KvState, hidden: &[f32], tokens: &[u32], logits: bool) -> Result<&[f32], EngineError> {
        self.claim(id, kv);
        let r = self.dev.forward(&main.w, kv, hidden, tokens, logits);
        self.owner = r.is_ok().then_some((id, kv.pos));
        Ok(r?)
    }

    /// `DeviceDrafter::forward_own` in drafter `id`'s cache.
    pub fn forward_own(&mut self, main: &Stage, id: u64, kv: &mut KvState, token: u32) -> Result<&[f32], EngineError> {
        self.claim(id, kv);
        let r = self.dev.forward_own(&main.w, kv, token);
        self.owner = r.is_ok().then_some((id, kv.pos));
        Ok(r?)
    }
}

/// The drafter of one speculative step.
pub(crate) enum Drafter<'a> {
    Cpu(&'a mut Mtp),
    /// The device drafter; `cpu` is the block on the host (its configuration, a fresh cache's shape).
    Device { dev: &'a mut DeviceMtp, cpu: &'a Mtp },
}

impl Drafter<'_> {
    /// A fresh drafter cache for `ctx` positions.
    pub fn new_kv(&self, ctx: usize) -> KvState {
        match self {
            Drafter::Cpu(m) => m.new_kv(ctx),
            Drafter::Device { cpu, .. } => cpu.new_kv(ctx),
        }
    }

    /// Runs the pairs (`Mtp::forward`) in drafter `id`'s cache `kv`.
    pub fn forward(&mut self, main: &Stage, id: u64, kv: &mut KvState, hidden: &[f32], tokens: &[u32], logits: bool) -> Result<&[f32], EngineError> {
        match self {
            Drafter::Cpu(m) => Ok(m.forward(main, kv, hidden, tokens, logits)?),
            Drafter::Device { dev, .. } => dev.forward(main, id, kv, hidden, tokens, logits),
        }
    }

    /// A recursive draft: the block's own output row of the last pair and `token`.
    pub fn forward_own(&mut self, main: &Stage, id: u64, kv: &mut KvState, token: u32) -> Result<&[f32], EngineError> {
        match self {
            Drafter::Cpu(m) => {
                let h = m.last_hidden().to_vec();
                Ok(m.forward(main, kv, &h, std::slice::from_ref(&token), true)?)
            }
            Drafter::Device { dev, .. } => dev.forward_own(main, id, kv, token),
        }
    }

    /// Starts undoable drafts at `kv.pos`.
    pub fn begin_journal(&mut self, kv: &mut KvState) -> Result<(), EngineError> {
        match self {
            Drafter::Cpu(_) => {
                kv.begin_journal();
                Ok(())
            }
            Drafter::Device { dev, .. } => Ok(dev.dev.begin_journal(kv)?),
        }
    }

    /// Back to `base`, the journal's start.
    pub fn rollback(&mut self, id: u64, kv: &mut KvState, base: usize) -> Result<(), EngineError> {
        match self {
            Drafter::Cpu(_) => kv.rollback(base).map_err(EngineError::Invalid),
            Drafter::Device { dev, .. } => {
                let r = dev.dev.rollback(kv);
                dev.owner = r.is_ok().then_some((id, kv.pos));
                if r.is_ok() && kv.pos != base {
                    return Err(EngineError::Invalid(format!("MTP drafter rolled back to {}, not {base}", kv.pos)));
                }
                Ok(r?)
            }
        }
    }

    pub fn end_journal(&mut self, kv: &mut KvState) {
        match self {
            Drafter::Cpu(_) => kv.end_journal(),
            Drafter::Device { dev, .. } => dev.dev.end_journal(),
        }
    }
}
