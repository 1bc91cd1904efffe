//! Attention of one query head over raw-window and compressed rows, with a per-head sink logit.
use crate::ops::dot;

/// Softmax over `{q·row/sqrt(D)} ∪ {sink}` and the weighted sum of rows (rows are both K and V).
/// `rows` yields the candidate rows; `scores` is scratch of at least the candidate count.
pub fn attend_head<'a>(
    q: &[f32],
    rows: impl Iterator<Item = &'a [f32]> + Clone,
    sink: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let scale = 1.0 / (q.len() as f32).sqrt();
    scores.clear();
    let mut mx = sink;
    for r in rows.clone() {
        let s = dot(q, r) * scale;
        mx = mx.max(s);
        scores.push(s);
    }
    let mut den = (sink - mx).exp();
    for s in scores.iter_mut() {
        *s = (*s - mx).exp();
        den += *s;
    }
    out.fill(0.0);
    for (r, &p) in rows.zip(scores.iter()) {
        let w = p / den;
        out.iter_mut().zip(r).for_each(|(o, &v)| *o += w * v);
    }
}

/// Indexer relevance of each compressed row: Σ_h w[h]·relu(q_h·k_c).
pub fn indexer_scores(q: &[f32], w: &[f32], keys: &[f32], dim: usize, n_rows: usize, out: &mut Vec<f32>) {
    out.clear();
    for c in 0..n_rows {
        let k = &keys[c * dim..(c + 1) * dim];
        let mut s = 0.0;
        for (h, &wh) in w.iter().enumerate() {
            let d = dot(&q[h * dim..(h + 1) * dim], k);
            if d > 0.0 {
                s += wh * d;
            }
        }
        out.push(s);
    }
}

/// Indices of the `k` largest scores, ties broken by the lowest index; returned in ascending index order.
/// `scratch` holds all candidate indices; `out` receives at most `k`.
pub fn top_k_indices(scores: &[f32], k: usize, scratch: &mut Vec<u32>, out: &mut Vec<u32>) {
    scratch.clear();
    scratch.extend(0..scores.len() as u32);
    if k < scores.len() {
        scratch.select_nth_unstable_by(k, |&a, &b| scores[b as usize].total_cmp(&scores[a as usize]).then(a.cmp(&b)));
        scratch.truncate(k);
    }
    scratch.sort_unstable();
    out.clear();
    out.extend_from_slice(scratch);
}
