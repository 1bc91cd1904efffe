//! Directional activation steering (ds4's `--dir-steering-*`): a file holds one direction of
//! `n_embd` f32 per layer (`n_layer` x `n_embd`, little-endian, no header; Flash: 43 x 4096), and the
//! output `y` of a layer's attention and/or FFN sub-layer is edited before it enters the HC streams:
//! `y -= scale * v * dot(v, y)`. A positive scale removes the direction, a negative one amplifies it.
//! Up to [`MAX_SLOTS`] files apply one after the other at every layer, each with its own FFN and
//! attention scale. The MTP block is not steered (the file has no row for it).
use crate::error::{ModelError, Result};
use std::path::{Path, PathBuf};

/// Most directions applied at once (ds4's limit).
pub const MAX_SLOTS: usize = 8;
/// Scales are limited to this magnitude (ds4's range).
pub const MAX_SCALE: f32 = 100.0;

/// One `--dir-steering-file` with the scales given after it (before the next file).
#[derive(Debug, Clone, PartialEq)]
pub struct SteerSpec {
    pub file: PathBuf,
    /// `--dir-steering-ffn` (default 1 when a file is given).
    pub ffn: f32,
    /// `--dir-steering-attn` (default 0).
    pub attn: f32,
}

impl SteerSpec {
    pub fn new(file: PathBuf) -> Self { Self { file, ffn: 1.0, attn: 0.0 } }
}

/// Binds the flags of a command line into slots, by their positions on it: every file opens a slot,
/// and `--dir-steering-ffn` / `--dir-steering-attn` set the scale of the slot opened last before them
/// (the first slot when they come before any file; the last value wins), then checks the slot count
/// and the scales (no file is read). Arguments: (position, value).
pub fn bind(files: Vec<(usize, PathBuf)>, ffn: Vec<(usize, f32)>, attn: Vec<(usize, f32)>) -> Result<Vec<SteerSpec>> {
    if files.is_empty() {
        if !ffn.is_empty() || !attn.is_empty() {
            return Err(invalid("--dir-steering-ffn and --dir-steering-attn need --dir-steering-file FILE".into()));
        }
        return Ok(Vec::new());
    }
    let mut files = files;
    files.sort_by_key(|f| f.0);
    let at: Vec<usize> = files.iter().map(|f| f.0).collect();
    let mut specs: Vec<SteerSpec> = files.into_iter().map(|(_, f)| SteerSpec::new(f)).collect();
    let slot = |pos: usize| at.iter().rposition(|&p| p < pos).unwrap_or(0);
    let mut scales: Vec<(usize, Site, f32)> = ffn.into_iter().map(|(p, v)| (p, Site::Ffn, v)).chain(attn.into_iter().map(|(p, v)| (p, Site::Attn, v))).collect();
    scales.sort_by_key(|s| s.0);
    for (p, site, v) in scales {
        let s = &mut specs[slot(p)];
        match site {
            Site::Ffn => s.ffn = v,
            Site::Attn => s.attn = v,
        }
    }
    check_specs(&specs)?;
    Ok(specs)
}

/// Which sub-layer's output is edited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    Attn,
    Ffn,
}

/// The directions of one file and its scales.
#[derive(Debug, Clone)]
struct Slot {
    dirs: Vec<f32>,
    ffn: f32,
    attn: f32,
}

/// Loaded steering: what a stage applies (`Stage::steering`).
#[derive(Debug, Clone)]
pub struct Steering {
    slots: Vec<Slot>,
    n_embd: usize,
}

fn invalid(m: String) -> ModelError { ModelError::Invalid(m) }

/// Checks the specs against a model of `n_layer` layers of width `n_embd` without reading the
/// directions: slot count, scales, each file's size. Cheap enough to run before weights load.
pub fn check(specs: &[SteerSpec], n_layer: usize, n_embd: usize) -> Result<()> {
    check_specs(specs)?;
    for s in specs {
        let want = (n_layer * n_embd * 4) as u64;
        let len = std::fs::metadata(&s.file).map_err(|e| invalid(format!("--dir-steering-file {}: {e}", s.file.display())))?.len();
        if len != want {
            return Err(invalid(format!(
                "--dir-steering-file {}: {len} bytes, expected {want} ({n_layer} layers x {n_embd} f32 directions for this model)",
                s.file.display()
            )));
        }
    }
    Ok(())
}

/// The slot count and every scale.
fn check_specs(specs: &[SteerSpec]) -> Result<()> {
    if specs.len() > MAX_SLOTS {
        return Err(invalid(format!("--dir-steering-file given {} times: at most {MAX_SLOTS} directions apply at once", specs.len())));
    }
    for s in specs {
        check_scale("--dir-steering-ffn", s.ffn)?;
        check_scale("--dir-steering-attn", s.attn)?;
    }
    Ok(())
}

/// A scale must be finite and within ±[`MAX_SCALE`].
pub fn check_scale(flag: &str, v: f32) -> Result<()> {
    if v.is_finite() && v.abs() <= MAX_SCALE {
        Ok(())
    } else {
        Err(invalid(format!("{flag} {v}: expected a number from -{MAX_SCALE} to {MAX_SCALE}")))
    }
}

fn read_dirs(path: &Path, n_layer: usize, n_embd: usize) -> Result<Vec<f32>> {
    let bytes = std::fs::read(path).map_err(|e| invalid(format!("--dir-steering-file {}: {e}", path.display())))?;
    if bytes.len() != n_layer * n_embd * 4 {
        return Err(invalid(format!("--dir-steering-file {}: {} bytes, expected {}", path.display(), bytes.len(), n_layer * n_embd * 4)));
    }
    let dirs: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    if let Some(i) = dirs.iter().position(|v| !v.is_finite()) {
        return Err(invalid(format!("--dir-steering-file {}: value {i} (layer {}) is not finite", path.display(), i / n_embd)));
    }
    Ok(dirs)
}

impl Steering {
    /// Reads and checks every file (see [`check`]).
    pub fn load(specs: &[SteerSpec], n_layer: usize, n_embd: usize) -> Result<Self> {
        check(specs, n_layer, n_embd)?;
        let slots = specs.iter().map(|s| Ok(Slot { dirs: read_dirs(&s.file, n_layer, n_embd)?, ffn: s.ffn, attn: s.attn })).collect::<Result<_>>()?;
        Ok(Self { slots, n_embd })
    }

    /// Directions given in memory (`dirs[slot]` is `n_layer` x `n_embd`), with their (ffn, attn) scales.
    pub fn from_dirs(dirs: Vec<(Vec<f32>, f32, f32)>, n_embd: usize) -> Self {
        Self { slots: dirs.into_iter().map(|(dirs, ffn, attn)| Slot { dirs, ffn, attn }).collect(), n_embd }
    }

    pub fn slots(&self) -> usize { self.slots.len() }

    /// Slot `slot`'s direction for layer `il` (`n_embd` floats).
    pub fn direction(&self, slot: usize, il: usize) -> &[f32] { &self.slots[slot].dirs[il * self.n_embd..(il + 1) * self.n_embd] }

    /// (ffn, attn) scales of each slot.
    pub fn scales(&self) -> Vec<(f32, f32)> { self.slots.iter().map(|s| (s.ffn, s.attn)).collect() }

    /// Sets slot `slot`'s FFN scale (ds4's `/steer F`).
    pub fn set_ffn(&mut self, slot: usize, v: f32) -> Result<()> {
        check_scale("/steer", v)?;
        let s = self.slots.get_mut(slot).ok_or_else(|| invalid(format!("no steering slot {slot}")))?;
        s.ffn = v;
        Ok(())
    }

    /// A stable digest of the directions and scales (FNV-1a over their bits): KV state computed with
    /// steering is told apart from the plain model's (`ds4_kvstore::stage_identity`).
    pub fn fingerprint(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |x: u32| {
            for b in x.to_le_bytes() {
                h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        for s in &self.slots {
            eat(s.ffn.to_bits());
            eat(s.attn.to_bits());
            s.dirs.iter().for_each(|v| eat(v.to_bits()));
        }
        format!("{} slot(s) {h:016x}", self.slots.len())
    }

    /// Whether any slot edits `site`.
    pub fn edits(&self, site: Site) -> bool { self.slots.iter().any(|s| scale(s, site) != 0.0) }

    /// Edits the `n` rows of `y` (each `n_embd` wide), outputs of `site` in layer `il`, slot by slot.
    pub fn apply(&self, il: usize, site: Site, y: &mut [f32]) {
        let e = self.n_embd;
        for s in &self.slots {
            let f = scale(s, site);
            if f == 0.0 {
                continue;
            }
            let v = &s.dirs[il * e..(il + 1) * e];
            for row in y.chunks_exact_mut(e) {
                // f64 dot: the edit does not depend on the summation order of a 4096-wide row.
                let d = row.iter().zip(v).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>();
                let k = (f as f64 * d) as f32;
                row.iter_mut().zip(v).for_each(|(r, &b)| *r -= k * b);
            }
        }
    }
}

fn scale(s: &Slot, site: Site) -> f32 {
    match site {
        Site::Attn => s.attn,
        Site::Ffn => s.ffn,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_direction_is_removed_at_scale_one_and_doubled_at_minus_one() {
        let e = 4;
        // Layer 1's direction is the first axis.
        let mut dirs = vec![0.0; 2 * e];
        dirs[e] = 1.0;
        let mut st = Steering::from_dirs(vec![(dirs, 1.0, 0.0)], e);
        let mut y = vec![3.0, 1.0, 2.0, -1.0, 5.0, 0.0, 0.0, 0.0];
        st.apply(1, Site::Ffn, &mut y);
        assert_eq!(y, vec![0.0, 1.0, 2.0, -1.0, 0.0, 0.0, 0.0, 0.0]);
        // Attention scale 0: untouched.
        let mut z = vec![3.0, 1.0, 2.0, -1.0];
        st.apply(1, Site::Attn, &mut z);
        assert_eq!(z, vec![3.0, 1.0, 2.0, -1.0]);
        st.set_ffn(0, -1.0).unwrap();
        st.apply(1, Site::Ffn, &mut z);
        assert_eq!(z, vec![6.0, 1.0, 2.0, -1.0]);
        assert!(st.set_ffn(0, 101.0).is_err() && st.set_ffn(1, 1.0).is_err());
    }

    #[test]
    fn slots_apply_in_order() {
        // Two non-orthogonal directions: removing a then b differs from b then a.
        let e = 2;
        let s = std::f32::consts::FRAC_1_SQRT_2;
        let (a, b) = (vec![1.0, 0.0], vec![s, s]);
        let mut y = vec![1.0, 1.0];
        Steering::from_dirs(vec![(a.clone(), 1.0, 0.0), (b.clone(), 1.0, 0.0)], e).apply(0, Site::Ffn, &mut y);
        assert!((y[0] + 0.5).abs() < 1e-6 && (y[1] - 0.5).abs() < 1e-6, "{y:?}");
        let mut y = vec![1.0, 1.0];
        Steering::from_dirs(vec![(b, 1.0, 0.0), (a, 1.0, 0.0)], e).apply(0, Site::Ffn, &mut y);
        assert!(y[0].abs() < 1e-6 && y[1].abs() < 1e-6, "{y:?}");
    }

    #[test]
    fn scales_bind_to_the_file_before_them() {
        let f = |p: usize, n: &str| (p, PathBuf::from(n));
        let specs = bind(vec![f(4, "b"), f(0, "a")], vec![(2, 2.0), (6, -1.0), (8, -0.5)], vec![(7, 0.5)]).unwrap();
        assert_eq!(specs, vec![
            SteerSpec { file: "a".into(), ffn: 2.0, attn: 0.0 },
            SteerSpec { file: "b".into(), ffn: -0.5, attn: 0.5 },
        ]);
        // Before any file: the first slot; defaults ffn 1, attn 0.
        let specs = bind(vec![f(2, "a")], vec![], vec![(0, 3.0)]).unwrap();
        assert_eq!(specs, vec![SteerSpec { file: "a".into(), ffn: 1.0, attn: 3.0 }]);
        assert!(bind(vec![], vec![(0, 1.0)], vec![]).is_err());
        assert!(bind(vec![], vec![], vec![]).unwrap().is_empty());
    }

    #[test]
    fn files_are_checked_before_reading() {
        let dir = std::env::temp_dir().join(format!("ds4-steer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("d.f32");
        std::fs::write(&f, vec![0u8; 3 * 8 * 4]).unwrap();
        assert!(check(&[SteerSpec::new(f.clone())], 3, 8).is_ok());
        let e = check(&[SteerSpec::new(f.clone())], 43, 8).unwrap_err().to_string();
        assert!(e.contains("96 bytes, expected 1376"), "{e}");
        let e = check(&[SteerSpec { ffn: f32::NAN, ..SteerSpec::new(f.clone()) }], 3, 8).unwrap_err().to_string();
        assert!(e.contains("--dir-steering-ffn"), "{e}");
        let e = check(&vec![SteerSpec::new(f.clone()); 9], 3, 8).unwrap_err().to_string();
        assert!(e.contains("at most 8"), "{e}");
        assert!(check(&[SteerSpec::new(dir.join("missing"))], 3, 8).is_err());
        let mut bad = vec![0u8; 3 * 8 * 4];
        bad[20..24].copy_from_slice(&f32::INFINITY.to_le_bytes());
        std::fs::write(&f, bad).unwrap();
        let e = Steering::load(&[SteerSpec::new(f)], 3, 8).unwrap_err().to_string();
        assert!(e.contains("value 5 (layer 0) is not finite"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
