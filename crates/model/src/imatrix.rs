//! Routed-expert importance matrix (ds4's `--imatrix-*`): for every layer and expert, the mean square
//! of each input column of its matrices over the tokens routed to it. The gate and up projections read
//! the FFN's normalised input (one statistic serves both); the down projection reads the expert's
//! weighted SwiGLU output. Written as a legacy llama.cpp `.dat`, laid out as ds4 writes it: an i32
//! entry count (3 per layer), then per layer the gate, up and down tensors' entries, each an i32 name
//! length, the name, i32 ncall (1), i32 value count (n_expert x columns), and per expert its columns'
//! mean squares (1.0 for an expert no token reached); then i32 chunks (layer batches observed) and the
//! dataset path (i32 length, bytes). Sums are f32, accumulated in token order as ds4 does.
use std::io::Write;
use std::path::Path;

#[derive(Debug, Clone)]
pub struct Imatrix {
    first_layer: usize,
    n_layers: usize,
    n_expert: usize,
    n_embd: usize,
    ff: usize,
    gate_up: Vec<f32>,
    gate_up_count: Vec<u32>,
    down: Vec<f32>,
    down_count: Vec<u32>,
    /// Layer batches observed (ds4's `chunks`: one per layer and forward call).
    pub chunks: u32,
    /// Expert routes observed (token x slot).
    pub routes: u64,
}

impl Imatrix {
    /// Statistics for layers `first_layer..first_layer + n_layers` of a model with `n_expert` experts of
    /// width `n_embd` -> `ff`.
    pub fn new(first_layer: usize, n_layers: usize, n_expert: usize, n_embd: usize, ff: usize) -> Self {
        Self {
            first_layer,
            n_layers,
            n_expert,
            n_embd,
            ff,
            gate_up: vec![0.0; n_layers * n_expert * n_embd],
            gate_up_count: vec![0; n_layers * n_expert],
            down: vec![0.0; n_layers * n_expert * ff],
            down_count: vec![0; n_layers * n_expert],
            chunks: 0,
            routes: 0,
        }
    }

    /// The rows routed to expert `ex` of layer `il` in one forward call, in token order: `x` their
    /// inputs (rows of `n_embd`), `mid` the down projection's inputs (rows of `ff`).
    pub fn observe(&mut self, il: usize, ex: usize, x: &[f32], mid: &[f32]) {
        let (e, ff) = (self.n_embd, self.ff);
        let slot = (il - self.first_layer) * self.n_expert + ex;
        let gu = &mut self.gate_up[slot * e..(slot + 1) * e];
        for row in x.chunks_exact(e) {
            gu.iter_mut().zip(row).for_each(|(s, &v)| *s += v * v);
        }
        let dn = &mut self.down[slot * ff..(slot + 1) * ff];
        for row in mid.chunks_exact(ff) {
            dn.iter_mut().zip(row).for_each(|(s, &v)| *s += v * v);
        }
        let rows = (x.len() / e) as u32;
        self.gate_up_count[slot] += rows;
        self.down_count[slot] += rows;
        self.routes += rows as u64;
    }

    /// Mean squares of layer `il`'s gate/up (`down` false) or down inputs: n_expert x columns, 1.0 for
    /// an expert with no token.
    pub fn means(&self, il: usize, down: bool) -> Vec<f32> {
        let (sums, counts, n) = if down { (&self.down, &self.down_count, self.ff) } else { (&self.gate_up, &self.gate_up_count, self.n_embd) };
        let l = il - self.first_layer;
        let mut out = Vec::with_capacity(self.n_expert * n);
        for ex in 0..self.n_expert {
            let c = counts[l * self.n_expert + ex];
            let s = &sums[(l * self.n_expert + ex) * n..(l * self.n_expert + ex + 1) * n];
            if c == 0 {
                out.extend(std::iter::repeat_n(1.0f32, n));
            } else {
                let inv = 1.0 / c as f32;
                out.extend(s.iter().map(|v| v * inv));
            }
        }
        out
    }

    /// Writes the `.dat` (see the module doc); `names(il)` gives layer `il`'s gate, up and down tensor
    /// names.
    pub fn write(&self, path: &Path, names: impl Fn(usize) -> [String; 3], dataset: &str) -> std::io::Result<()> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        let i32s = |f: &mut std::io::BufWriter<std::fs::File>, v: usize| -> std::io::Result<()> {
            let v = i32::try_from(v).map_err(|_| std::io::Error::other(format!("{v} does not fit the format's i32")))?;
            f.write_all(&v.to_le_bytes())
        };
        i32s(&mut f, 3 * self.n_layers)?;
        for il in self.first_layer..self.first_layer + self.n_layers {
            let [g, u, d] = names(il);
            for (name, down) in [(g, false), (u, false), (d, true)] {
                let vals = self.means(il, down);
                i32s(&mut f, name.len())?;
                f.write_all(name.as_bytes())?;
                i32s(&mut f, 1)?;
                i32s(&mut f, vals.len())?;
                for v in vals {
                    f.write_all(&v.to_le_bytes())?;
                }
            }
        }
        i32s(&mut f, self.chunks as usize)?;
        i32s(&mut f, dataset.len())?;
        f.write_all(dataset.as_bytes())?;
        f.into_inner().map_err(|e| e.into_error())?.sync_all()
    }
}

/// The prompts of an imatrix dataset (ds4's layout): blocks after lines holding
/// `===== DS4_IMATRIX_PROMPT` (the rest of such a line is a label), or the whole text when it has
/// none; each trimmed, empty ones skipped. Each is a rendered chat prompt (special tokens as text).
pub fn dataset_prompts(text: &str) -> Vec<&str> {
    const MARKER: &str = "===== DS4_IMATRIX_PROMPT";
    if !text.contains(MARKER) {
        return [text.trim()].into_iter().filter(|p| !p.is_empty()).collect();
    }
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(MARKER) {
        let after = &rest[at..];
        let Some(nl) = after.find('\n') else { break };
        let body = &after[nl + 1..];
        let end = body.find(MARKER).unwrap_or(body.len());
        let p = body[..end].trim();
        if !p.is_empty() {
            out.push(p);
        }
        rest = &body[end..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn means_per_expert_and_the_file_layout() {
        // 1 layer (index 2), 2 experts, n_embd 2, ff 3.
        let mut m = Imatrix::new(2, 1, 2, 2, 3);
        m.observe(2, 1, &[1.0, 2.0, 3.0, -4.0], &[1.0, 0.0, 2.0, 1.0, 1.0, 0.0]);
        m.chunks = 5;
        assert_eq!(m.means(2, false), vec![1.0, 1.0, 5.0, 10.0]);
        assert_eq!(m.means(2, true), vec![1.0, 1.0, 1.0, 1.0, 0.5, 2.0]);
        let p = std::env::temp_dir().join(format!("ds4-imatrix-{}.dat", std::process::id()));
        m.write(&p, |il| [format!("blk.{il}.ffn_gate_exps.weight"), format!("blk.{il}.ffn_up_exps.weight"), format!("blk.{il}.ffn_down_exps.weight")], "d.txt").unwrap();
        let b = std::fs::read(&p).unwrap();
        let i = |at: usize| i32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        assert_eq!(i(0), 3);
        let name = "blk.2.ffn_gate_exps.weight";
        assert_eq!((i(4) as usize, &b[8..8 + name.len()]), (name.len(), name.as_bytes()));
        let at = 8 + name.len();
        assert_eq!((i(at), i(at + 4)), (1, 4));
        let f = |at: usize| f32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        assert_eq!((f(at + 8), f(at + 16), f(at + 20)), (1.0, 5.0, 10.0));
        // Gate (4 values), up (4), down (6), then chunks and the dataset name.
        let names = "blk.2.ffn_gate_exps.weight".len() + "blk.2.ffn_up_exps.weight".len() + "blk.2.ffn_down_exps.weight".len();
        let entries = 3 * 12 + names + (4 + 4 + 6) * 4;
        assert_eq!(b.len(), 4 + entries + 4 + 4 + 5);
        assert_eq!(i(b.len() - 13), 5);
        assert_eq!((i(b.len() - 9), &b[b.len() - 5..]), (5, &b"d.txt"[..]));
        std::fs::remove_file(p).ok();
    }

    #[test]
    fn dataset_blocks_follow_the_marker_lines() {
        let t = "ignored\n===== DS4_IMATRIX_PROMPT 1\n  first\nprompt \n===== DS4_IMATRIX_PROMPT 2\n\n===== DS4_IMATRIX_PROMPT 3\nthird";
        assert_eq!(dataset_prompts(t), vec!["first\nprompt", "third"]);
        assert_eq!(dataset_prompts("  whole file  \n"), vec!["whole file"]);
        assert!(dataset_prompts(" \n").is_empty());
    }
}
