//! Learned-gate pooling of KV windows into compressed rows (ratio 4 overlapping, ratio 128 disjoint).
use crate::kv::CompressorState;
use crate::ops::rms_norm;
use crate::rope::Rope;

/// The element range of `st.kv` and of `st.score` that `push` at `pos` overwrites (for an undo log):
/// the token's row, and for an overlapping compressor whose window closes, the previous-window rows too.
pub fn touched(st: &CompressorState, pos: usize) -> std::ops::Range<usize> {
    let (r, w) = (st.ratio, st.width);
    let slot = pos % r;
    if r == 4 && (pos + 1) % r == 0 {
        return 0..2 * r * w;
    }
    let row = if r == 4 { r + slot } else { slot };
    row * w..(row + 1) * w
}

/// Pushes one token's projections (`kv`, `gate` of width coff·D, `ape` row for its window offset).
/// Returns true when the window closed and `out` (D wide) holds the pooled, normed, roped row.
pub fn push(
    st: &mut CompressorState,
    pos: usize,
    kv: &[f32],
    gate: &[f32],
    ape: &[f32],
    norm: &[f32],
    eps: f32,
    rope: &Rope,
    out: &mut [f32],
) -> bool {
    let r = st.ratio;
    let w = st.width;
    let slot = pos % r;
    let row = if r == 4 { r + slot } else { slot };
    st.kv[row * w..(row + 1) * w].copy_from_slice(kv);
    for j in 0..w {
        st.score[row * w + j] = gate[j] + ape[slot * w + j];
    }
    if (pos + 1) % r != 0 {
        return false;
    }
    let d = out.len();
    if r == 4 {
        // Candidates: previous window on lane Ca (channels [0,d)), current window on lane Cb ([d,2d)).
        for j in 0..d {
            let cand = |k: usize| -> (f32, f32) {
                if k < 4 { (st.score[k * w + j], st.kv[k * w + j]) } else { (st.score[k * w + d + j], st.kv[k * w + d + j]) }
            };
            out[j] = pool((0..8).map(cand));
        }
        // The current window becomes the previous one.
        let (prev, cur) = st.kv.split_at_mut(4 * w);
        prev.copy_from_slice(&cur[..4 * w]);
        let (prev, cur) = st.score.split_at_mut(4 * w);
        prev.copy_from_slice(&cur[..4 * w]);
    } else {
        for j in 0..d {
            out[j] = pool((0..r).map(|k| (st.score[k * w + j], st.kv[k * w + j])));
        }
    }
    rms_norm(out, Some(norm), eps);
    rope.apply(out, pos + 1 - r, false);
    true
}

/// Softmax-weighted sum of (score, value) pairs; -inf scores contribute nothing.
fn pool(it: impl Iterator<Item = (f32, f32)> + Clone) -> f32 {
    let m = it.clone().fold(f32::NEG_INFINITY, |m, (s, _)| m.max(s));
    if m == f32::NEG_INFINITY {
        return 0.0;
    }
    let (mut den, mut num) = (0f32, 0f32);
    for (s, v) in it {
        let e = (s - m).exp();
        den += e;
        num += e * v;
    }
    num / den
}
