//! One 4096-column weight row dotted `reps` times by one kernel table: run under an instruction
//! counter (bench/cpu/neon_icount.sh runs it under qemu's instruction trace, once with 0 and once
//! with 8 reps) to compare the kernels' executed instructions per row on an architecture this
//! machine cannot time, such as the NEON table on an x86-64 host.
//!
//!   kernel_icount TYPE ISA REPS    (TYPE: q8_0 q2_k q4_k iq2_xxs f16; ISA: scalar avx2 avx512 neon)
use ds4_quant::{quantize_row_q8_0, quantize_row_q8_k, random_valid_blocks, GgmlType, Isa, Kernels};

fn usage() -> ! {
    eprintln!("usage: kernel_icount q8_0|q2_k|q4_k|iq2_xxs|f16 scalar|avx2|avx512|neon REPS");
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        usage();
    }
    let ty = match args[1].as_str() {
        "q8_0" => GgmlType::Q8_0,
        "q2_k" => GgmlType::Q2_K,
        "q4_k" => GgmlType::Q4_K,
        "iq2_xxs" => GgmlType::IQ2_XXS,
        "f16" => GgmlType::F16,
        _ => usage(),
    };
    let isa = match args[2].as_str() {
        "scalar" => Isa::Scalar,
        "avx2" => Isa::Avx2,
        "avx512" => Isa::Avx512,
        "neon" => Isa::Neon,
        _ => usage(),
    };
    let reps: usize = args[3].parse().unwrap_or_else(|_| usage());
    let Some(k) = Kernels::for_isa(isa) else {
        eprintln!("{isa:?} kernels are not available on this CPU");
        std::process::exit(1);
    };
    let cols = 4096;
    let w = random_valid_blocks(ty, 5, cols / ty.block_elems());
    let x: Vec<f32> = (0..cols).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let act_ty = if ty == GgmlType::Q8_0 { GgmlType::Q8_0 } else { GgmlType::Q8_K };
    let mut q = vec![0u8; act_ty.row_bytes(cols).expect("row bytes")];
    if ty == GgmlType::Q8_0 {
        quantize_row_q8_0(&x, &mut q)
    } else {
        quantize_row_q8_k(&x, &mut q)
    }
    let mut s = 0f32;
    for _ in 0..reps {
        s += match ty {
            GgmlType::Q8_0 => (k.q8_0)(&w, &q),
            GgmlType::Q2_K => (k.q2_k)(&w, &q),
            GgmlType::Q4_K => (k.q4_k)(&w, &q),
            GgmlType::IQ2_XXS => (k.iq2_xxs)(&w, &q),
            _ => (k.f16)(&w, &x),
        };
        std::hint::black_box(&w);
    }
    println!("{s}");
}
