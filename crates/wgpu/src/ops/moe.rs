//! Routed and shared experts of the MoE sub-layer (`ds4_model::Stage`'s FFN block after the router):
//! per (token, slot) gate/up products read from the chosen expert's rows of the stacked tensors,
//! SwiGLU with the clamp times the routing weight, the down product, then the sum of the slots plus
//! the shared expert and the hyper-connection exit, in place on the streams.
use std::sync::Arc;

use super::hc::{HcDims, PostKernel};
use super::step_matvec::StepMatVec;
use super::swiglu::SwiGlu;
use super::{check_tokens, grid, u32_of};
use crate::buffer::GpuBuffer;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::resident::ResidentTensor;
use super::router::MAX_EXPERTS;
use crate::shaders::{expert_coop_key, expert_coop_source, expert_matvec_key, expert_matvec_source, expert_shape, needs_table, ExpertWalk, F16Unpack, MatVecShape, BATCH_TILE, EXPERT_GROUPS, MATMUL_MIN_TOKENS, MATMUL_TILE, MOE_SWIGLU};

struct Part {
    bind: wgpu::BindGroup,
    wg: (u32, u32),
}

/// The step's (token, slot) pairs grouped by expert, for the prefill products: an order of the
/// slots expert by expert and tiles of up to `BATCH_TILE` slots of one expert (built on the device
/// from the router's ids, nothing read back).
pub struct ExpertGroups {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    order: GpuBuffer,
    tiles: GpuBuffer,
    k: u32,
    n_expert: u32,
    max_tokens: u32,
    /// Slots per tile.
    tile: u32,
}

impl ExpertGroups {
    /// Over `ids` (max_tokens x k expert ids, below n_expert), tiles of up to `BATCH_TILE` slots.
    pub fn new(gpu: &Gpu, ids: &GpuBuffer, n_expert: usize, k: usize, max_tokens: u32) -> Result<Self, WgpuError> {
        Self::with_tile(gpu, ids, n_expert, k, max_tokens, BATCH_TILE)
    }

    /// As `new`, tiles of up to `tile` slots (the tiled products take 64).
    pub fn with_tile(gpu: &Gpu, ids: &GpuBuffer, n_expert: usize, k: usize, max_tokens: u32, tile: u32) -> Result<Self, WgpuError> {
        let slots = k * max_tokens as usize;
        if n_expert == 0 || n_expert > MAX_EXPERTS || k == 0 || ids.len() < slots {
            return Err(WgpuError::BadShape { what: "expert groups".into(), reason: format!("{k} of {n_expert} experts (at most {MAX_EXPERTS}), {} ids for {slots} slots", ids.len()) });
        }
        let pipeline = gpu.pipeline("expert_groups", || Ok(EXPERT_GROUPS.to_string()))?;
        let (k32, ne32) = (u32_of("slots", k)?, u32_of("experts", n_expert)?);
        let order = GpuBuffer::new(gpu, "expert order", slots)?;
        let tiles = GpuBuffer::new(gpu, "expert tiles", 1 + 3 * max_tiles(k32, ne32, max_tokens, tile) as usize)?;
        let params: [u32; 4] = [k32, ne32, tile, 0];
        let uni = gpu.uniform("expert groups", bytemuck::cast_slice(&params))?;
        let bind = gpu.bind_group("expert groups", &pipeline, &[&ids.buffer, &order.buffer, &tiles.buffer, &uni, &gpu.step])?;
        Ok(Self { pipeline, bind, order, tiles, k: k32, n_expert: ne32, max_tokens, tile })
    }

    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        check_tokens("expert groups", enc.step().ntok, self.max_tokens)?;
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(1, 1, 1);
        Ok(())
    }
}

/// Most tiles of `ntok` tokens: whole tiles plus one partial tile per expert used.
fn max_tiles(k: u32, n_expert: u32, ntok: u32, tile: u32) -> u32 {
    let slots = k * ntok;
    slots.div_ceil(tile) + n_expert.min(slots)
}

/// y[slot] = W_{ids[slot]} . x[slot / x_div] over a stacked expert tensor (n_expert matrices of
/// rows / n_expert rows each), for the step's ntok x k slots. Tensors split across bindings anywhere
/// (an expert may straddle two parts): one dispatch per part, each computing the rows it holds.
pub struct ExpertMatVec {
    pipeline: Arc<wgpu::ComputePipeline>,
    parts: Vec<Part>,
    k: u32,
    /// Grouped or tiled: (experts, slots per tile) for the tile count of a step.
    grouped: Option<(u32, u32)>,
    max_tokens: u32,
    pub shape: MatVecShape,
    pub f16: F16Unpack,
}

impl ExpertMatVec {
    /// One workgroup per (row, slot). `w`: the stack (n_expert x r rows of `w.cols`); `ids`:
    /// max_tokens x k expert ids; `x`: one row per token (`per_slot` false: gate/up over xn) or per
    /// slot (true: down over the activations); `y`: max_tokens x k rows of r.
    #[allow(clippy::too_many_arguments)]
    pub fn new(gpu: &Gpu, w: &ResidentTensor, n_expert: usize, ids: &GpuBuffer, x: &GpuBuffer, per_slot: bool, y: &GpuBuffer, k: usize, max_tokens: u32) -> Result<Self, WgpuError> {
        Self::build(gpu, w, n_expert, ExpertWalk::PerSlot, &[&ids.buffer], x, per_slot, y, k, max_tokens, None)
    }

    /// As `new`, with the workgroup shape given (benchmarks compare shapes).
    #[allow(clippy::too_many_arguments)]
    pub fn with_shape(gpu: &Gpu, w: &ResidentTensor, n_expert: usize, ids: &GpuBuffer, x: &GpuBuffer, per_slot: bool, y: &GpuBuffer, k: usize, max_tokens: u32, shape: MatVecShape) -> Result<Self, WgpuError> {
        Self::build(gpu, w, n_expert, ExpertWalk::PerSlot, &[&ids.buffer], x, per_slot, y, k, max_tokens, Some(shape))
    }

    /// As `new`, one workgroup per (row, tile of slots that chose the same expert) from `groups`
    /// (run `groups.encode` first in the step): weights are dequantized once per tile (prefill).
    #[allow(clippy::too_many_arguments)]
    pub fn grouped(gpu: &Gpu, w: &ResidentTensor, groups: &ExpertGroups, x: &GpuBuffer, per_slot: bool, y: &GpuBuffer, max_tokens: u32) -> Result<Self, WgpuError> {
        if max_tokens > groups.max_tokens {
            return Err(WgpuError::BadShape { what: w.name.clone(), reason: format!("{max_tokens} tokens, groups built for {}", groups.max_tokens) });
        }
        let (ne, k) = (groups.n_expert as usize, groups.k as usize);
        let walk = if groups.tile == BATCH_TILE { ExpertWalk::Grouped } else if groups.tile == MATMUL_TILE { ExpertWalk::Tiled } else {
            return Err(WgpuError::BadShape { what: w.name.clone(), reason: format!("expert tiles of {} slots (the kernels take {BATCH_TILE} or {MATMUL_TILE})", groups.tile) });
        };
        Self::build(gpu, w, ne, walk, &[&groups.tiles.buffer, &groups.order.buffer], x, per_slot, y, k, max_tokens, None)
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        gpu: &Gpu,
        w: &ResidentTensor,
        n_expert: usize,
        walk: ExpertWalk,
        route: &[&wgpu::Buffer],
        x: &GpuBuffer,
        per_slot: bool,
        y: &GpuBuffer,
        k: usize,
        max_tokens: u32,
        shape: Option<MatVecShape>,
    ) -> Result<Self, WgpuError> {
        let bad = |reason: String| WgpuError::BadShape { what: w.name.clone(), reason };
        if n_expert == 0 || !w.rows.is_multiple_of(n_expert) || !w.cols.is_multiple_of(8) {
            return Err(bad(format!("{} rows of {} columns: not {n_expert} experts with a multiple of 8 columns", w.rows, w.cols)));
        }
        let (r, m) = (w.rows / n_expert, max_tokens as usize);
        let slots = m * k;
        if k == 0 || max_tokens == 0 || slots > 65535 {
            return Err(bad(format!("{max_tokens} tokens x {k} slots (1..=65535 slots)")));
        }
        let x_rows = if per_slot { slots } else { m };
        if x.len() < x_rows * w.cols || y.len() < slots * r {
            return Err(bad(format!("buffers of {} / {} floats for {slots} slots", x.len(), y.len())));
        }
        let f16 = if gpu.caps().f16_in_f32 { F16Unpack::Native } else { F16Unpack::Bits };
        let ty = w.ty;
        let shape = shape.unwrap_or_else(|| expert_shape(ty, r, w.cols, k));
        let shape = if walk == ExpertWalk::PerSlot { shape } else { shape.batched() };
        let coop = if walk == ExpertWalk::Tiled { super::matvec::coop_tile_side(gpu) } else { None };
        // The module text is built only on a pipeline-cache miss.
        let key = coop.map_or_else(|| expert_matvec_key(ty, walk, shape, f16), |n| expert_coop_key(ty, f16, n));
        let src = || coop.map_or_else(|| expert_matvec_source(ty, walk, shape, f16), |n| expert_coop_source(ty, f16, n));
        let pipeline = gpu.pipeline(&key, || src().ok_or_else(|| bad(format!("no expert kernel for {}", ty.name()))))?;
        let table = if needs_table(ty) { Some(gpu.iq2_grid()?) } else { None };
        let exp: [u32; 4] = [u32_of("slots", k)?, if per_slot { 1 } else { u32_of("slots", k)? }, u32_of("rows per expert", r)?, 0];
        let ex_uni = gpu.uniform(&format!("{} experts", w.name), bytemuck::cast_slice(&exp))?;
        let (cols, row_bytes) = (u32_of("columns", w.cols)?, u32_of("row bytes", w.row_bytes)?);
        let rows_per_wg = match walk {
            ExpertWalk::PerSlot | ExpertWalk::Grouped => shape.rows(),
            ExpertWalk::Tiled => MATMUL_TILE,
        };
        let wg = grid(u32_of("rows per expert", r)?.div_ceil(rows_per_wg));
        let mut parts = Vec::with_capacity(w.parts.len());
        for (i, part) in w.parts.iter().enumerate() {
            // The mat-vec `Params` layout (matvec_common.wgsl); no row groups (x_off4 0).
            let params: [u32; 12] = [u32_of("rows", part.rows)?, cols, row_bytes, u32_of("row", part.row0)?, wg.0, cols / 4, u32_of("rows", r)?, part.byte_offset, 0, 0, 0, 0];
            let label = format!("{}#{i}", w.name);
            let uni = gpu.uniform(&label, bytemuck::cast_slice(&params))?;
            let mut buffers = vec![&part.buffer, &x.buffer, &y.buffer, &uni, &gpu.step, &ex_uni];
            buffers.extend_from_slice(route);
            if let Some(t) = table.as_deref() {
                buffers.push(t);
            }
            parts.push(Part { bind: gpu.bind_group(&label, &pipeline, &buffers)?, wg });
        }
        let tile = if walk == ExpertWalk::Tiled { MATMUL_TILE } else { BATCH_TILE };
        let grouped = (walk != ExpertWalk::PerSlot).then_some((u32_of("experts", n_expert)?, tile));
        Ok(Self { pipeline, parts, k: u32_of("slots", k)?, grouped, max_tokens, shape, f16 })
    }

    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let ntok = enc.step().ntok;
        check_tokens("expert product", ntok, self.max_tokens)?;
        let z = match self.grouped {
            Some((ne, tile)) => max_tiles(self.k, ne, ntok, tile),
            None => ntok * self.k,
        }
        .max(1);
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        for p in &self.parts {
            pass.set_bind_group(0, &p.bind, &[]);
            pass.dispatch_workgroups(p.wg.0, p.wg.1, z);
        }
        Ok(())
    }
}

/// a = swiglu_clamped(a, b) * weight[slot] over the step's slot rows.
struct ExpertSwiGlu {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    n: u32,
    k: u32,
}

impl ExpertSwiGlu {
    #[allow(clippy::too_many_arguments)]
    fn new(gpu: &Gpu, a: &GpuBuffer, b: &GpuBuffer, weights: &GpuBuffer, n: usize, k: usize, clamp: Option<f32>, max_tokens: u32) -> Result<Self, WgpuError> {
        let total = n * k * max_tokens as usize;
        if a.len() < total || b.len() < total || weights.len() < k * max_tokens as usize {
            return Err(WgpuError::BadShape { what: "expert swiglu".into(), reason: format!("buffers too small for {total} values") });
        }
        let pipeline = gpu.pipeline("moe_swiglu", || Ok(MOE_SWIGLU.to_string()))?;
        u32_of("swiglu size", total)?; // the kernel indexes the rows in u32
        let params: [u32; 8] = [u32_of("width", n)?, u32_of("slots", k)?, clamp.is_some() as u32, clamp.unwrap_or(0.0).to_bits(), 0, 0, 0, 0];
        let uni = gpu.uniform("expert swiglu", bytemuck::cast_slice(&params))?;
        let bind = gpu.bind_group("expert swiglu", &pipeline, &[&a.buffer, &b.buffer, &weights.buffer, &uni, &gpu.step])?;
        Ok(Self { pipeline, bind, n: u32_of("width", n)?, k: u32_of("slots", k)? })
    }

    fn encode(&self, enc: &mut Encoder) {
        // Only this step's slot rows (the kernel reads the grid's x extent).
        let (x, y) = grid((self.n * self.k * enc.step().ntok).div_ceil(64));
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(x, y, 1);
    }
}

/// Work buffers of the MoE sub-layer, sized once for max_tokens (one set may serve every layer).
pub struct MoeScratch {
    /// Routed gate (then activation), up: max_tokens x k x ff.
    pub a: GpuBuffer,
    pub b: GpuBuffer,
    /// Routed down outputs: max_tokens x k x n_embd.
    pub out: GpuBuffer,
    /// Shared expert gate (then activation), up: max_tokens x ff; output: max_tokens x n_embd.
    pub sh_a: GpuBuffer,
    pub sh_b: GpuBuffer,
    pub sh_out: GpuBuffer,
    max_tokens: u32,
}

impl MoeScratch {
    pub fn new(gpu: &Gpu, n_embd: usize, ff: usize, k: usize, max_tokens: u32) -> Result<Self, WgpuError> {
        let m = max_tokens as usize;
        Ok(Self {
            a: GpuBuffer::new(gpu, "moe a", m * k * ff)?,
            b: GpuBuffer::new(gpu, "moe b", m * k * ff)?,
            out: GpuBuffer::new(gpu, "moe out", m * k * n_embd)?,
            sh_a: GpuBuffer::new(gpu, "moe shared a", m * ff)?,
            sh_b: GpuBuffer::new(gpu, "moe shared b", m * ff)?,
            sh_out: GpuBuffer::new(gpu, "moe shared out", m * n_embd)?,
            max_tokens,
        })
    }
}

/// The stacked routed expert tensors of a layer (ffn_{gate,up,down}_exps) and their expert count.
#[derive(Clone, Copy)]
pub struct Experts<'a> {
    pub gate: &'a ResidentTensor,
    pub up: &'a ResidentTensor,
    pub down: &'a ResidentTensor,
    pub n_expert: usize,
}

/// Routed experts + shared expert + HC exit of one layer.
pub struct Moe {
    /// gate, up, down: per slot (one token), and grouped by expert with the grouping (more tokens).
    one: [ExpertMatVec; 3],
    many: Option<(ExpertGroups, [ExpertMatVec; 3])>,
    /// The tiled products of steps of `MATMUL_MIN_TOKENS` tokens and more (prefill), where the
    /// adapter's workgroup memory holds their tiles.
    tiled: Option<(ExpertGroups, [ExpertMatVec; 3])>,
    act: ExpertSwiGlu,
    shared: Option<(StepMatVec, StepMatVec, SwiGlu, StepMatVec)>,
    post: PostKernel,
    max_tokens: u32,
}

impl Moe {
    /// `xn`: the normalised sub-layer input (max_tokens x n_embd); `ids`/`weights`: the router's
    /// output (k per token); `shared`: [gate, up, down] of the shared expert; `clamp`: the layer's
    /// SwiGLU clamp; `x`/`coef`: the streams and the exit coefficients of this sub-layer's entry.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        dims: &HcDims,
        experts: Experts,
        shared: Option<[&ResidentTensor; 3]>,
        clamp: Option<f32>,
        k: usize,
        xn: &GpuBuffer,
        ids: &GpuBuffer,
        weights: &GpuBuffer,
        scratch: &MoeScratch,
        x: &GpuBuffer,
        coef: &GpuBuffer,
        max_tokens: u32,
    ) -> Result<Self, WgpuError> {
        let e = dims.n_embd;
        let ff = experts.gate.rows / experts.n_expert.max(1);
        let shapes_ok = experts.gate.cols == e
            && experts.up.cols == e
            && experts.up.rows == experts.gate.rows
            && experts.down.cols == ff
            && experts.down.rows == e * experts.n_expert
            && shared.is_none_or(|[g, u, d]| g.cols == e && u.cols == e && g.rows == u.rows && d.cols == g.rows && d.rows == e && g.rows * (max_tokens as usize) <= scratch.sh_a.len());
        if !shapes_ok || max_tokens > scratch.max_tokens {
            return Err(WgpuError::BadShape { what: format!("moe {}", experts.gate.name), reason: format!("expert / shared shapes do not match n_embd {e}, or scratch built for {} tokens", scratch.max_tokens) });
        }
        let n = experts.n_expert;
        let one = [
            ExpertMatVec::new(gpu, experts.gate, n, ids, xn, false, &scratch.a, k, max_tokens)?,
            ExpertMatVec::new(gpu, experts.up, n, ids, xn, false, &scratch.b, k, max_tokens)?,
            ExpertMatVec::new(gpu, experts.down, n, ids, &scratch.a, true, &scratch.out, k, max_tokens)?,
        ];
        // gate, up, down over the groups of slots by expert, in tiles of `tile` slots.
        let grouped = |tile: u32| -> Result<(ExpertGroups, [ExpertMatVec; 3]), WgpuError> {
            let g = ExpertGroups::with_tile(gpu, ids, n, k, max_tokens, tile)?;
            let mats = [
                ExpertMatVec::grouped(gpu, experts.gate, &g, xn, false, &scratch.a, max_tokens)?,
                ExpertMatVec::grouped(gpu, experts.up, &g, xn, false, &scratch.b, max_tokens)?,
                ExpertMatVec::grouped(gpu, experts.down, &g, &scratch.a, true, &scratch.out, max_tokens)?,
            ];
            Ok((g, mats))
        };
        let many = if max_tokens > 1 { Some(grouped(BATCH_TILE)?) } else { None };
        let tiles = max_tokens >= MATMUL_MIN_TOKENS && super::matvec::tiled_products_fit(gpu);
        let tiled = if tiles { Some(grouped(MATMUL_TILE)?) } else { None };
        let act = ExpertSwiGlu::new(gpu, &scratch.a, &scratch.b, weights, ff, k, clamp, max_tokens)?;
        let shared = match shared {
            Some([g, u, d]) => Some((
                StepMatVec::new(gpu, g, xn, &scratch.sh_a, max_tokens)?,
                StepMatVec::new(gpu, u, xn, &scratch.sh_b, max_tokens)?,
                SwiGlu::new(gpu, &scratch.sh_a, &scratch.sh_b, g.rows, clamp, max_tokens)?,
                StepMatVec::new(gpu, d, &scratch.sh_a, &scratch.sh_out, max_tokens)?,
            )),
            None => None,
        };
        let post = PostKernel::new(gpu, dims, x, &scratch.out, k, shared.as_ref().map(|_| &scratch.sh_out), coef, max_tokens)?;
        Ok(Self { one, many, tiled, act, shared, post, max_tokens })
    }

    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> { self.encode_steered(enc, None) }

    /// `encode` with `steer` editing the experts' sum before the exit.
    pub fn encode_steered(&self, enc: &mut Encoder, steer: Option<&super::Steer>) -> Result<(), WgpuError> {
        let ntok = enc.step().ntok;
        check_tokens("moe", ntok, self.max_tokens)?;
        let [gate, up, down] = match (&self.tiled, &self.many) {
            (Some((groups, mats)), _) if ntok >= MATMUL_MIN_TOKENS => {
                groups.encode(enc)?;
                mats
            }
            (_, Some((groups, mats))) if ntok > 1 => {
                groups.encode(enc)?;
                mats
            }
            _ => &self.one,
        };
        enc.mark("moe_route_groups");
        gate.encode(enc)?;
        up.encode(enc)?;
        enc.mark("moe_gate_up");
        self.act.encode(enc);
        down.encode(enc)?;
        enc.mark("moe_down");
        if let Some((g, u, act, d)) = &self.shared {
            g.encode(enc)?;
            u.encode(enc)?;
            act.encode(enc)?;
            d.encode(enc)?;
            enc.mark("moe_shared");
        }
        if let Some(st) = steer {
            st.encode(enc)?;
        }
        self.post.encode(enc)
    }
}
