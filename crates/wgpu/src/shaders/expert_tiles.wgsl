// The bindings of the routed-expert products over expert groups (expert_groups.wgsl): the expert
// uniform, the tiles (count, then (expert, first position in `order`, slots) per tile) and the order
// of the slots expert by expert.
struct Expert {
    k: u32,
    x_div: u32,
    r_exp: u32,
    pad: u32,
}
@group(0) @binding(5) var<uniform> ex: Expert;
@group(0) @binding(6) var<storage, read> tiles: array<u32>;
@group(0) @binding(7) var<storage, read> order: array<u32>;
