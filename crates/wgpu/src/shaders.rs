//! WGSL sources. Mat-vec / batched modules are composed from a shared part, one `dotu` per quant
//! type (a unit of 32 values, 8 for F16, dotted with activations held in registers), the segment
//! reduction and the main loop with its shape (`SEG`, `R`) and token tile `TB`; the tiled products
//! from the same shared part, one `load8` per type and the tile functions.
use ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST;
use ds4_quant::GgmlType;

const MATVEC_COMMON: &str = include_str!("shaders/matvec_common.wgsl");
const MATVEC_MAIN: &str = include_str!("shaders/matvec_main.wgsl");
const MATMUL_MAIN: &str = include_str!("shaders/matmul_main.wgsl");
const MATVEC_I8_MAIN: &str = include_str!("shaders/matvec_i8_main.wgsl");
const EXPERT_I8_MAIN: &str = include_str!("shaders/matvec_expert_i8_main.wgsl");
const QUANTIZE_Q8_K: &str = include_str!("shaders/quantize_q8_k.wgsl");
const QUANTIZE_COMMON: &str = include_str!("shaders/quantize_common.wgsl");
const QUANTIZE_Q8_0: &str = include_str!("shaders/quantize_q8_0.wgsl");
const MATMUL_EXPERT_MAIN: &str = include_str!("shaders/matmul_expert_main.wgsl");
const MATMUL_TILE_FNS: &str = include_str!("shaders/matmul_tile.wgsl");
const MATMUL_COOP_TILE_FNS: &str = include_str!("shaders/matmul_coop_tile.wgsl");
const EXPERT_TILES: &str = include_str!("shaders/expert_tiles.wgsl");
const SEG_REDUCE: &str = include_str!("shaders/seg_reduce.wgsl");
const IQ2_GRID: &str = include_str!("shaders/iq2_grid.wgsl");
const Q4_K_SCALES: &str = include_str!("shaders/q4_k_scales.wgsl");
const F16_NATIVE: &str = include_str!("shaders/f16_native.wgsl");
const F16_BITS: &str = include_str!("shaders/f16_bits.wgsl");
pub const RMS_NORM: &str = include_str!("shaders/rms_norm.wgsl");
pub const ROPE: &str = concat!(include_str!("shaders/rope.wgsl"), include_str!("shaders/rope_angle.wgsl"), include_str!("shaders/seq.wgsl"));
pub const KV_ROW: &str = concat!(include_str!("shaders/kv_row.wgsl"), include_str!("shaders/qat.wgsl"), include_str!("shaders/rope_angle.wgsl"), include_str!("shaders/seq.wgsl"));
pub const COMPRESSOR_POOL: &str = concat!(include_str!("shaders/compressor_common.wgsl"), include_str!("shaders/compressor_pool.wgsl"), include_str!("shaders/seq.wgsl"));
pub const COMPRESSOR_STATE: &str = concat!(include_str!("shaders/compressor_common.wgsl"), include_str!("shaders/compressor_state.wgsl"), include_str!("shaders/seq.wgsl"));
const ATTENTION: &str = concat!(include_str!("shaders/attention.wgsl"), include_str!("shaders/seq.wgsl"));
const ATTENTION_SCORE_THREAD: &str = include_str!("shaders/attention_score_thread.wgsl");
const ATTENTION_SCORE_SUBGROUP: &str = include_str!("shaders/attention_score_subgroup.wgsl");
pub const ATTENTION_MERGE: &str = include_str!("shaders/attention_merge.wgsl");
pub const RING_STORE: &str = concat!(include_str!("shaders/ring_store.wgsl"), include_str!("shaders/seq.wgsl"));
pub const INDEXER_SCORES: &str = concat!(include_str!("shaders/indexer_scores.wgsl"), include_str!("shaders/seq.wgsl"));
pub const TOP_K: &str = concat!(include_str!("shaders/top_k.wgsl"), include_str!("shaders/seq.wgsl"));
pub const SWIGLU: &str = include_str!("shaders/swiglu.wgsl");
pub const STEER: &str = include_str!("shaders/steer.wgsl");
const ARGMAX: &str = include_str!("shaders/argmax.wgsl");

/// Workgroups of the argmax's first phase (each a slice of the row; the second phase merges them).
pub const ARGMAX_BLOCKS: u32 = 128;

/// The greedy-pick module (both phases).
pub fn argmax_source() -> String {
    format!("const BLOCKS: u32 = {ARGMAX_BLOCKS}u;\n{ARGMAX}")
}
const MATVEC_EXPERT_MAIN: &str = include_str!("shaders/matvec_expert_main.wgsl");
const EMBED: &str = include_str!("shaders/embed.wgsl");
const HC_REDUCE: &str = include_str!("shaders/hc_reduce.wgsl");
const HC_STREAMS: &str = include_str!("shaders/hc_streams.wgsl");
const HC_PRE: &str = include_str!("shaders/hc_pre.wgsl");
const HC_HEAD: &str = include_str!("shaders/hc_head.wgsl");
pub const HC_POST: &str = include_str!("shaders/hc_post.wgsl");
pub const ROUTE: &str = include_str!("shaders/route.wgsl");
pub const MOE_SWIGLU: &str = include_str!("shaders/moe_swiglu.wgsl");

const MATVEC_EXPERT_GROUPED_MAIN: &str = include_str!("shaders/matvec_expert_grouped_main.wgsl");
pub const EXPERT_GROUPS: &str = include_str!("shaders/expert_groups.wgsl");

/// The weight types with mat-vec kernels, as enumerated for validation and benchmarks. F32 (the MTP
/// file's HC and router matrices) has kernels too (`MATVEC_F32`), checked on their own
/// (tests/matvec_f32.rs).
pub const MATVEC_TYPES: [GgmlType; 5] = [GgmlType::F16, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q4_K, GgmlType::IQ2_XXS];

/// F32 weights: mat-vec, batched and tiled products (8 values a unit, as F16).
pub const MATVEC_F32: GgmlType = GgmlType::F32;

/// Token tile of the batched product (tokens per workgroup; weights are dequantized once per tile).
pub const BATCH_TILE: u32 = 4;

/// Threads of every mat-vec / batched product workgroup.
pub const MATVEC_THREADS: u32 = 256;

/// A module's shape constants: WG threads, SEG threads a row, R rows a thread, TB tokens.
fn shape_consts(shape: MatVecShape, tb: u32) -> String {
    format!("const WG: u32 = {MATVEC_THREADS}u;\nconst SEG: u32 = {}u;\nconst R: u32 = {}u;\nconst TB: u32 = {tb}u;\n", shape.seg, shape.rows_per_thread)
}

/// How a mat-vec / batched product spreads a matrix over a workgroup: `seg` threads sum a row (each
/// taking every seg-th unit of it; this fixes the order a row sums in), each of them for
/// `rows_per_thread` rows (sharing the activations it loads). Chosen from the matrix shape alone,
/// never from the token count, so a row sums in the same order in decode and in short steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MatVecShape {
    pub seg: u32,
    pub rows_per_thread: u32,
}

impl MatVecShape {
    /// Rows a workgroup takes.
    pub fn rows(&self) -> u32 {
        MATVEC_THREADS / self.seg * self.rows_per_thread
    }

    /// The shape of the batched modules (TB tokens a thread too): at most `MAX_BATCH_ROWS_PER_THREAD`
    /// rows a thread. The same segment, so the same sums.
    pub fn batched(self) -> Self {
        Self { rows_per_thread: self.rows_per_thread.min(MAX_BATCH_ROWS_PER_THREAD), ..self }
    }
}

/// Rows a thread of a batched module takes at most (R x TB partial sums a thread).
pub const MAX_BATCH_ROWS_PER_THREAD: u32 = 2;

/// Threads a row may take.
pub const MATVEC_SEGS: [u32; 6] = [8, 16, 32, 64, 128, 256];
/// Rows a thread may take.
pub const MATVEC_ROWS_PER_THREAD: [u32; 4] = [1, 2, 4, 8];

/// Every product shape (`MATVEC_SEGS` x `MATVEC_ROWS_PER_THREAD`; the batched modules take the
/// `batched()` ones).
pub fn matvec_shapes() -> Vec<MatVecShape> {
    MATVEC_SEGS.iter().flat_map(|&seg| MATVEC_ROWS_PER_THREAD.iter().map(move |&rows_per_thread| MatVecShape { seg, rows_per_thread })).collect()
}

/// Values a thread dots at once (`UNIT` of the type's `dotu`).
pub fn matvec_unit(ty: GgmlType) -> usize {
    if matches!(ty, GgmlType::F16 | GgmlType::F32) {
        8
    } else {
        32
    }
}

/// The shape of a product of `rows` x `cols` (`rows`: every row the dispatch covers, e.g. the rows of
/// all of a step's expert slots), from a sweep of every shape on an H100 (`kernel_bench --sweep`):
/// a thread takes as many rows as leave at least `MATVEC_MIN_WORKGROUPS` workgroups (each activation
/// load then serves all its rows: the activations' loads, not the weights', bound these kernels),
/// and two units of a row where rows are plenty even at 8 a thread (one otherwise).
pub fn matvec_shape(ty: GgmlType, rows: usize, cols: usize) -> MatVecShape {
    let units = (cols / matvec_unit(ty)).max(1);
    let seg_for = |per_thread: usize| prev_pow2(units / per_thread).clamp(8, MATVEC_THREADS as usize);
    let workgroups = |seg: usize, r: u32| rows / (MATVEC_THREADS as usize / seg * r as usize);
    let seg = if workgroups(seg_for(2), 8) >= MATVEC_MIN_WORKGROUPS { seg_for(2) } else { seg_for(1) };
    let rows_per_thread = MATVEC_ROWS_PER_THREAD.into_iter().rev().find(|&r| workgroups(seg, r) >= MATVEC_MIN_WORKGROUPS).unwrap_or(1);
    MatVecShape { seg: seg as u32, rows_per_thread }
}

/// Workgroups a product keeps at least when its threads take several rows (two per SM of an H100).
pub const MATVEC_MIN_WORKGROUPS: usize = 256;

fn prev_pow2(n: usize) -> usize {
    if n == 0 {
        1
    } else {
        1 << (usize::BITS - 1 - n.leading_zeros())
    }
}

/// How the attention sums a candidate's score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reduce {
    /// Workgroup-memory tree: every adapter.
    Tree,
    /// `subgroupAdd`: adapters with `SUBGROUP`.
    Subgroup,
}

/// The tiled products' `load8` (8 values of a row) and `load_prelude` of `ty`.
fn load8_source(ty: GgmlType) -> Option<String> {
    Some(match ty {
        GgmlType::F16 => include_str!("shaders/load_f16.wgsl").to_string(),
        GgmlType::F32 => include_str!("shaders/load_f32.wgsl").to_string(),
        GgmlType::Q8_0 => include_str!("shaders/load_q8_0.wgsl").to_string(),
        GgmlType::Q2_K => include_str!("shaders/load_q2_k.wgsl").to_string(),
        GgmlType::Q4_K => format!("{Q4_K_SCALES}{}", include_str!("shaders/load_q4_k.wgsl")),
        GgmlType::IQ2_XXS => format!("{IQ2_GRID}{}", include_str!("shaders/load_iq2_xxs.wgsl")),
        _ => return None,
    })
}

/// The products' `dotu` (a unit of `matvec_unit(ty)` values of a row dotted with activations in
/// registers) and `load_prelude` of `ty`.
fn dot_source(ty: GgmlType) -> Option<String> {
    const XV_CONTIGUOUS: &str = include_str!("shaders/xv_contiguous.wgsl");
    Some(match ty {
        GgmlType::F16 => format!("{}{XV_CONTIGUOUS}", include_str!("shaders/dot_f16.wgsl")),
        GgmlType::F32 => format!("{}{XV_CONTIGUOUS}", include_str!("shaders/dot_f32.wgsl")),
        GgmlType::Q8_0 => format!("{}{XV_CONTIGUOUS}", include_str!("shaders/dot_q8_0.wgsl")),
        // Its unit's activations are not contiguous: the file has its own `xv_at`.
        GgmlType::Q2_K => include_str!("shaders/dot_q2_k.wgsl").to_string(),
        GgmlType::Q4_K => format!("{Q4_K_SCALES}{}{XV_CONTIGUOUS}", include_str!("shaders/dot_q4_k.wgsl")),
        GgmlType::IQ2_XXS => format!("{IQ2_GRID}{}{XV_CONTIGUOUS}", include_str!("shaders/dot_iq2_xxs.wgsl")),
        _ => return None,
    })
}

/// ds4_quant's IQ2_XXS grid as the kernels' table buffer: point i is words 2i (bytes 0..3) and
/// 2i+1 (bytes 4..7).
pub fn iq2xxs_grid_words() -> Vec<u32> {
    IQ2XXS_GRID_CONST.iter().flat_map(|&g| [g as u32, (g >> 32) as u32]).collect()
}

/// Whether the mat-vec module of `ty` binds a table at binding 5.
pub fn needs_table(ty: GgmlType) -> bool {
    ty == GgmlType::IQ2_XXS
}

/// How f16 scales and weights become f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum F16Unpack {
    /// `unpack2x16float` (adapters with wgpu's SHADER_F16_IN_F32 downlevel flag).
    Native,
    /// Integer decode (every adapter).
    Bits,
}

fn unpack_source(f16: F16Unpack) -> &'static str {
    match f16 {
        F16Unpack::Native => F16_NATIVE,
        F16Unpack::Bits => F16_BITS,
    }
}

/// The module of a mat-vec (tb = 1) or batched product (tb = BATCH_TILE) over `ty` weights, or None
/// for a type without a kernel.
pub fn matvec_source(ty: GgmlType, tb: u32, shape: MatVecShape, f16: F16Unpack) -> Option<String> {
    let dot = dot_source(ty)?;
    Some(format!("{}{MATVEC_COMMON}\n{}\n{dot}\n{SEG_REDUCE}\n{MATVEC_MAIN}", shape_consts(shape, tb), unpack_source(f16)))
}

/// The activation quantizer to Q8_0 (`k_blocks` false) or Q8_K blocks (the CPU's Fast-path rows).
pub fn quantize_source(k_blocks: bool) -> String {
    format!("{QUANTIZE_COMMON}\n{}", if k_blocks { QUANTIZE_Q8_K } else { QUANTIZE_Q8_0 })
}

/// The mat-vec's shared part with its activations read as packed signed bytes (`x`: vec4<u32>).
fn matvec_common_i8() -> String {
    MATVEC_COMMON.replace("var<storage, read> x: array<vec4<f32>>;", "var<storage, read> x: array<vec4<u32>>;")
}

/// The one-token Q8_0 mat-vec against Q8_0 activations (`dot4I8Packed`; matvec_i8_main.wgsl).
pub fn matvec_i8_source(shape: MatVecShape, f16: F16Unpack) -> String {
    format!("{}{}\n{}\n{SEG_REDUCE}\n{MATVEC_I8_MAIN}", shape_consts(shape, 1), matvec_common_i8(), unpack_source(f16))
}

/// The per-slot routed-expert product of IQ2_XXS weights against Q8_K activations (matvec_expert_i8_main.wgsl):
/// the mat-vec's shared part with its activations read as packed bytes, the grid table at binding 8.
pub fn expert_i8_source(shape: MatVecShape, f16: F16Unpack) -> String {
    let grid = IQ2_GRID.replace("@binding(5)", "@binding(8)");
    format!("{}{}\n{}\n{grid}\n{SEG_REDUCE}\n{EXPERT_I8_MAIN}", shape_consts(shape, 1), matvec_common_i8(), unpack_source(f16))
}

/// The pipeline-cache key of an `expert_i8_source` module.
pub fn expert_i8_key(shape: MatVecShape, f16: F16Unpack) -> String {
    format!("expert_i8_iq2xxs_s{}_r{}_{f16:?}", shape.seg, shape.rows_per_thread)
}

/// The pipeline-cache key of a `matvec_i8_source` module.
pub fn matvec_i8_key(shape: MatVecShape, f16: F16Unpack) -> String {
    format!("matvec_i8_s{}_r{}_{f16:?}", shape.seg, shape.rows_per_thread)
}

/// Rows and tokens of a tiled product's workgroup (matmul_main.wgsl), and the fewest tokens a step
/// needs to take it instead of the batched mat-vec.
pub const MATMUL_TILE: u32 = 64;
pub const MATMUL_MIN_TOKENS: u32 = 16;
/// Workgroup memory of the tiled product (the weight and input tiles, plus the IQ2_XXS grid).
pub const MATMUL_SHARED_BYTES: u32 = 2 * 8192 + 2048;

/// The tiled product module over `ty` weights (prefill chunks), or None for a type without a loader.
pub fn matmul_source(ty: GgmlType, f16: F16Unpack) -> Option<String> {
    let load = load8_source(ty)?;
    Some(format!("{MATVEC_COMMON}\n{}\n{load}\n{MATMUL_TILE_FNS}\n{MATMUL_MAIN}", unpack_source(f16)))
}

/// Sides of the cooperative matrices the coop tiles are built for (`Caps::coop`).
pub const COOP_SIDES: [u32; 2] = [16, 8];

/// Workgroup memory of the coop tile (f16 weight and input tiles, the f32 output tile, the IQ2_XXS grid).
pub const MATMUL_COOP_SHARED_BYTES: u32 = 2 * 9216 + 16384 + 2048;

/// matmul_coop_tile.wgsl for `n` x `n` matrices: its accumulator code written out for the TPS token
/// tiles each of the 8 subgroups takes (2 at n = 16, 8 at n = 8).
fn coop_tile_fns(n: u32) -> String {
    let tps = (MATMUL_TILE / n) / (8 / (MATMUL_TILE / n));
    let mut decl = String::new();
    let mut mma = String::new();
    let mut store = String::new();
    for j in 0..tps {
        decl += &format!("    var c{j} = coopLoad<coop_matNxN<f32, C>>(&cs[0], BM);\n");
        mma += &format!("            c{j} = coopMultiplyAdd(a, coopLoad<coop_matNxN<f16, B>>(&xh[(tt0 + {j}u) * CN * LS + kk], LS), c{j});\n");
        store += &format!("    coopStore(c{j}, &cs[(tt0 + {j}u) * CN * BM + rt * CN], BM);\n");
    }
    MATMUL_COOP_TILE_FNS
        .replace("//ACC_DECL\n", &decl)
        .replace("//ACC_MMA\n", &mma)
        .replace("//ACC_STORE\n", &store)
        .replace("coop_matNxN", &format!("coop_mat{n}x{n}"))
        .replace("COOP_N", &n.to_string())
}

/// A tiled product's main (matmul_main.wgsl, matmul_expert_main.wgsl) for the coop tile: it also
/// takes its subgroup's index, which picks the subgroup's output tiles. None if the main no longer
/// has the signature and prologue this edits (every subgroup would take subgroup 0's tiles).
fn coop_main(main: &str) -> Option<String> {
    let (sig, prologue) = ("@builtin(local_invocation_index) lid: u32)", "    load_prelude(lid);\n");
    if main.matches(sig).count() != 1 || main.matches(prologue).count() != 1 {
        return None;
    }
    Some(main.replace(sig, "@builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sgid: u32)").replace(prologue, "    load_prelude(lid);\n    sg_id = sgid;\n"))
}

/// The tiled product module on `n` x `n` cooperative matrices (f16 inputs, f32 sums).
pub fn matmul_coop_source(ty: GgmlType, f16: F16Unpack, n: u32) -> Option<String> {
    let load = load8_source(ty)?;
    Some(format!("enable f16;\nenable wgpu_cooperative_matrix;\n{MATVEC_COMMON}\n{}\n{load}\n{}\n{}", unpack_source(f16), coop_tile_fns(n), coop_main(MATMUL_MAIN)?))
}

/// The routed-expert tiled product module on `n` x `n` cooperative matrices.
pub fn expert_coop_source(ty: GgmlType, f16: F16Unpack, n: u32) -> Option<String> {
    let table = format!("@binding({})", expert_table_binding(ExpertWalk::Tiled));
    let load = load8_source(ty)?.replace("@binding(5)", &table);
    Some(format!(
        "enable f16;\nenable wgpu_cooperative_matrix;\n{MATVEC_COMMON}\n{}\n{load}\n{EXPERT_TILES}\n{}\n{}",
        unpack_source(f16),
        coop_tile_fns(n),
        coop_main(MATMUL_EXPERT_MAIN)?
    ))
}

/// The pipeline-cache keys of the coop tiled products.
pub fn matmul_coop_key(ty: GgmlType, f16: F16Unpack, n: u32) -> String {
    format!("matmul_coop{n}_{}_{f16:?}", ty.name())
}
pub fn expert_coop_key(ty: GgmlType, f16: F16Unpack, n: u32) -> String {
    format!("expert_coop{n}_{}_{f16:?}", ty.name())
}

/// The pipeline-cache key of a tiled product module.
pub fn matmul_key(ty: GgmlType, f16: F16Unpack) -> String {
    format!("matmul_{}_{f16:?}", ty.name())
}

/// How the routed-expert product walks the step's (token, slot) pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExpertWalk {
    /// One workgroup per (row, slot) (decode).
    PerSlot,
    /// One workgroup per (row, tile of up to BATCH_TILE slots of one expert) (short multi-token steps:
    /// their rows equal the per-slot rows bit for bit).
    Grouped,
    /// One workgroup per (64 rows, tile of up to 64 slots of one expert), a tiled product (prefill).
    Tiled,
}

/// Binding of the IQ2_XXS grid table in the routed-expert modules (the expert uniform and the ids,
/// or the tiles and the order, come before it).
pub fn expert_table_binding(walk: ExpertWalk) -> u32 {
    match walk {
        ExpertWalk::PerSlot => 7,
        ExpertWalk::Grouped | ExpertWalk::Tiled => 8,
    }
}

/// The module of the routed-expert product over stacked `ty` expert tensors (expert ids from the
/// router's output); `shape` from `expert_shape` (PerSlot and Grouped must share it).
pub fn expert_matvec_source(ty: GgmlType, walk: ExpertWalk, shape: MatVecShape, f16: F16Unpack) -> Option<String> {
    let table = format!("@binding({})", expert_table_binding(walk));
    let unpack = unpack_source(f16);
    if walk == ExpertWalk::Tiled {
        let load = load8_source(ty)?.replace("@binding(5)", &table);
        return Some(format!("{MATVEC_COMMON}\n{unpack}\n{load}\n{EXPERT_TILES}\n{MATMUL_TILE_FNS}\n{MATMUL_EXPERT_MAIN}"));
    }
    let dot = dot_source(ty)?.replace("@binding(5)", &table);
    let (main, tb) = match walk {
        ExpertWalk::PerSlot => (MATVEC_EXPERT_MAIN.to_string(), 1),
        _ => (format!("{EXPERT_TILES}\n{MATVEC_EXPERT_GROUPED_MAIN}"), BATCH_TILE),
    };
    Some(format!("{}{MATVEC_COMMON}\n{unpack}\n{dot}\n{SEG_REDUCE}\n{main}", shape_consts(shape, tb)))
}

/// The shape of the per-slot and grouped expert products over experts of `r_exp` x `cols` with `k`
/// slots a token (both walks sum a row alike).
pub fn expert_shape(ty: GgmlType, r_exp: usize, cols: usize, k: usize) -> MatVecShape {
    matvec_shape(ty, r_exp * k, cols)
}

/// The pipeline-cache key of a routed-expert module.
pub fn expert_matvec_key(ty: GgmlType, walk: ExpertWalk, shape: MatVecShape, f16: F16Unpack) -> String {
    if walk == ExpertWalk::Tiled {
        // No reduction: one module whatever the shape.
        return format!("expert_matvec_{}_{walk:?}_{f16:?}", ty.name());
    }
    format!("expert_matvec_{}_{walk:?}_s{}_r{}_{f16:?}", ty.name(), shape.seg, shape.rows_per_thread)
}

/// The embedding module (f16 by the exact integer decode: one row per token, speed is no concern).
pub fn embed_source() -> String {
    format!("{F16_BITS}\n{EMBED}")
}

/// The hyper-connection entry module for `n_hc` streams of `n_embd` (its loops and register arrays are
/// sized by the shape).
pub fn hc_pre_source(n_hc: u32, n_embd: u32) -> String {
    format!("{}\n{HC_REDUCE}\n{HC_STREAMS}\n{HC_PRE}", hc_shape(n_hc, n_embd))
}

/// The output-head collapse module for `n_hc` streams of `n_embd` (sized as the entry's).
pub fn hc_head_source(n_hc: u32, n_embd: u32) -> String {
    format!("{}\n{HC_REDUCE}\n{HC_STREAMS}\n{HC_HEAD}", hc_shape(n_hc, n_embd))
}

/// The shape constants of the HC modules: N streams of E, C = ceil(E / 256) columns a thread.
fn hc_shape(n_hc: u32, n_embd: u32) -> String {
    format!("const N: u32 = {n_hc}u;\nconst E: u32 = {n_embd}u;\nconst C: u32 = {}u;", n_embd.div_ceil(256))
}

/// The pipeline-cache key of a mat-vec module.
pub fn matvec_key(ty: GgmlType, tb: u32, shape: MatVecShape, f16: F16Unpack) -> String {
    format!("matvec_{}_tb{tb}_s{}_r{}_{f16:?}", ty.name(), shape.seg, shape.rows_per_thread)
}

/// The candidate tiles of the attention modules (steps that split, and prefill).
pub const ATTENTION_TILES: [u32; 2] = [16, 64];

/// Heads a workgroup of the attention modules serves (each read of a candidate row is shared by
/// them). With 8-head prefill workgroups, prefill attention took 1.44x its 4-head time on an H200
/// through Vulkan (bench/results/wgpu/README.md, 2026-12-07), so every step takes 4.
pub const ATTENTION_HEADS: u32 = 4;

/// The attention module (tiles of `tile` <= 64 candidates, `heads` heads a workgroup): tile scores by
/// one thread per candidate (`Tree`, every adapter) or one subgroup per candidate (`Subgroup`).
pub fn attention_source(reduce: Reduce, tile: u32, heads: u32) -> String {
    let (score, params, init) = match reduce {
        Reduce::Tree => (ATTENTION_SCORE_THREAD, "", ""),
        Reduce::Subgroup => (
            ATTENTION_SCORE_SUBGROUP,
            ", @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32, @builtin(subgroup_id) sg_id: u32, @builtin(num_subgroups) n_sg: u32",
            "sg = vec4<u32>(lane, sg_size, sg_id, n_sg);",
        ),
    };
    format!("const TILE: u32 = {tile}u;\nconst HG: u32 = {heads}u;\n{}\n{score}", ATTENTION.replace("SG_PARAMS", params).replace("SG_INIT", init))
}

/// One WGSL module the crate builds, with what it needs from the adapter.
#[derive(Debug, Clone)]
pub struct ModuleSource {
    pub name: String,
    pub wgsl: String,
    /// Uses subgroup builtins (SUBGROUP feature).
    pub subgroup: bool,
    /// Uses unpack2x16float (SHADER_F16_IN_F32 downlevel flag).
    pub f16_in_f32: bool,
    /// Uses cooperative matrices with f16 (EXPERIMENTAL_COOPERATIVE_MATRIX, SHADER_F16, SUBGROUP).
    pub coop: bool,
}

/// Every module the crate can build (for the naga validation / translation test).
pub fn all_modules() -> Vec<ModuleSource> {
    let mut out = Vec::new();
    for ty in MATVEC_TYPES {
        for tb in [1, BATCH_TILE] {
            for shape in matvec_shapes().into_iter().filter(|s| tb == 1 || *s == s.batched()) {
                for f16 in [F16Unpack::Native, F16Unpack::Bits] {
                    if let Some(wgsl) = matvec_source(ty, tb, shape, f16) {
                        out.push(ModuleSource { name: matvec_key(ty, tb, shape, f16), wgsl, subgroup: false, f16_in_f32: f16 == F16Unpack::Native, coop: false });
                    }
                }
            }
        }
    }
    for ty in MATVEC_TYPES {
        for f16 in [F16Unpack::Native, F16Unpack::Bits] {
            if let Some(wgsl) = matmul_source(ty, f16) {
                out.push(ModuleSource { name: matmul_key(ty, f16), wgsl, subgroup: false, f16_in_f32: f16 == F16Unpack::Native, coop: false });
            }
            let any = matvec_shapes()[0];
            if let Some(wgsl) = expert_matvec_source(ty, ExpertWalk::Tiled, any, f16) {
                out.push(ModuleSource { name: expert_matvec_key(ty, ExpertWalk::Tiled, any, f16), wgsl, subgroup: false, f16_in_f32: f16 == F16Unpack::Native, coop: false });
            }
        }
    }
    for ty in MATVEC_TYPES {
        for f16 in [F16Unpack::Native, F16Unpack::Bits] {
            for n in COOP_SIDES {
                let f16_in_f32 = f16 == F16Unpack::Native;
                if let Some(wgsl) = matmul_coop_source(ty, f16, n) {
                    out.push(ModuleSource { name: matmul_coop_key(ty, f16, n), wgsl, subgroup: true, f16_in_f32, coop: true });
                }
                if let Some(wgsl) = expert_coop_source(ty, f16, n) {
                    out.push(ModuleSource { name: expert_coop_key(ty, f16, n), wgsl, subgroup: true, f16_in_f32, coop: true });
                }
            }
        }
    }
    for reduce in [Reduce::Tree, Reduce::Subgroup] {
        for (tile, heads) in ATTENTION_TILES.map(|t| (t, ATTENTION_HEADS)) {
            let wgsl = attention_source(reduce, tile, heads);
            out.push(ModuleSource { name: format!("attention_{reduce:?}_t{tile}_h{heads}"), wgsl, subgroup: reduce == Reduce::Subgroup, f16_in_f32: false, coop: false });
        }
    }
    for ty in MATVEC_TYPES {
        for walk in [ExpertWalk::PerSlot, ExpertWalk::Grouped] {
            for shape in matvec_shapes().into_iter().filter(|s| walk == ExpertWalk::PerSlot || *s == s.batched()) {
                for f16 in [F16Unpack::Native, F16Unpack::Bits] {
                    if let Some(wgsl) = expert_matvec_source(ty, walk, shape, f16) {
                        out.push(ModuleSource { name: expert_matvec_key(ty, walk, shape, f16), wgsl, subgroup: false, f16_in_f32: f16 == F16Unpack::Native, coop: false });
                    }
                }
            }
        }
    }
    let plain = [
        ("rms_norm", RMS_NORM.to_string()),
        ("rope", ROPE.to_string()),
        ("swiglu", SWIGLU.to_string()),
        ("steer", STEER.to_string()),
        ("argmax", argmax_source()),
        ("embed", embed_source()),
        ("hc_pre", hc_pre_source(4, 4096)),
        ("hc_head", hc_head_source(4, 4096)),
        ("quantize_q8_0", quantize_source(false)),
        ("quantize_q8_k", quantize_source(true)),
        ("expert_i8", expert_i8_source(MatVecShape { seg: 64, rows_per_thread: 1 }, F16Unpack::Bits)),
        ("matvec_i8", matvec_i8_source(MatVecShape { seg: 32, rows_per_thread: 4 }, F16Unpack::Bits)),
        ("hc_post", HC_POST.to_string()),
        ("route", ROUTE.to_string()),
        ("moe_swiglu", MOE_SWIGLU.to_string()),
        ("expert_groups", EXPERT_GROUPS.to_string()),
        ("kv_row", KV_ROW.to_string()),
        ("compressor_pool", COMPRESSOR_POOL.to_string()),
        ("compressor_state", COMPRESSOR_STATE.to_string()),
        ("attention_merge", ATTENTION_MERGE.to_string()),
        ("ring_store", RING_STORE.to_string()),
        ("indexer_scores", INDEXER_SCORES.to_string()),
        ("top_k", TOP_K.to_string()),
    ];
    for (name, wgsl) in plain {
        out.push(ModuleSource { name: name.to_string(), wgsl, subgroup: false, f16_in_f32: false, coop: false });
    }
    out
}
