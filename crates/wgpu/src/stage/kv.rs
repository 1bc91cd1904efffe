//! The KV state of the resident layers between the device and a host `KvState` (session files, the
//! disk KV cache, another backend's state): window ring, compressed and indexer rows (as many as the
//! position has closed), compressor frontiers; of the selected KV slot (its part of every buffer).
use ds4_gpu::Result;
use ds4_model::kv::{CompressorState, LayerKv, Rows};
use ds4_model::KvState;

use super::device_ops::err;
use super::layer::Layer;
use super::WgpuOps;
use crate::buffer::GpuBuffer;

/// The host layer of resident layer `li` (checked against the stage's layer range).
fn host_index(ops: &WgpuOps, kv: &KvState, li: usize) -> Result<usize> {
    let il = ops.range.first + li;
    let last = kv.first_layer + kv.layers.len();
    if il < kv.first_layer || il >= last {
        return Err(format!("wgpu: the KV state holds layers {}..{last}, not layer {il}", kv.first_layer).into());
    }
    Ok(il - kv.first_layer)
}

fn mismatch(il: usize, what: &str) -> ds4_gpu::GpuError {
    format!("wgpu: the KV state of layer {il} does not match the model ({what})").into()
}

/// Floats of one slot's part of a KV buffer, and where the selected slot's part starts.
fn part(ops: &WgpuOps, b: &GpuBuffer) -> (usize, usize) {
    let n = b.len() / ops.slots;
    (n, ops.slot * n)
}

/// Every check before anything is written, so that a bad state leaves the device as it was.
fn check(ops: &WgpuOps, kv: &KvState) -> Result<()> {
    for (li, l) in ops.layers.iter().enumerate() {
        let h = &kv.layers[host_index(ops, kv, li)?];
        let il = ops.range.first + li;
        if h.raw.len() != part(ops, &l.ring).0 {
            return Err(mismatch(il, "window ring size"));
        }
        let rows_ok = |rows: &Option<Rows>, dev: &Option<GpuBuffer>| match (rows, dev) {
            (Some(r), Some(b)) => r.data.len() == r.n * r.width && r.data.len() <= part(ops, b).0 && r.n == kv.pos / h.ratio.max(1),
            (None, None) => true,
            _ => false,
        };
        if !rows_ok(&h.comp, &l.comp_rows) || !rows_ok(&h.idx, &l.idx_rows) {
            return Err(mismatch(il, "compressed or indexer rows"));
        }
        let states = [&h.comp_state, &h.idx_state];
        let present: Vec<&CompressorState> = states.iter().filter_map(|s| s.as_ref()).collect();
        let comps: Vec<_> = l.compressors().collect();
        if present.len() != comps.len() || present.iter().zip(&comps).any(|(s, c)| s.kv.len() != c.slot_len() || s.score.len() != c.slot_len()) {
            return Err(mismatch(il, "compressor state"));
        }
    }
    Ok(())
}

/// The first `n` floats of the selected slot's part of `b`.
fn read_into(ops: &WgpuOps, b: &GpuBuffer, n: usize, dst: &mut Vec<f32>) -> Result<()> {
    *dst = b.read_at(&ops.gpu, part(ops, b).1, n).map_err(err)?;
    Ok(())
}

/// `data` at the start of the selected slot's part of `b`.
fn write_part(ops: &WgpuOps, b: &GpuBuffer, data: &[f32]) -> Result<()> {
    b.write_at(&ops.gpu, part(ops, b).1, data).map_err(err)
}

fn download_layer(ops: &WgpuOps, l: &Layer, h: &mut LayerKv, pos: usize) -> Result<()> {
    let n = h.raw.len();
    read_into(ops, &l.ring, n, &mut h.raw)?;
    let ratio = h.ratio.max(1);
    for (rows, dev) in [(&mut h.comp, &l.comp_rows), (&mut h.idx, &l.idx_rows)] {
        if let (Some(r), Some(b)) = (rows.as_mut(), dev) {
            r.n = pos / ratio;
            read_into(ops, b, r.n * r.width, &mut r.data)?;
        }
    }
    let mut comps = l.compressors();
    for st in [&mut h.comp_state, &mut h.idx_state].into_iter().flatten() {
        let c = comps.next().ok_or_else(|| mismatch(0, "compressor state"))?;
        let (k, s) = (st.kv.len(), st.score.len());
        read_into(ops, &c.st_kv, k, &mut st.kv)?;
        read_into(ops, &c.st_sc, s, &mut st.score)?;
    }
    Ok(())
}

pub(super) fn download(ops: &WgpuOps, kv: &mut KvState) -> Result<()> {
    for (li, l) in ops.layers.iter().enumerate() {
        let hi = host_index(ops, kv, li)?;
        let pos = kv.pos;
        let h = &mut kv.layers[hi];
        if h.raw.len() != part(ops, &l.ring).0 {
            return Err(mismatch(ops.range.first + li, "window ring size"));
        }
        download_layer(ops, l, h, pos)?;
    }
    Ok(())
}

pub(super) fn upload(ops: &WgpuOps, kv: &KvState) -> Result<()> {
    check(ops, kv)?;
    for (li, l) in ops.layers.iter().enumerate() {
        let h = &kv.layers[host_index(ops, kv, li)?];
        write_part(ops, &l.ring, &h.raw)?;
        for (rows, dev) in [(&h.comp, &l.comp_rows), (&h.idx, &l.idx_rows)] {
            if let (Some(r), Some(b)) = (rows, dev) {
                if !r.data.is_empty() {
                    write_part(ops, b, &r.data)?;
                }
            }
        }
        for (st, c) in [&h.comp_state, &h.idx_state].into_iter().flatten().zip(l.compressors()) {
            write_part(ops, &c.st_kv, &st.kv)?;
            write_part(ops, &c.st_sc, &st.score)?;
        }
    }
    ops.gpu.wait().map_err(err)
}
