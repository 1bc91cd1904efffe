//! The CUDA backend of an engine: the stage's layers on one GPU, or split into contiguous parts over
//! several GPUs (`--cuda-devices 0,1,...`), each part owning its layers' weights and KV; the hidden state
//! passes from one part to the next through a reused host buffer (no allocation per token).
use crate::backend::Backend;
use crate::device_stage::DeviceStage;
use crate::engine::CudaWeights;
use ds4_cuda::{CudaStage, WeightPlace};
use ds4_model::memplan::ChunkFit;
use ds4_model::{KvState, LayerRange, Logits, ModelError, Result, Stage};

pub struct CudaPipeline {
    pub stages: Vec<CudaStage>,
    hidden: Vec<f32>,
}

/// Splits `range` into `n` contiguous parts of (nearly) equal layer counts.
pub fn split_layers(range: LayerRange, n: usize) -> Vec<LayerRange> {
    let total = range.last - range.first + 1;
    let n = n.clamp(1, total);
    let mut parts = Vec::with_capacity(n);
    let mut first = range.first;
    for i in 0..n {
        let len = total / n + usize::from(i < total % n);
        let last = first + len - 1;
        parts.push(LayerRange { first, last, embed: range.embed && i == 0, head: range.head && i == n - 1 });
        first = last + 1;
    }
    parts
}

/// Where the weights go: `Auto` reads them in place on an integrated GPU (it shares the host's
/// memory: a copy would only compete with the file's pages), copies them to a discrete one.
pub fn weight_place(mode: CudaWeights, devices: &[usize]) -> Result<WeightPlace> {
    Ok(match mode {
        CudaWeights::Device => WeightPlace::Device,
        CudaWeights::Host => WeightPlace::Host,
        CudaWeights::Auto => {
            let mut all = true;
            for &d in devices.iter().chain(devices.is_empty().then_some(&0)) {
                all &= ds4_cuda::integrated(d).map_err(|e| ModelError::Invalid(format!("cuda: {e}")))?;
            }
            if all { WeightPlace::Host } else { WeightPlace::Device }
        }
    })
}

impl CudaPipeline {
    /// The stage's layers on `devices`, holding `slots` KV states (sessions decoded together by
    /// `forward_batch`; one GPU only). `deterministic`: a batch runs each session as its own decode
    /// step (bit-identical to decoding it alone). With `WeightPlace::Host` the parts read `stage`'s
    /// mapped weights while they run: `stage` must outlive the pipeline.
    pub fn load(stage: &Stage, ctx: usize, fit: ChunkFit, devices: &[usize], place: WeightPlace, slots: usize, deterministic: bool) -> Result<Self> {
        if slots > 1 && devices.len() > 1 {
            return Err(ModelError::Invalid(format!(
                "cuda: batched decode of {slots} sessions (--batched-session / --concurrency) runs on one GPU; with --cuda-devices {} use 1 session, or one device",
                devices.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",")
            )));
        }
        let mut stages = if devices.len() <= 1 {
            vec![CudaStage::new_fitting(stage, ctx, fit, stage.w.range, devices.first().copied().unwrap_or(0), place, slots)?]
        } else {
            // Each part takes the largest chunk that fits its GPU; the pipeline runs at the smallest.
            let parts = split_layers(stage.w.range, devices.len());
            parts.iter().zip(devices).map(|(&p, &d)| CudaStage::new_fitting(stage, ctx, fit, p, d, place, 1)).collect::<Result<Vec<_>>>()?
        };
        for s in stages.iter_mut() {
            s.ops.set_exact_batches(deterministic);
        }
        Ok(Self { stages, hidden: Vec::new() })
    }

    /// Copies every part's device KV state into `kv` (at `kv.pos`, which the device must hold).
    pub fn download_kv(&mut self, kv: &mut KvState) -> Result<()> {
        self.stages.iter_mut().try_for_each(|s| s.download_kv(kv))
    }

    /// Makes `kv` every part's device state (the next forward call continues from `kv.pos`).
    pub fn upload_kv(&mut self, kv: &KvState) -> Result<()> {
        self.stages.iter_mut().try_for_each(|s| s.upload_kv(kv))
    }

    /// Same contract as `Stage::forward`: every part sees the same positions; the last one makes logits.
    pub fn forward(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits) -> Result<&[f32]> {
        let carried = self.through_parts(kv, tokens, hidden_in)?;
        let input = if carried { Some(&self.hidden[..]) } else { hidden_in };
        self.stages.last_mut().expect("a pipeline has at least one stage").forward(kv, tokens, input, want)
    }

    /// The greedy next token after `tokens` and its log-probability (the argmax of the last logits
    /// row, taken on the device). `hidden_in` as in `forward`.
    pub fn forward_argmax(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>) -> Result<(u32, f32)> {
        let carried = self.through_parts(kv, tokens, hidden_in)?;
        let input = if carried { Some(&self.hidden[..]) } else { hidden_in };
        self.stages.last_mut().expect("a pipeline has at least one stage").forward_argmax(kv, tokens, input)
    }

    /// The HC streams the last part produced in the last forward call (n × hc_dim), downloaded.
    pub fn hidden(&mut self, n: usize) -> Result<&[f32]> { self.stages.last_mut().expect("a pipeline has at least one stage").hidden(n) }

    /// The last logits row of the last forward call, downloaded from the last part.
    pub fn last_logits(&mut self) -> Result<&[f32]> { self.stages.last_mut().expect("a pipeline has at least one stage").last_logits() }

    /// Runs every part but the last, leaving kv.pos where it was; true when the last part's input is
    /// the carried hidden state.
    fn through_parts(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>) -> Result<bool> {
        let n = tokens.len();
        let pos = kv.pos;
        let nparts = self.stages.len();
        let mut carried = false;
        for (i, st) in self.stages[..nparts - 1].iter_mut().enumerate() {
            kv.pos = pos;
            let input = if i == 0 { hidden_in } else { Some(&self.hidden[..]) };
            st.forward(kv, tokens, input, Logits::None)?;
            let h = st.hidden(n)?;
            self.hidden.clear();
            self.hidden.extend_from_slice(h);
            carried = true;
        }
        kv.pos = pos;
        Ok(carried)
    }

    /// Per-kernel profiles of every part (DS4_CUDA_PROFILE=1).
    pub fn profile_report(&mut self) -> Option<String> {
        let reports: Vec<String> = self.stages.iter_mut().filter_map(|s| s.profile_report()).collect();
        (!reports.is_empty()).then(|| reports.join("\n"))
    }
}

/// A GPU stage error as the model's error type.
fn gpu_err(e: ds4_gpu::GpuError) -> ModelError { ModelError::Invalid(format!("cuda: {e}")) }

impl DeviceStage for CudaPipeline {
    fn backend(&self) -> Backend { Backend::Cuda }

    fn rows(&self) -> usize { self.stages.iter().map(CudaStage::rows).min().unwrap_or(1) }

    fn forward(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits) -> Result<&[f32]> {
        CudaPipeline::forward(self, kv, tokens, hidden_in, want)
    }

    fn forward_argmax(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>) -> Result<(u32, f32)> {
        CudaPipeline::forward_argmax(self, kv, tokens, hidden_in)
    }

    fn last_logits(&mut self) -> Result<&[f32]> { CudaPipeline::last_logits(self) }

    /// On one GPU (where speculative verification runs, the one caller).
    fn forward_picks(&mut self, kv: &mut KvState, tokens: &[u32]) -> Result<&[(u32, f32)]> {
        match self.stages.as_mut_slice() {
            [one] => one.forward_picks(kv, tokens),
            _ => Err(ModelError::Invalid("cuda: verify rows picked on the device run on one GPU, not over several --cuda-devices parts".into())),
        }
    }

    fn logits_row(&mut self, row: usize) -> Result<&[f32]> { self.stages.last_mut().expect("a pipeline has at least one stage").logits_row(row) }

    fn hidden(&mut self, n: usize) -> Result<&[f32]> { CudaPipeline::hidden(self, n) }

    fn download_kv(&mut self, kv: &mut KvState) -> Result<()> { CudaPipeline::download_kv(self, kv) }

    fn upload_kv(&mut self, kv: &KvState) -> Result<()> { CudaPipeline::upload_kv(self, kv) }

    /// On the last part's GPU (it holds the output matrix the drafter reads).
    fn mtp_drafter(&mut self, mtp: &Stage, ctx: usize) -> Result<(Box<dyn crate::drafter::DeviceDrafter>, u64)> {
        let d = self.stages.last().expect("a pipeline has at least one stage").mtp_drafter(mtp, ctx)?;
        let bytes = d.ops().device_bytes();
        Ok((Box::new(d), bytes))
    }

    // Speculative verification on one GPU (the verify steps run as exact rows: each its decode step).
    fn can_journal(&self) -> bool { matches!(self.stages.as_slice(), [one] if one.can_journal()) }

    fn begin_journal(&mut self, kv: &KvState) -> Result<()> {
        match self.stages.as_mut_slice() {
            [one] => one.begin_journal(kv).map_err(gpu_err),
            _ => Err(ModelError::Invalid("cuda: speculative decoding (--mtp) runs on one GPU, not over several --cuda-devices parts".into())),
        }
    }

    fn rollback(&mut self, kv: &mut KvState, pos: usize) -> Result<()> {
        match self.stages.as_mut_slice() {
            [one] => one.rollback(kv, pos).map_err(gpu_err),
            _ => Err(ModelError::Invalid("cuda: speculative decoding (--mtp) runs on one GPU".into())),
        }
    }

    fn end_journal(&mut self) {
        if let [one] = self.stages.as_mut_slice() {
            one.end_journal();
        }
    }

    fn kv_slots(&self) -> usize { if self.stages.len() == 1 { self.stages[0].slots() } else { 1 } }

    fn forward_batch(&mut self, kvs: &mut [&mut KvState], tokens: &[u32]) -> Result<&[f32]> {
        match self.stages.as_mut_slice() {
            [one] => one.forward_batch(kvs, tokens),
            _ => Err(ModelError::Invalid("cuda: batched decode runs on one GPU, not over several --cuda-devices parts".into())),
        }
    }

    /// Device allocations and weight uploads so far, and the per-kernel profile when enabled
    /// (DS4_CUDA_PROFILE=1).
    fn report(&mut self) -> Option<String> {
        let s = CudaStage::stats();
        let mut r = format!("cuda: {} device allocations, {} weight uploads so far", s.device_allocs, s.weight_uploads);
        if let Some(p) = self.profile_report() {
            r.push('\n');
            r.push_str(&p);
        }
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_split_is_contiguous_and_balanced() {
        let r = LayerRange { first: 0, last: 42, embed: true, head: true };
        let p = split_layers(r, 4);
        assert_eq!(p.iter().map(|x| x.last - x.first + 1).collect::<Vec<_>>(), vec![11, 11, 11, 10]);
        assert_eq!((p[0].first, p[3].last), (0, 42));
        assert!(p.windows(2).all(|w| w[1].first == w[0].last + 1));
        assert!(p[0].embed && !p[1].embed && !p[2].head && p[3].head);
        assert_eq!(split_layers(r, 1), vec![r]);
        // More devices than layers: one layer each.
        let small = LayerRange { first: 3, last: 4, embed: false, head: true };
        assert_eq!(split_layers(small, 5).len(), 2);
    }
}
