//! The device MTP drafter (`ds4_gpu::GpuMtp`, any backend) against the CPU block (`Mtp::forward`): the
//! sequence of pair runs, recursive drafts, a rollback and a run longer than the window that the
//! backend tests (`mtp_drafter_wgpu.rs`, `mtp_drafter_cuda.rs`) check.
use ds4_engine::Engine;
use ds4_gpu::{GpuMtp, MtpOps};
use ds4_model::{KvState, Logits};

use super::{tokens, CTX};

/// Largest |a - b| over the largest |b| (NaN counts as unbounded).
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, &x| m.max(x.abs() as f64)).max(1e-30);
    a.iter().zip(b).map(|(&x, &y)| ((x - y) as f64).abs()).fold(0f64, |m, d| if d.is_nan() || m.is_nan() { f64::NAN } else { m.max(d) }) / scale
}

fn argmax(l: &[f32]) -> u32 { ds4_tokenizer::sampling::argmax(l) }

/// The largest error of each kind of draft step (relative to the largest CPU logit).
pub struct Errors {
    pub pairs: f64,
    pub recursive: f64,
    pub after_rollback: f64,
    pub cut: f64,
}

impl Errors {
    pub fn max(&self) -> f64 { self.pairs.max(self.recursive).max(self.after_rollback) }
}

/// The drafter `build` makes (from the engine's main stage and its MTP block) against the CPU block
/// of `cpu` (an engine loaded with the MTP file). `counters` reads what the device created so far
/// (buffers, bindings, uploads...): a draft step must leave it unchanged.
pub fn compare<M: MtpOps>(cpu: &mut Engine, build: impl FnOnce(&Engine) -> GpuMtp<M>, counters: impl Fn(&GpuMtp<M>) -> Vec<u64>) -> Errors {
    let v = cpu.cfg().n_vocab;
    let hd = cpu.cfg().hc_dim();
    let swa = cpu.cfg().swa;
    // Hidden rows of the main model (on the CPU) for a prompt: pair i = (hidden row i, prompt[i + 1]).
    let prompt = tokens(swa + 40, 5, v);
    let n = prompt.len();
    let mut kv = cpu.new_kv();
    cpu.forward(&mut kv, &prompt, None, Logits::None).unwrap();
    let hidden = cpu.stage.hidden(n).to_vec();
    let h = |a: usize, b: usize| &hidden[a * hd..b * hd];
    let t = |a: usize, b: usize| &prompt[a + 1..b + 1];
    let mut dev = build(cpu);
    let m = cpu.mtp.as_mut().unwrap();
    let cpu_main = &cpu.stage;
    let w = &cpu_main.w;
    let (mut ckv, mut gkv): (KvState, KvState) = (m.model.new_kv(CTX), m.model.new_kv(CTX));
    let mut e = Errors { pairs: 0.0, recursive: 0.0, after_rollback: 0.0, cut: 0.0 };
    // Ten pairs without logits, then one pair, then four pairs with logits.
    m.model.forward(cpu_main, &mut ckv, h(0, 10), t(0, 10), false).unwrap();
    assert!(dev.forward(w, &mut gkv, h(0, 10), t(0, 10), false).unwrap().is_empty());
    for (a, b) in [(10, 11), (11, 15)] {
        let want = m.model.forward(cpu_main, &mut ckv, h(a, b), t(a, b), true).unwrap().to_vec();
        let got = dev.forward(w, &mut gkv, h(a, b), t(a, b), true).unwrap().to_vec();
        e.pairs = e.pairs.max(rel_err(&got, &want));
        assert_eq!(gkv.pos, ckv.pos);
    }

    // A run longer than the window, then one more pair.
    let (a, b) = (15, 15 + swa + 8);
    let want = m.model.forward(cpu_main, &mut ckv, h(a, b), t(a, b), true).unwrap().to_vec();
    let got = dev.forward(w, &mut gkv, h(a, b), t(a, b), true).unwrap().to_vec();
    assert_eq!(gkv.pos, swa, "the device restarted its cache with the window's pairs");
    e.cut = rel_err(&got, &want);
    let (a, b) = (b, b + 1);
    let want = m.model.forward(cpu_main, &mut ckv, h(a, b), t(a, b), true).unwrap().to_vec();
    let got = dev.forward(w, &mut gkv, h(a, b), t(a, b), true).unwrap().to_vec();
    e.cut = e.cut.max(rel_err(&got, &want));

    // Recursive drafts (the block's own output row and the CPU's top-1), journaled and rolled back.
    // Past the window's length: the drafts overwrite ring rows the next pairs read (half the window:
    // on these random weights a few overwritten rows move the logits by less than the bound).
    let mut d = argmax(&want);
    let (cbase, gbase) = (ckv.pos, gkv.pos);
    ckv.begin_journal();
    dev.begin_journal(&gkv).unwrap();
    let before = counters(&dev);
    for _ in 0..swa / 2 {
        let own = m.model.last_hidden().to_vec();
        let want = m.model.forward(cpu_main, &mut ckv, &own, &[d], true).unwrap().to_vec();
        let got = dev.forward_own(w, &mut gkv, d).unwrap().to_vec();
        e.recursive = e.recursive.max(rel_err(&got, &want));
        d = argmax(&want);
    }
    assert_eq!(counters(&dev), before, "a draft step created, bound or uploaded something");
    ckv.rollback(cbase).unwrap();
    ckv.end_journal();
    dev.rollback(&mut gkv).unwrap();
    dev.end_journal();
    assert_eq!(gkv.pos, gbase);

    // After the rollback the cache is the one before the drafts.
    let (a, b) = (b, b + 5);
    let want = m.model.forward(cpu_main, &mut ckv, h(a, b), t(a, b), true).unwrap().to_vec();
    let got = dev.forward(w, &mut gkv, h(a, b), t(a, b), true).unwrap().to_vec();
    e.after_rollback = rel_err(&got, &want);
    e
}
