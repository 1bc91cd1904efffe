// Groups the step's (token, slot) pairs by expert for the prefill products (one workgroup): counts
// per expert, offsets, then `order` lists the slots expert by expert and `tiles` the tiles of up to
// TB slots of one expert: tiles[0] = the number of tiles, tile i = (expert, first position in
// `order`, slots) at words 1 + 3i. The order of slots inside an expert depends on atomics; the
// products do not (each slot's dot product is summed alone).
struct Params { k: u32, n_expert: u32, tb: u32, pad: u32 }
struct Step { ntok: u32, pos: u32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<storage, read> ids: array<u32>;
@group(0) @binding(1) var<storage, read_write> order: array<u32>;
@group(0) @binding(2) var<storage, read_write> tiles: array<u32>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<uniform> step: Step;

const WG: u32 = 256u;
var<workgroup> cnt: array<atomic<u32>, 1024>;
var<workgroup> off: array<u32, 1025>;
var<workgroup> toff: array<u32, 1024>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
    let ne = p.n_expert;
    let total = step.ntok * p.k;
    for (var e = lid; e < ne; e += WG) { atomicStore(&cnt[e], 0u); }
    workgroupBarrier();
    for (var s = lid; s < total; s += WG) { atomicAdd(&cnt[min(ids[s], ne - 1u)], 1u); }
    workgroupBarrier();
    if (lid == 0u) {
        var acc = 0u;
        var tacc = 0u;
        for (var e = 0u; e < ne; e++) {
            let c = atomicLoad(&cnt[e]);
            off[e] = acc;
            toff[e] = tacc;
            acc += c;
            tacc += (c + p.tb - 1u) / p.tb;
            atomicStore(&cnt[e], 0u);
        }
        off[ne] = acc;
        tiles[0] = tacc;
    }
    workgroupBarrier();
    for (var e = lid; e < ne; e += WG) {
        let c = off[e + 1u] - off[e];
        for (var j = 0u; j * p.tb < c; j++) {
            let ti = 1u + 3u * (toff[e] + j);
            tiles[ti] = e;
            tiles[ti + 1u] = off[e] + j * p.tb;
            tiles[ti + 2u] = min(p.tb, c - j * p.tb);
        }
    }
    for (var s = lid; s < total; s += WG) {
        let e = min(ids[s], ne - 1u);
        order[off[e] + atomicAdd(&cnt[e], 1u)] = s;
    }
}
