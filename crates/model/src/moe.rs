//! Router of the mixture of experts: sqrt-softplus scores, biased top-k or hash selection, normalised weights.
use crate::ops::softplus;

/// Chooses `k` experts for one token and their weights.
/// `bias` only affects which experts are chosen; `hash` (token's row of tid2eid) replaces the choice.
pub fn route(
    logits: &[f32],
    bias: Option<&[f32]>,
    hash: Option<&[u32]>,
    k: usize,
    normalize: bool,
    scale: f32,
    ids: &mut [u32],
    weights: &mut [f32],
) {
    let p = |e: usize| softplus(logits[e]).sqrt();
    match hash {
        Some(h) => ids.copy_from_slice(&h[..k]),
        None => {
            // Partial selection of the k best biased scores, ties to the lowest index.
            let sel = |e: usize| p(e) + bias.map_or(0.0, |b| b[e]);
            for slot in 0..k {
                let mut best = u32::MAX;
                let mut best_s = f32::NEG_INFINITY;
                for e in 0..logits.len() {
                    if ids[..slot].contains(&(e as u32)) {
                        continue;
                    }
                    let s = sel(e);
                    if best == u32::MAX || s > best_s {
                        best = e as u32;
                        best_s = s;
                    }
                }
                ids[slot] = best;
            }
        }
    }
    let mut sum = 0.0;
    for (w, &e) in weights.iter_mut().zip(ids.iter()) {
        *w = p(e as usize);
        sum += *w;
    }
    let denom = if normalize { sum.max(6.103_515_6e-5) } else { 1.0 };
    weights.iter_mut().for_each(|w| *w = *w / denom * scale);
}

/// SwiGLU with the V4 clamps: silu(min(a, c))·clamp(b, −c, c).
pub fn swiglu_clamped(a: f32, b: f32, c: f32) -> f32 {
    let a = a.min(c);
    let b = b.clamp(-c, c);
    crate::ops::silu(a) * b
}
