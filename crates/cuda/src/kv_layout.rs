//! The device KV state of a stage in the host `KvState` format and back (disk KV cache on CUDA): each
//! owned layer's device buffers hold the same arrays, in the same order, as the host's `LayerKv` (ring
//! row p % swa, compressed rows in window order, compressor frontiers as `CompressorState`), so the
//! conversion is a copy per part; only the compressed-row counts are implicit on the device (pos / ratio).
//! Kept free of CUDA so the conversion is tested on the CPU against a buffer-backed device.
use ds4_model::kv::{CompressorState, LayerKv, Rows};
use ds4_model::KvState;

/// One device buffer of a layer's KV state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part {
    /// Sliding window ring (swa × head_dim).
    Ring,
    /// Compressed rows (capacity × head_dim).
    Comp,
    CompKv,
    CompScore,
    /// Indexer rows (capacity × idx_dim).
    Idx,
    IdxKv,
    IdxScore,
}

/// Where a stage's KV buffers live: floats per part and copies from / to their start.
pub trait KvDevice {
    /// Floats of `part` of the stage's layer `li` (0 = its first), None when the layer has none.
    fn floats(&self, li: usize, part: Part) -> Option<usize>;
    /// Copies the first `dst.len()` floats of the part into `dst`.
    fn read(&mut self, li: usize, part: Part, dst: &mut [f32]) -> Result<(), String>;
    /// Copies `src` to the start of the part.
    fn write(&mut self, li: usize, part: Part, src: &[f32]) -> Result<(), String>;
}

/// Compressed rows a layer holds after `pos` positions (one per closed window).
pub fn closed_windows(pos: usize, ratio: usize) -> usize {
    if ratio == 0 { 0 } else { pos / ratio }
}

fn host_layer<'a>(kv: &'a KvState, il: usize) -> Result<&'a LayerKv, String> {
    il.checked_sub(kv.first_layer).and_then(|i| kv.layers.get(i)).ok_or_else(|| format!("the KV state has no layer {il} (layers {}..{})", kv.first_layer, kv.first_layer + kv.layers.len()))
}

fn same_len(dev: Option<usize>, host: usize, what: &str, il: usize) -> Result<(), String> {
    match dev {
        Some(n) if n == host => Ok(()),
        Some(n) => Err(format!("layer {il}: {what} has {host} floats on the host, {n} on the device")),
        None => Err(format!("layer {il}: {what} is on the host but not on the device")),
    }
}

/// Rows part: the host's row count must be the windows closed so far and fit the device's capacity.
fn rows_fit(dev: Option<usize>, r: &Rows, n: usize, what: &str, il: usize) -> Result<(), String> {
    let cap = dev.ok_or_else(|| format!("layer {il}: {what} are on the host but not on the device"))?;
    if r.n != n || r.data.len() != n * r.width {
        return Err(format!("layer {il}: {} {what} for {n} closed windows", r.n));
    }
    if n * r.width > cap {
        return Err(format!("layer {il}: {n} {what} exceed the device's room for {}", cap / r.width.max(1)));
    }
    Ok(())
}

fn state_fits(dev: &impl KvDevice, li: usize, s: &CompressorState, parts: [Part; 2], what: &str, il: usize) -> Result<(), String> {
    same_len(dev.floats(li, parts[0]), s.kv.len(), what, il)?;
    same_len(dev.floats(li, parts[1]), s.score.len(), what, il)
}

/// Checks that the device layers `layers` (the stage's, in order) and `kv` hold the same arrays, with
/// `kv`'s compressed-row counts those of its position.
fn check(dev: &impl KvDevice, kv: &KvState, layers: std::ops::RangeInclusive<usize>, rows_too: bool) -> Result<(), String> {
    for (li, il) in layers.enumerate() {
        let h = host_layer(kv, il)?;
        same_len(dev.floats(li, Part::Ring), h.raw.len(), "the window ring", il)?;
        let n = closed_windows(kv.pos, h.ratio);
        let none = |p: Part, what: &str| if dev.floats(li, p).is_some() { Err(format!("layer {il}: {what} are on the device but not on the host")) } else { Ok(()) };
        match (&h.comp, &h.comp_state) {
            (Some(r), Some(s)) => {
                if rows_too {
                    rows_fit(dev.floats(li, Part::Comp), r, n, "compressed rows", il)?;
                }
                state_fits(dev, li, s, [Part::CompKv, Part::CompScore], "the compressor state", il)?;
            }
            (None, None) => none(Part::Comp, "compressed rows")?,
            _ => return Err(format!("layer {il}: compressed rows without a compressor state")),
        }
        match (&h.idx, &h.idx_state) {
            (Some(r), Some(s)) => {
                if rows_too {
                    rows_fit(dev.floats(li, Part::Idx), r, n, "indexer rows", il)?;
                }
                state_fits(dev, li, s, [Part::IdxKv, Part::IdxScore], "the indexer compressor state", il)?;
            }
            (None, None) => none(Part::Idx, "indexer rows")?,
            _ => return Err(format!("layer {il}: indexer rows without a compressor state")),
        }
    }
    Ok(())
}

/// Copies the device state of layers `layers` (at position `kv.pos`) into `kv`.
pub fn download(dev: &mut impl KvDevice, kv: &mut KvState, layers: std::ops::RangeInclusive<usize>) -> Result<(), String> {
    check(dev, kv, layers.clone(), false)?;
    let (pos, first) = (kv.pos, kv.first_layer);
    for (li, il) in layers.enumerate() {
        let h = &mut kv.layers[il - first];
        let n = closed_windows(pos, h.ratio);
        dev.read(li, Part::Ring, &mut h.raw)?;
        for (rows, part) in [(&mut h.comp, Part::Comp), (&mut h.idx, Part::Idx)] {
            if let Some(r) = rows.as_mut() {
                let cap = dev.floats(li, part).unwrap_or(0);
                if n * r.width > cap {
                    return Err(format!("layer {il}: {n} closed windows exceed the device's room for {}", cap / r.width.max(1)));
                }
                r.data.resize(n * r.width, 0.0);
                r.n = n;
                dev.read(li, part, &mut r.data)?;
            }
        }
        for (st, parts) in [(&mut h.comp_state, [Part::CompKv, Part::CompScore]), (&mut h.idx_state, [Part::IdxKv, Part::IdxScore])] {
            if let Some(s) = st.as_mut() {
                dev.read(li, parts[0], &mut s.kv)?;
                dev.read(li, parts[1], &mut s.score)?;
            }
        }
    }
    Ok(())
}

/// Copies `kv` (layers `layers`) to the device: the whole state is checked before anything is written.
pub fn upload(dev: &mut impl KvDevice, kv: &KvState, layers: std::ops::RangeInclusive<usize>) -> Result<(), String> {
    check(dev, kv, layers.clone(), true)?;
    for (li, il) in layers.enumerate() {
        let h = &kv.layers[il - kv.first_layer];
        dev.write(li, Part::Ring, &h.raw)?;
        for (rows, part) in [(&h.comp, Part::Comp), (&h.idx, Part::Idx)] {
            if let Some(r) = rows {
                dev.write(li, part, &r.data)?;
            }
        }
        for (st, parts) in [(&h.comp_state, [Part::CompKv, Part::CompScore]), (&h.idx_state, [Part::IdxKv, Part::IdxScore])] {
            if let Some(s) = st {
                dev.write(li, parts[0], &s.kv)?;
                dev.write(li, parts[1], &s.score)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ds4_model::synth::{self, Mix, SynthSpec};
    use ds4_model::{Config, LayerRange, Logits, Options, Stage, Weights};
    use std::collections::HashMap;
    use std::sync::Arc;

    /// Device buffers as host vectors, sized as `CudaStage` allocates them (rows for the whole context).
    struct FakeDevice {
        bufs: HashMap<(usize, Part), Vec<f32>>,
    }

    impl FakeDevice {
        fn new(cfg: &Config, range: LayerRange, ctx: usize, fill: f32) -> Self {
            let mut bufs = HashMap::new();
            for (li, il) in (range.first..=range.last).enumerate() {
                let ratio = cfg.ratio(il);
                let cap = ds4_model::kv::compressed_capacity(ctx, ratio);
                let rows = ds4_model::kv::compressor_rows(ratio) * cfg.compress_coff(il);
                bufs.insert((li, Part::Ring), vec![fill; cfg.swa * cfg.head_dim]);
                if ratio != 0 {
                    bufs.insert((li, Part::Comp), vec![fill; cap * cfg.head_dim]);
                    bufs.insert((li, Part::CompKv), vec![fill; rows * cfg.head_dim]);
                    bufs.insert((li, Part::CompScore), vec![fill; rows * cfg.head_dim]);
                }
                if ratio == 4 {
                    bufs.insert((li, Part::Idx), vec![fill; cap * cfg.idx_dim]);
                    bufs.insert((li, Part::IdxKv), vec![fill; rows * cfg.idx_dim]);
                    bufs.insert((li, Part::IdxScore), vec![fill; rows * cfg.idx_dim]);
                }
            }
            Self { bufs }
        }
    }

    impl KvDevice for FakeDevice {
        fn floats(&self, li: usize, part: Part) -> Option<usize> { self.bufs.get(&(li, part)).map(Vec::len) }
        fn read(&mut self, li: usize, part: Part, dst: &mut [f32]) -> Result<(), String> {
            let b = self.bufs.get(&(li, part)).ok_or("no such buffer")?;
            dst.copy_from_slice(&b[..dst.len()]);
            Ok(())
        }
        fn write(&mut self, li: usize, part: Part, src: &[f32]) -> Result<(), String> {
            let b = self.bufs.get_mut(&(li, part)).ok_or("no such buffer")?;
            b[..src.len()].copy_from_slice(src);
            Ok(())
        }
    }

    /// A real KV state: the tiny synthetic model's CPU forward over `n` tokens.
    fn cpu_state(n: usize, ctx: usize) -> (Config, KvState) {
        // One file per call: the tests run in parallel.
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let k = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("ds4cuda-kvlayout-{}-{k}.gguf", std::process::id()));
        synth::write(&SynthSpec { shape: "tiny", mix: Mix::Q4, seed: 5, layers: None, vocab: None }, &path, |_, _| {}).unwrap();
        let f = Arc::new(ds4_gguf::GgufFile::open(&path).unwrap());
        let cfg = Config::from_gguf(&f).unwrap();
        let w = Weights::bind_mapped(f, &path, &cfg, LayerRange::full(&cfg)).unwrap();
        let mut st = Stage::new(cfg.clone(), w, Options::default());
        let mut kv = st.new_kv(ctx);
        let toks: Vec<u32> = (0..n as u32).map(|i| (i * 37 + 11) % cfg.n_vocab as u32).collect();
        st.forward(&mut kv, &toks, None, Logits::Last).unwrap();
        let _ = std::fs::remove_file(&path);
        (cfg, kv)
    }

    #[test]
    fn host_state_survives_the_device_layout() {
        let ctx = 64;
        let (cfg, kv) = cpu_state(23, ctx);
        let range = LayerRange::full(&cfg);
        assert!(kv.layers.iter().any(|l| l.comp.as_ref().is_some_and(|r| r.n > 0)), "the model must close compressor windows");
        assert!(kv.layers.iter().any(|l| l.idx.is_some()), "the model must have an indexer layer");
        let mut dev = FakeDevice::new(&cfg, range, ctx, f32::NAN);
        upload(&mut dev, &kv, range.first..=range.last).unwrap();
        // Rows past the closed windows stay untouched on the device.
        let l0 = kv.layers.iter().position(|l| l.ratio != 0).unwrap();
        let comp = &dev.bufs[&(l0, Part::Comp)];
        let used = kv.layers[l0].comp.as_ref().unwrap().data.len();
        assert!(comp[..used].iter().all(|v| !v.is_nan()) && comp[used..].iter().all(|v| v.is_nan()));
        let mut back = KvState::new(&cfg, range, ctx);
        back.pos = kv.pos;
        download(&mut dev, &mut back, range.first..=range.last).unwrap();
        assert_eq!(back, kv);
    }

    #[test]
    fn a_stage_part_converts_its_own_layers() {
        let ctx = 64;
        let (cfg, kv) = cpu_state(17, ctx);
        let part = LayerRange { first: 1, last: cfg.n_layer - 1, embed: false, head: true };
        let mut dev = FakeDevice::new(&cfg, part, ctx, 0.0);
        upload(&mut dev, &kv, part.first..=part.last).unwrap();
        let mut back = KvState::new(&cfg, LayerRange::full(&cfg), ctx);
        back.pos = kv.pos;
        download(&mut dev, &mut back, part.first..=part.last).unwrap();
        assert_eq!(back.layers[1..], kv.layers[1..]);
        assert_eq!(back.layers[0], KvState::new(&cfg, LayerRange::full(&cfg), ctx).layers[0], "layer 0 is not the part's");
    }

    #[test]
    fn mismatched_states_are_refused_before_writing() {
        let ctx = 64;
        let (cfg, kv) = cpu_state(23, ctx);
        let range = LayerRange::full(&cfg);
        // Rows that do not match the position (a damaged or foreign file).
        let mut bad = kv.clone();
        bad.pos += bad.layers.iter().map(|l| l.ratio).max().unwrap();
        let mut dev = FakeDevice::new(&cfg, range, ctx, 7.0);
        let e = upload(&mut dev, &bad, range.first..=range.last).unwrap_err();
        assert!(e.contains("closed windows"), "{e}");
        assert!(dev.bufs.values().all(|b| b.iter().all(|&v| v == 7.0)), "nothing is written when the state is refused");
        // A device sized for a shorter context cannot hold the rows.
        let mut small = FakeDevice::new(&cfg, range, 8, 0.0);
        assert!(upload(&mut small, &kv, range.first..=range.last).unwrap_err().contains("room"));
        // A device layer without a compressor where the host has one.
        let mut dev = FakeDevice::new(&cfg, range, ctx, 0.0);
        let l0 = kv.layers.iter().position(|l| l.ratio != 0).unwrap();
        dev.bufs.remove(&(l0, Part::CompKv));
        assert!(upload(&mut dev, &kv, range.first..=range.last).unwrap_err().contains("not on the device"));
        let mut back = KvState::new(&cfg, range, ctx);
        back.pos = kv.pos;
        assert!(download(&mut dev, &mut back, range.first..=range.last).is_err());
    }
}
